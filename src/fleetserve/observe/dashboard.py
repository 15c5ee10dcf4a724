"""The Grafana dashboard of a fleetserve deployment (pure: selector -> dashboard JSON model).

Design: three rows that follow a request - the front door (Ray Serve proxy: requests/s by
status, 5xx ratio, HTTP latency), the engines (vLLM: TTFT and inter-token latency
quantiles, tokens/s, running/waiting requests, KV cache usage, preemptions) and capacity
(healthy vs target replicas per deployment). Every query names metrics only through
:mod:`fleetserve.observe.metrics`; a ``$model`` variable filters the engine panels and a
``$datasource`` variable lets the same JSON work with any Prometheus datasource.

What must stay true: the model is deterministic (no timestamps, stable ids and ordering), so
the rendered ConfigMap diffs cleanly in GitOps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetserve.observe import metrics as m
from fleetserve.observe.promql import STATUS_5XX, series

_DS = {"type": "prometheus", "uid": "${datasource}"}
_MODEL = 'model_name=~"$model"'


def _panel(  # noqa: PLR0917 - one positional per panel attribute keeps the table readable
    pid: int,
    title: str,
    targets: list[tuple[str, str]],
    grid: tuple[int, int, int, int],
    unit: str,
    description: str,
) -> dict[str, Any]:
    x, y, w, h = grid
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": _DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": _DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def dashboard_queries(selector: Mapping[str, str] | None = None) -> list[str]:
    """Every PromQL expression of the dashboard (for validation)."""
    return [t["expr"] for p in grafana_dashboard(selector)["panels"] for t in p.get("targets", [])]


def grafana_dashboard(
    selector: Mapping[str, str] | None = None,
    uid: str = "fleetserve",
    title: str = "fleetserve",
) -> dict[str, Any]:
    """The dashboard JSON model (Grafana schema 39), queries scoped by ``selector``."""

    def s(metric: str, *extra: str) -> str:
        return series(metric, selector, *extra)

    http = m.SERVE_HTTP_REQUESTS.name
    q = "sum by (le, model_name) (rate({}[5m]))"
    panels: list[dict[str, Any]] = [
        _row(1, "Front door (Ray Serve)", 0),
        _panel(
            2,
            "Requests/s by application and status",
            [
                (
                    f"sum by (application, status_code) (rate({s(http)}[5m]))",
                    "{{application}} {{status_code}}",
                )
            ],
            (0, 1, 8, 8),
            "reqps",
            "HTTP requests handled by the Serve proxies.",
        ),
        _panel(
            3,
            "5xx ratio",
            [
                (
                    f"sum by (application) (rate({s(http, STATUS_5XX)}[5m])) / "
                    f"sum by (application) (rate({s(http)}[5m]))",
                    "{{application}}",
                )
            ],
            (8, 1, 8, 8),
            "percentunit",
            "503: replicas full (max_ongoing_requests) or absent; 500: engine errors.",
        ),
        _panel(
            4,
            "HTTP latency p50/p95 (proxy)",
            [
                (
                    f"histogram_quantile({quant}, sum by (le, application) "
                    f"(rate({s(m.SERVE_HTTP_LATENCY.bucket)}[5m])))",
                    f"p{int(quant * 100)} {{{{application}}}}",
                )
                for quant in (0.5, 0.95)
            ],
            (16, 1, 8, 8),
            "ms",
            "End-to-end latency measured at the Serve proxy.",
        ),
        _row(5, "Engines (vLLM)", 9),
        _panel(
            6,
            "Time to first token p50/p95",
            [
                (
                    f"histogram_quantile({quant}, " + q.format(s(m.VLLM_TTFT.bucket, _MODEL)) + ")",
                    f"p{int(quant * 100)} {{{{model_name}}}}",
                )
                for quant in (0.5, 0.95)
            ],
            (0, 10, 8, 8),
            "s",
            "Prefill latency: grows when requests queue for KV cache or batch slots.",
        ),
        _panel(
            7,
            "Inter-token latency p50/p95",
            [
                (
                    f"histogram_quantile({quant}, " + q.format(s(m.VLLM_ITL.bucket, _MODEL)) + ")",
                    f"p{int(quant * 100)} {{{{model_name}}}}",
                )
                for quant in (0.5, 0.95)
            ],
            (8, 10, 8, 8),
            "s",
            "Decode speed per sequence: grows with batch size and GPU core share.",
        ),
        _panel(
            8,
            "Tokens/s",
            [
                (
                    f"sum by (model_name) (rate({s(m.VLLM_PROMPT_TOKENS.name, _MODEL)}[5m]))",
                    "prompt {{model_name}}",
                ),
                (
                    f"sum by (model_name) (rate({s(m.VLLM_GENERATION_TOKENS.name, _MODEL)}[5m]))",
                    "generation {{model_name}}",
                ),
            ],
            (16, 10, 8, 8),
            "short",
            "Prefill and decode throughput.",
        ),
        _panel(
            9,
            "Running and waiting requests",
            [
                (
                    f"sum by (model_name) ({s(m.VLLM_REQUESTS_RUNNING.name, _MODEL)})",
                    "running {{model_name}}",
                ),
                (
                    f"sum by (model_name) ({s(m.VLLM_REQUESTS_WAITING.name, _MODEL)})",
                    "waiting {{model_name}}",
                ),
            ],
            (0, 18, 8, 8),
            "short",
            "Waiting > 0 for long: engines saturated (max_num_seqs or KV cache).",
        ),
        _panel(
            10,
            "KV cache usage (max over replicas)",
            [
                (
                    f"max by (model_name) ({s(m.VLLM_KV_CACHE_USAGE.name, _MODEL)})",
                    "{{model_name}}",
                )
            ],
            (8, 18, 8, 8),
            "percentunit",
            "Near 100%: preemptions and queueing follow.",
        ),
        _panel(
            11,
            "Preemptions/s",
            [
                (
                    f"sum by (model_name) (rate({s(m.VLLM_PREEMPTIONS.name, _MODEL)}[5m]))",
                    "{{model_name}}",
                )
            ],
            (16, 18, 8, 8),
            "short",
            "Sequences evicted from the KV cache and recomputed.",
        ),
        _row(12, "Capacity (Serve autoscaling)", 26),
        _panel(
            13,
            "Healthy vs target replicas",
            [
                (
                    f"sum by (application, deployment) ({s(m.SERVE_REPLICA_HEALTHY.name)})",
                    "healthy {{deployment}}",
                ),
                (
                    f"max by (application, deployment) ({s(m.SERVE_TARGET_REPLICAS.name)})",
                    "target {{deployment}}",
                ),
            ],
            (0, 27, 12, 8),
            "short",
            "Target above healthy for long: worker pods Pending or replicas crashing.",
        ),
        _panel(
            14,
            "Queued requests in handles",
            [
                (
                    f"sum by (application, deployment) ({s(m.SERVE_QUEUED_QUERIES.name)})",
                    "{{deployment}}",
                )
            ],
            (12, 27, 12, 8),
            "short",
            "Requests waiting for a replica slot (max_ongoing_requests reached).",
        ),
    ]
    model_query = f"label_values({s(m.VLLM_KV_CACHE_USAGE.name)}, model_name)"
    return {
        "uid": uid,
        "title": title,
        "tags": ["fleetserve", "ray-serve", "vllm"],
        "timezone": "browser",
        "schemaVersion": 39,
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
                    "hide": 0,
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": _DS,
                    "query": {"query": model_query, "refId": "model"},
                    "definition": model_query,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {},
                    "refresh": 2,
                    "sort": 1,
                    "hide": 0,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }
