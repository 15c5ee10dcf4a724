"""The Grafana dashboard of a fleetserve deployment (pure: selector -> dashboard JSON model).

Design: rows that follow a request - the front door (fleetserve's gateway: requests/s by
status, 5xx ratio, latency and TTFT as clients see them; with direct ingress Serve's proxy
no longer sees requests), tenants (requests, tokens and rejections per tenant), the engines
(vLLM: TTFT and inter-token latency quantiles, tokens/s, running/waiting requests, KV cache
usage, preemptions), GPU slices (HAMi's per-container memory and cores joined with the
engine of the same pod: is each slice the right size?) and capacity (healthy vs target
replicas, queues). Every query names metrics only through :mod:`fleetserve.observe.metrics`;
``$model`` and ``$tenant`` variables filter the panels and a ``$datasource`` variable lets
the same JSON work with any Prometheus datasource.

The slice join: HAMi's vGPU monitor labels its series with the engine pod's ``namespace``
and ``pod`` (its ServiceMonitor keeps them: ``honorLabels``), and the PodMonitor that scrapes
the Ray worker pods adds the same two target labels to vLLM's series (one Serve replica per
worker pod), so ``on (namespace, pod)`` matches a slice with its engine and ``group_left
(model_name)`` names the model.

Every panel says where its data can come from (:class:`Needs`): ``fleet`` panels have data
on any fleet, a local ``fleetserve serve --engine fake`` included; ``vllm`` panels need real
engines; ``kubernetes-hami`` panels need HAMi slices on Kubernetes. The live test
(``tests/integration/test_observe_live.py``) holds each panel to that.

What must stay true: the model is deterministic (no timestamps, stable ids and ordering), so
the rendered ConfigMap diffs cleanly in GitOps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetserve.observe import metrics as m
from fleetserve.observe.promql import STATUS_5XX, series

#: Grafana's dashboard JSON schema version this model follows.
SCHEMA_VERSION = 39
_DS = {"type": "prometheus", "uid": "${datasource}"}
_MODEL_NAME = 'model_name=~"$model"'
_MODEL = 'model=~"$model"'
_TENANT = 'tenant=~"$tenant"'
#: The container of the Ray worker pods (HAMi labels slices by container).
ENGINE_CONTAINER = "ray-worker"

Needs = Literal["fleet", "vllm", "kubernetes-hami"]
#: Why a panel may have no data on a local fleet, by what it needs.
NEEDS_REASON: dict[Needs, str] = {
    "fleet": "",
    "vllm": "reads vLLM's engine metrics: a fleet on the fake engine records none",
    "kubernetes-hami": "reads HAMi's vGPU monitor joined on Kubernetes pod labels: only on a "
    "Kubernetes cluster with HAMi slices (no GPU slices on a local fleet)",
}


@dataclass(frozen=True)
class Target:
    """One query of a panel."""

    expr: str
    legend: str
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    """A panel as fleetserve defines it (turned into Grafana JSON by :func:`grafana_dashboard`)."""

    title: str
    targets: tuple[Target, ...]
    grid: tuple[int, int, int, int]
    unit: str
    description: str
    needs: Needs = "fleet"
    kind: Literal["timeseries", "table"] = "timeseries"
    transformations: tuple[dict[str, Any], ...] = field(default=())


@dataclass(frozen=True)
class Row:
    title: str
    y: int


def _q(quant: float) -> str:
    return f"p{round(quant * 100)}"


def _slices(s: Any) -> dict[str, str]:
    """The HAMi-join building blocks (per engine pod: namespace, pod)."""
    ctr = f'container="{ENGINE_CONTAINER}"'
    limit = f"sum by (namespace, pod) ({s(m.HAMI_VGPU_MEMORY_LIMIT.name, ctr)})"
    used = f"sum by (namespace, pod) ({s(m.HAMI_VGPU_MEMORY_USED.name, ctr)})"
    cores = f"max by (namespace, pod) ({s(m.HAMI_CONTAINER_CORE_UTILIZATION.name, ctr)})"
    kv = f"max by (namespace, pod, model_name) ({s(m.VLLM_KV_CACHE_USAGE.name, _MODEL_NAME)})"
    model_of = engine_pod_models(s, _MODEL_NAME)
    return {"limit": limit, "used": used, "cores": cores, "kv": kv, "model_of": model_of}


def engine_pod_models(s: Any, *extra: str) -> str:
    """1 per engine pod, labelled (namespace, pod, model_name): the slice join's right side.

    The KV-cache gauge names every engine that has taken a step (kept exported while idle:
    engine/ray_stats.py); the generation-token counter stands in where a scrape lacks it
    (e.g. a Prometheus that scraped the engine before the gauge keeper existed).
    """
    series_ = (
        f"{s(m.VLLM_KV_CACHE_USAGE.name, *extra)} or {s(m.VLLM_GENERATION_TOKENS.name, *extra)}"
    )
    return f"group by (namespace, pod, model_name) ({series_})"


def with_model(expr: str, model_of: str) -> str:
    """``expr`` (by namespace, pod) labelled with the model its pod serves."""
    return f"({expr}) * on (namespace, pod) group_left (model_name) {model_of}"


def dashboard_layout(selector: Mapping[str, str] | None = None) -> list[Row | Panel]:
    """Rows and panels, top to bottom (pure)."""

    def s(metric: str, *extra: str) -> str:
        return series(metric, selector, *extra)

    gw = m.GATEWAY_REQUESTS.name
    gw_all = s(gw, _MODEL, _TENANT)
    gw_5xx = s(gw, _MODEL, _TENANT, STATUS_5XX)
    q = "sum by (le, model_name) (rate({}[5m]))"
    sl = _slices(s)
    processing = s(m.SERVE_REPLICA_PROCESSING.name, 'deployment!="ingress"')
    gen_pod = (
        f"sum by (namespace, pod, model_name) "
        f"(rate({s(m.VLLM_GENERATION_TOKENS.name, _MODEL_NAME)}[5m]))"
    )
    return [
        Row("Front door (fleetserve gateway)", 0),
        Panel(
            "Requests/s by model and status",
            (
                Target(
                    f"sum by (model, status_code) (rate({gw_all}[5m]))", "{{model}} {{status_code}}"
                ),
            ),
            (0, 1, 8, 8),
            "reqps",
            "Requests the gateway answered (401/404/503 it refused itself included).",
        ),
        Panel(
            "5xx ratio",
            (
                Target(
                    f"(sum by (model) (rate({gw_5xx}[5m])) or "
                    f"0 * sum by (model) (rate({gw_all}[5m]))) / "
                    f"sum by (model) (rate({gw_all}[5m]))",
                    "{{model}}",
                ),
            ),
            (8, 1, 8, 8),
            "percentunit",
            "503: replicas full (max_ongoing_requests), absent or draining; 500: engine errors.",
        ),
        Panel(
            "Latency and time to first token p50/p95 (gateway)",
            tuple(
                Target(
                    f"histogram_quantile({quant}, sum by (le, model) "
                    f"(rate({s(metric.bucket, _MODEL, _TENANT)}[5m])))",
                    f"{label} {_q(quant)} {{{{model}}}}",
                )
                for metric, label in ((m.GATEWAY_LATENCY, "latency"), (m.GATEWAY_TTFT, "TTFT"))
                for quant in (0.5, 0.95)
            ),
            (16, 1, 8, 8),
            "s",
            "As clients see it: arrival to last byte (whole streams), and to the first "
            "streamed byte (streams only).",
        ),
        Row("Tenants", 9),
        Panel(
            "Requests/s by tenant",
            (Target(f"sum by (tenant) (rate({gw_all}[5m]))", "{{tenant}}"),),
            (0, 10, 8, 8),
            "reqps",
            "'none': auth is off; 'unknown': no valid key.",
        ),
        Panel(
            "Tokens/s by tenant",
            (
                Target(
                    "sum by (tenant) "
                    f"(rate({s(m.GATEWAY_PROMPT_TOKENS.name, _MODEL, _TENANT)}[5m]))",
                    "prompt {{tenant}}",
                ),
                Target(
                    "sum by (tenant) "
                    f"(rate({s(m.GATEWAY_COMPLETION_TOKENS.name, _MODEL, _TENANT)}[5m]))",
                    "completion {{tenant}}",
                ),
            ),
            (8, 10, 8, 8),
            "short",
            "From the responses' usage (streams: only when the client sets "
            "stream_options.include_usage).",
        ),
        Panel(
            "Rejections/s by tenant and reason",
            (
                Target(
                    "sum by (tenant, reason) "
                    f"(rate({s(m.GATEWAY_REJECTIONS.name, _MODEL, _TENANT)}[5m]))",
                    "{{tenant}} {{reason}}",
                ),
            ),
            (16, 10, 8, 8),
            "reqps",
            "Refused before an engine saw them: auth, quota, overload, draining, limit, "
            "unavailable.",
        ),
        Row("Engines (vLLM)", 18),
        Panel(
            "Time to first token p50/p95 (engine)",
            tuple(
                Target(
                    f"histogram_quantile({quant}, "
                    + q.format(s(m.VLLM_TTFT.bucket, _MODEL_NAME))
                    + ")",
                    f"{_q(quant)} {{{{model_name}}}}",
                )
                for quant in (0.5, 0.95)
            ),
            (0, 19, 8, 8),
            "s",
            "Prefill latency: grows when requests queue for KV cache or batch slots.",
            needs="vllm",
        ),
        Panel(
            "Inter-token latency p50/p95",
            tuple(
                Target(
                    f"histogram_quantile({quant}, "
                    + q.format(s(m.VLLM_ITL.bucket, _MODEL_NAME))
                    + ")",
                    f"{_q(quant)} {{{{model_name}}}}",
                )
                for quant in (0.5, 0.95)
            ),
            (8, 19, 8, 8),
            "s",
            "Decode speed per sequence: grows with batch size and GPU core share.",
            needs="vllm",
        ),
        Panel(
            "Tokens/s (engine)",
            (
                Target(
                    f"sum by (model_name) (rate({s(m.VLLM_PROMPT_TOKENS.name, _MODEL_NAME)}[5m]))",
                    "prompt {{model_name}}",
                ),
                Target(
                    "sum by (model_name) "
                    f"(rate({s(m.VLLM_GENERATION_TOKENS.name, _MODEL_NAME)}[5m]))",
                    "generation {{model_name}}",
                ),
            ),
            (16, 19, 8, 8),
            "short",
            "Prefill and decode throughput.",
            needs="vllm",
        ),
        Panel(
            "Running and waiting requests",
            (
                Target(
                    f"sum by (model_name) ({s(m.VLLM_REQUESTS_RUNNING.name, _MODEL_NAME)})",
                    "running {{model_name}}",
                ),
                Target(
                    f"sum by (model_name) ({s(m.VLLM_REQUESTS_WAITING.name, _MODEL_NAME)})",
                    "waiting {{model_name}}",
                ),
            ),
            (0, 27, 8, 8),
            "short",
            "Waiting > 0 for long: engines saturated (max_num_seqs or KV cache).",
            needs="vllm",
        ),
        Panel(
            "KV cache usage (max over replicas)",
            (
                Target(
                    f"max by (model_name) ({s(m.VLLM_KV_CACHE_USAGE.name, _MODEL_NAME)})",
                    "{{model_name}}",
                ),
            ),
            (8, 27, 8, 8),
            "percentunit",
            "Near 100%: preemptions and queueing follow.",
            needs="vllm",
        ),
        Panel(
            "Preemptions/s",
            (
                Target(
                    f"sum by (model_name) (rate({s(m.VLLM_PREEMPTIONS.name, _MODEL_NAME)}[5m]))",
                    "{{model_name}}",
                ),
            ),
            (16, 27, 8, 8),
            "short",
            "Sequences evicted from the KV cache and recomputed.",
            needs="vllm",
        ),
        Row("GPU slices (HAMi) beside their engines", 35),
        Panel(
            "Slice fit per replica",
            (
                Target(with_model(sl["limit"], sl["model_of"]), "slice", instant=True),
                Target(with_model(sl["used"], sl["model_of"]), "used", instant=True),
                Target(
                    with_model(f"{sl['limit']} - {sl['used']}", sl["model_of"]),
                    "unused",
                    instant=True,
                ),
                Target(sl["kv"], "KV cache", instant=True),
            ),
            (0, 36, 12, 8),
            "bytes",
            "Per engine pod: the slice's memory limit (nvidia.com/gpumem), what the engine "
            "uses, the unused rest, and how full its KV cache is. A large unused rest with a "
            "KV cache that stays low: the slice is over-provisioned by about the unused bytes "
            "(lower gpumem in the plan); used near the slice: HAMi refuses the next allocation.",
            needs="kubernetes-hami",
            kind="table",
            transformations=(
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            "Value #A": "slice",
                            "Value #B": "used",
                            "Value #C": "unused",
                            "Value #D": "KV cache",
                        },
                    },
                },
            ),
        ),
        Panel(
            "Slice memory used vs limit",
            (
                Target(with_model(sl["limit"], sl["model_of"]), "slice {{model_name}} {{pod}}"),
                Target(with_model(sl["used"], sl["model_of"]), "used {{model_name}} {{pod}}"),
            ),
            (12, 36, 12, 8),
            "bytes",
            "HAMi's vGPU monitor: memory limit and use of each engine's slice.",
            needs="kubernetes-hami",
        ),
        Panel(
            "Slice cores vs generation tokens/s",
            (
                Target(with_model(sl["cores"], sl["model_of"]), "cores % {{model_name}} {{pod}}"),
                Target(gen_pod, "tokens/s {{model_name}} {{pod}}"),
            ),
            (0, 44, 12, 8),
            "short",
            "SM utilisation of each slice (percent) beside its engine's decode throughput: "
            "cores pinned near the gpucores limit while requests wait means the slice is "
            "too small in cores, not in memory.",
            needs="kubernetes-hami",
        ),
        Panel(
            "KV cache usage per replica",
            (Target(sl["kv"], "{{model_name}} {{pod}}"),),
            (12, 44, 12, 8),
            "percentunit",
            "The engine side of the slice view, per engine pod.",
            needs="kubernetes-hami",
        ),
        Row("Capacity (Serve)", 52),
        Panel(
            "Healthy vs target replicas",
            (
                Target(
                    f"sum by (application, deployment) ({s(m.SERVE_REPLICA_HEALTHY.name)})",
                    "healthy {{deployment}}",
                ),
                Target(
                    f"max by (application, deployment) ({s(m.SERVE_TARGET_REPLICAS.name)})",
                    "target {{deployment}}",
                ),
            ),
            (0, 53, 8, 8),
            "short",
            "Target above healthy for long: worker pods Pending or replicas crashing.",
        ),
        Panel(
            "Requests processing per replica",
            (
                Target(
                    f"sum by (deployment, replica) ({processing})",
                    "{{deployment}} {{replica}}",
                ),
            ),
            (8, 53, 8, 8),
            "short",
            "Each model replica's share of max_ongoing_requests in use.",
        ),
        Panel(
            "Queued requests in handles",
            (
                Target(
                    f"sum by (application, deployment) ({s(m.SERVE_QUEUED_QUERIES.name)})",
                    "{{deployment}}",
                ),
            ),
            (16, 53, 8, 8),
            "short",
            "Requests waiting for a replica slot (max_ongoing_requests reached).",
        ),
    ]


def dashboard_panels(selector: Mapping[str, str] | None = None) -> list[Panel]:
    """The panels alone (no rows)."""
    return [p for p in dashboard_layout(selector) if isinstance(p, Panel)]


def dashboard_queries(selector: Mapping[str, str] | None = None) -> list[str]:
    """Every PromQL expression of the dashboard (for validation)."""
    return [t.expr for p in dashboard_panels(selector) for t in p.targets]


def _panel_json(pid: int, panel: Panel) -> dict[str, Any]:
    x, y, w, h = panel.grid
    description = panel.description
    if panel.needs != "fleet":
        description += f" (Needs {panel.needs}: {NEEDS_REASON[panel.needs]}.)"
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": description,
        "datasource": _DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": (
            {"showHeader": True}
            if panel.kind == "table"
            else {"legend": {"displayMode": "list", "placement": "bottom"}}
        ),
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": _DS,
                "expr": t.expr,
                "legendFormat": t.legend,
                "instant": t.instant,
                "range": not t.instant,
                **({"format": "table"} if panel.kind == "table" else {}),
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    if panel.transformations:
        out["transformations"] = [dict(t) for t in panel.transformations]
    return out


def _row_json(pid: int, row: Row) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": row.title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": row.y, "w": 24, "h": 1},
        "panels": [],
    }


def _query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": _DS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def grafana_dashboard(
    selector: Mapping[str, str] | None = None,
    uid: str = "fleetserve",
    title: str = "fleetserve",
) -> dict[str, Any]:
    """The dashboard JSON model (Grafana schema 39), queries scoped by ``selector``."""
    panels = [
        _row_json(i, item) if isinstance(item, Row) else _panel_json(i, item)
        for i, item in enumerate(dashboard_layout(selector), start=1)
    ]
    requests = series(m.GATEWAY_REQUESTS.name, selector)
    return {
        "uid": uid,
        "title": title,
        "tags": ["fleetserve", "ray-serve", "vllm", "hami"],
        "timezone": "browser",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "options": [],
                    "refresh": 1,
                    "regex": "",
                    "hide": 0,
                },
                _query_variable("model", "Model", f"label_values({requests}, model)"),
                _query_variable("tenant", "Tenant", f"label_values({requests}, tenant)"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }
