"""Prometheus alerting rules for a fleetserve deployment (pure: thresholds -> rule groups).

Design: each alert answers one operator question with one metric family from
:mod:`fleetserve.observe.metrics` - is the first token slow (TTFT p95), is the KV cache full
(vLLM preempts and queues), are requests queueing, is a deployment/application unhealthy or
short of the replicas the Serve autoscaler wants (pods Pending: no GPU, no slice), are users
getting 5xx or refused at the gateway, is a HAMi slice the wrong size for its engine (memory
unused while the KV cache stays low, memory at the slice's limit, cores pinned while requests
wait - joined ``on (namespace, pod)`` as in :mod:`fleetserve.observe.dashboard`). Queries
aggregate away Ray's per-process labels (WorkerId, ReplicaId) and keep
the labels an operator acts on (model_name, application, deployment). A ``selector`` (e.g.
``{namespace: fleetserve}``) scopes every query to one fleet, so two fleets in one Prometheus
do not page for each other.

The output is the Prometheus rule-file format (``{"groups": [...]}``), which is also the
``spec`` of a prometheus-operator ``PrometheusRule``; ``promtool check rules`` and
``promtool test rules`` run on it in tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.observe import metrics as m
from fleetserve.observe.dashboard import ENGINE_CONTAINER, engine_pod_models
from fleetserve.observe.promql import STATUS_5XX, series

Severity = Literal["critical", "warning", "info"]


class AlertThresholds(BaseModel):
    """Where each alert fires. Defaults suit interactive chat traffic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p95_seconds: float = Field(
        default=2.0, gt=0, le=600, description="TTFT p95 above this (s) for `for_long` fires."
    )
    kv_cache_usage: float = Field(
        default=0.95, gt=0, le=1, description="KV cache usage fraction that counts as full."
    )
    requests_waiting: int = Field(
        default=0, ge=0, le=100_000, description="Waiting requests per model above this fire."
    )
    error_ratio_5xx: float = Field(
        default=0.05, gt=0, le=1, description="Fraction of HTTP responses that are 5xx."
    )
    rate_window: str = Field(
        default="5m", pattern=r"^[0-9]+[smh]$", description="rate() window for ratios."
    )
    for_short: str = Field(
        default="5m", pattern=r"^[0-9]+[smh]$", description="'for' of urgent alerts."
    )
    for_long: str = Field(
        default="10m", pattern=r"^[0-9]+[smh]$", description="'for' of saturation alerts."
    )
    for_capacity: str = Field(
        default="15m",
        pattern=r"^[0-9]+[smh]$",
        description="'for' of replicas below target (pods may take minutes to schedule).",
    )
    for_sizing: str = Field(
        default="1h", pattern=r"^[0-9]+[smh]$", description="'for' of slice-sizing hints."
    )
    slice_unused: float = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="Fraction of a slice's memory unused that counts as over-provisioned.",
    )
    slice_kv_low: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="KV cache usage that stays below this over for_sizing counts as low.",
    )
    slice_memory_full: float = Field(
        default=0.97, gt=0, le=1, description="Used/limit of a slice that counts as full."
    )
    slice_cores_busy: float = Field(
        default=90, gt=0, le=100, description="SM utilisation (%) of a slice that counts as busy."
    )


class AlertRule(BaseModel):
    """One alerting rule, as Prometheus reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alert: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Alert name.")
    expr: str = Field(min_length=1, description="PromQL condition.")
    for_: str = Field(alias="for", pattern=r"^[0-9]+[smh]$", description="Pending duration.")
    severity: Severity = Field(description="Routing severity label.")
    summary: str = Field(min_length=1, description="One-line summary (templated).")
    description: str = Field(min_length=1, description="What happens and what to do.")

    def to_rule(self) -> dict[str, Any]:
        """The rule-file mapping (key order is stable for byte-identical output)."""
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


#: Name of the rule group; the golden files and promtool tests refer to it.
GROUP_NAME = "fleetserve.alerts"


def alert_rules(
    selector: Mapping[str, str] | None = None, thresholds: AlertThresholds | None = None
) -> list[AlertRule]:
    """Every fleetserve alert, its queries scoped by ``selector``."""
    t = thresholds or AlertThresholds()
    w = t.rate_window

    def s(metric: str, *extra: str) -> str:
        return series(metric, selector, *extra)

    ttft = f"histogram_quantile(0.95, sum by (le, model_name) (rate({s(m.VLLM_TTFT.bucket)}[{w}])))"
    gw = m.GATEWAY_REQUESTS.name
    ctr = f'container="{ENGINE_CONTAINER}"'
    limit = f"sum by (namespace, pod) ({s(m.HAMI_VGPU_MEMORY_LIMIT.name, ctr)})"
    used = f"sum by (namespace, pod) ({s(m.HAMI_VGPU_MEMORY_USED.name, ctr)})"
    cores = f"max by (namespace, pod) ({s(m.HAMI_CONTAINER_CORE_UTILIZATION.name, ctr)})"
    model_of = engine_pod_models(s)
    kv_peak = (
        f"max by (namespace, pod, model_name) "
        f"(max_over_time({s(m.VLLM_KV_CACHE_USAGE.name)}[{t.for_sizing}]))"
    )
    failures = s(m.SERVE_HEALTH_CHECK_FAILURES.name)
    refused = s(m.GATEWAY_REJECTIONS.name, 'reason=~"overload|unavailable"')
    waiting = f"sum by (namespace, pod, model_name) ({s(m.VLLM_REQUESTS_WAITING.name)})"
    status = m.SERVE_DEPLOYMENT_STATUS.name
    app_status = m.SERVE_APPLICATION_STATUS.name
    return [
        AlertRule.model_validate(
            {
                "alert": "FleetServeHighTimeToFirstToken",
                "expr": f"{ttft} > {t.ttft_p95_seconds:g}",
                "for": t.for_long,
                "severity": "warning",
                "summary": "{{ $labels.model_name }}: TTFT p95 is {{ $value | humanizeDuration }}",
                "description": (
                    f"Time to first token p95 of model {{{{ $labels.model_name }}}} has been "
                    f"above {t.ttft_p95_seconds:g}s for {t.for_long}. Prefill is queueing: "
                    "check KV cache usage and waiting requests; raise replicas.max or "
                    "lower max_num_seqs/max_model_len."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeKVCacheNearlyFull",
                "expr": (
                    f"max by (model_name) ({s(m.VLLM_KV_CACHE_USAGE.name)}) > {t.kv_cache_usage:g}"
                ),
                "for": t.for_long,
                "severity": "warning",
                "summary": (
                    "{{ $labels.model_name }}: KV cache {{ $value | humanizePercentage }} full"
                ),
                "description": (
                    "A replica's KV cache has stayed above "
                    f"{t.kv_cache_usage:.0%} for {t.for_long}: vLLM preempts running "
                    "sequences and new requests wait. Add replicas, give the slice more "
                    "memory, or lower concurrency/max_model_len."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeRequestsWaiting",
                "expr": (
                    f"sum by (model_name) ({s(m.VLLM_REQUESTS_WAITING.name)}) "
                    f"> {t.requests_waiting}"
                ),
                "for": t.for_long,
                "severity": "warning",
                "summary": "{{ $labels.model_name }}: {{ $value }} requests waiting",
                "description": (
                    f"Requests have been waiting in the engine queue for {t.for_long}: the "
                    "engines are saturated (max_num_seqs or KV cache). If replicas are at "
                    "replicas.max, raise it; if not, check why the autoscaler does not add them."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeDeploymentUnhealthy",
                "expr": (
                    f"{s(status)} == {m.DEPLOYMENT_STATUS_DEPLOY_FAILED} or "
                    f"{s(status)} == {m.DEPLOYMENT_STATUS_UNHEALTHY}"
                ),
                "for": t.for_short,
                "severity": "critical",
                "summary": (
                    "Serve deployment {{ $labels.application }}/{{ $labels.deployment }} "
                    "is unhealthy or failed to deploy"
                ),
                "description": (
                    "Ray Serve reports the deployment as UNHEALTHY (2) or DEPLOY_FAILED (1). "
                    "Check `serve status` on the head pod and the replica logs (engine "
                    "start-up OOM, bad engine arguments, missing weights or token)."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeApplicationUnhealthy",
                "expr": (
                    f"{s(app_status)} == {m.APPLICATION_STATUS_DEPLOY_FAILED} or "
                    f"{s(app_status)} == {m.APPLICATION_STATUS_UNHEALTHY}"
                ),
                "for": t.for_short,
                "severity": "critical",
                "summary": "Serve application {{ $labels.application }} is unhealthy",
                "description": (
                    "Ray Serve reports the application as UNHEALTHY or DEPLOY_FAILED; the "
                    "OpenAI endpoint may be down. Check the RayService status and `serve status`."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeReplicasBelowTarget",
                "expr": (
                    f"sum by (application, deployment) ({s(m.SERVE_REPLICA_HEALTHY.name)}) "
                    f"< max by (application, deployment) ({s(m.SERVE_TARGET_REPLICAS.name)})"
                ),
                "for": t.for_capacity,
                "severity": "warning",
                "summary": (
                    "{{ $labels.application }}/{{ $labels.deployment }}: fewer healthy "
                    "replicas than the autoscaler wants"
                ),
                "description": (
                    f"Healthy replicas have stayed below Serve's target for {t.for_capacity}: "
                    "worker pods "
                    "are Pending (no GPU/slice free, node pool at its limit, taint or "
                    "selector mismatch) or replicas crash at start. Run `fleetserve doctor` "
                    "on the manifests and `kubectl describe` the Pending pods."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeReplicaHealthChecksFailing",
                # Serve counts failures per replica: a crashed replica's first failure
                # creates a new series at 1, which increase() never sees (no earlier
                # sample) - "new within the window" catches it. Replicas restart in
                # seconds, too fast for the deployment-status gauge to be scraped.
                "expr": (
                    f"sum by (application, deployment) (increase({failures}[{w}])) > 0 or "
                    f"count by (application, deployment) "
                    f"({failures} unless {failures} offset {w}) > 0"
                ),
                # At once: a crash is an event (it stays "new" for only one window).
                "for": "0s",
                "severity": "warning",
                "summary": (
                    "{{ $labels.application }}/{{ $labels.deployment }}: replica health "
                    "checks failing"
                ),
                "description": (
                    f"A Serve replica failed its health check or crashed within {w}; Serve "
                    "replaces it (a model replica reloads its model). Repeated: check the "
                    "replica logs for engine errors, OOM kills, or nodes going away."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeHigh5xxRate",
                "expr": (
                    f"sum by (model) (rate({s(gw, STATUS_5XX)}[{w}])) / "
                    f"sum by (model) (rate({s(gw)}[{w}])) > {t.error_ratio_5xx:g}"
                ),
                "for": t.for_short,
                "severity": "critical",
                "summary": (
                    "{{ $labels.model }}: {{ $value | humanizePercentage }} of "
                    "requests fail with 5xx"
                ),
                "description": (
                    f"More than {t.error_ratio_5xx:.0%} of the gateway's responses were 5xx "
                    f"over {w}. 503 means replicas are full (max_ongoing_requests), missing "
                    "or draining; 500 means engine errors."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeRequestsRejected",
                "expr": (f"sum by (model, reason) (rate({refused}[{w}])) > 0"),
                "for": t.for_short,
                "severity": "warning",
                "summary": (
                    "{{ $labels.model }}: requests refused ({{ $labels.reason }}), "
                    "{{ $value | humanize }}/s"
                ),
                "description": (
                    "The gateway keeps refusing requests because every replica is full and "
                    "its queue too (overload) or no replica can take them (unavailable). "
                    "Raise replicas.max or max_queued_requests, or check why replicas are down."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeSliceOverProvisioned",
                "expr": (
                    f"(({limit} - {used}) / {limit} > {t.slice_unused:g}) "
                    f"* on (namespace, pod) group_left (model_name) "
                    f"(0 * ({kv_peak} < {t.slice_kv_low:g}) + 1)"
                ),
                "for": t.for_sizing,
                "severity": "info",
                "summary": (
                    "{{ $labels.model_name }} on {{ $labels.pod }}: "
                    "{{ $value | humanizePercentage }} of its GPU slice unused"
                ),
                "description": (
                    f"More than {t.slice_unused:.0%} of the HAMi slice's memory stayed unused "
                    f"and the engine's KV cache never reached {t.slice_kv_low:.0%} in "
                    f"{t.for_sizing}: the slice is over-provisioned. Lower the model's GPU "
                    "memory in the plan (smaller nvidia.com/gpumem) to fit more replicas per card."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeSliceMemoryFull",
                "expr": (
                    f"({used} / {limit} > {t.slice_memory_full:g}) "
                    f"* on (namespace, pod) group_left (model_name) {model_of}"
                ),
                "for": t.for_short,
                "severity": "warning",
                "summary": (
                    "{{ $labels.model_name }} on {{ $labels.pod }}: GPU slice "
                    "{{ $value | humanizePercentage }} used"
                ),
                "description": (
                    "The engine uses nearly all of its HAMi slice: HAMi fails the next CUDA "
                    "allocation (the engine crashes with out-of-memory). Give the slice more "
                    "memory or lower gpu_memory_utilization/max_model_len."
                ),
            }
        ),
        AlertRule.model_validate(
            {
                "alert": "FleetServeSliceCoresSaturated",
                "expr": (
                    f"({cores} > {t.slice_cores_busy:g}) "
                    f"* on (namespace, pod) group_left (model_name) (0 * ({waiting} > 0) + 1)"
                ),
                "for": t.for_long,
                "severity": "warning",
                "summary": (
                    "{{ $labels.model_name }} on {{ $labels.pod }}: slice cores at "
                    "{{ $value }}% with requests waiting"
                ),
                "description": (
                    "The slice's SM utilisation is pinned while requests wait in the engine: "
                    "the replica is short of GPU cores (nvidia.com/gpucores), not memory. "
                    "Raise gpucores or add replicas."
                ),
            }
        ),
    ]


#: How each alert is proven against a running fleet (``tests/integration/test_observe_live.py``
#: fires it and sees it resolve), or why it cannot fire on a local fleet. promtool's rule
#: tests (``tests/unit/observe/test_rules.py``) hold every alert on synthetic series too.
LocalProof = Literal["fake engine", "real engine", "not locally"]
ALERT_LOCAL_PROOF: dict[str, tuple[LocalProof, str]] = {
    "FleetServeHigh5xxRate": ("fake engine", "an overload burst answered with 503s"),
    "FleetServeRequestsRejected": ("fake engine", "the same burst: overload rejections"),
    "FleetServeReplicaHealthChecksFailing": ("fake engine", "a model replica's process killed"),
    "FleetServeHighTimeToFirstToken": (
        "real engine",
        "requests on vLLM with the threshold lowered to 1 ms (CPU prefill is slower)",
    ),
    "FleetServeKVCacheNearlyFull": (
        "not locally",
        "needs a KV cache filled to 95 %: the default fleet's small model and short requests "
        "never fill it on CPU (the series itself is checked live on the real engine)",
    ),
    "FleetServeRequestsWaiting": (
        "not locally",
        "needs more concurrent sequences than max_num_seqs for minutes: a saturation run, "
        "not a test (the series itself is checked live on the real engine)",
    ),
    "FleetServeDeploymentUnhealthy": (
        "not locally",
        "Serve replaces a killed local replica in about 2 s, faster than Ray's 10 s metrics "
        "report, so the UNHEALTHY status is not reliably exported; it needs a replica that "
        "keeps failing (no GPU, bad weights) - a cluster condition",
    ),
    "FleetServeApplicationUnhealthy": (
        "not locally",
        "as FleetServeDeploymentUnhealthy: a local application recovers before Ray exports it",
    ),
    "FleetServeReplicasBelowTarget": (
        "not locally",
        "needs replicas that cannot be placed (Pending pods on Kubernetes); a local "
        "replacement is faster than Ray's metrics report",
    ),
    "FleetServeSliceOverProvisioned": (
        "not locally",
        "needs HAMi's vGPU monitor and GPU slices on Kubernetes; its names are checked "
        "against an exposition sample from HAMi's source",
    ),
    "FleetServeSliceMemoryFull": ("not locally", "needs HAMi slices on Kubernetes (as above)"),
    "FleetServeSliceCoresSaturated": (
        "not locally",
        "needs HAMi slices on Kubernetes (as above)",
    ),
}


def rule_groups(
    selector: Mapping[str, str] | None = None,
    thresholds: AlertThresholds | None = None,
    interval: str = "30s",
) -> dict[str, Any]:
    """The Prometheus rule file (and ``PrometheusRule.spec``): ``{"groups": [...]}``."""
    return {
        "groups": [
            {
                "name": GROUP_NAME,
                "interval": interval,
                "rules": [rule.to_rule() for rule in alert_rules(selector, thresholds)],
            }
        ]
    }
