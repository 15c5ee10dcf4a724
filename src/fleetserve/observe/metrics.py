"""The Prometheus metric names fleetserve's dashboards and alerts read: one source of truth.

Every name here is what a Prometheus scraping a Ray cluster really stores, not what the code
that records it calls it. Two translations happen between the two (checked against the
installed Ray 2.60 and vLLM, see ``tests/unit/observe/test_metrics.py``):

* vLLM running inside Ray Serve records through ``vllm.v1.metrics.ray_wrappers``: its
  ``vllm:time_to_first_token_seconds`` has every character outside ``[a-zA-Z0-9_]`` replaced
  by ``_`` (OpenTelemetry naming), giving ``vllm_time_to_first_token_seconds``;
* Ray's metrics agent then exports every ``ray.util.metrics`` metric under the ``ray``
  namespace (``ray_vllm_time_to_first_token_seconds``), and a Counter gains ``_total`` in the
  Prometheus exposition unless its name already ends in ``_total``. Histograms expose
  ``_bucket``/``_sum``/``_count`` series.

Two more families are not recorded through Ray: HAMi's vGPU monitor (``hami-device-plugin``,
port 9394, a plain Prometheus client; names as in HAMi's ``cmd/vGPUmonitor/metrics.go``
since HAMi's rename to Prometheus naming (commit 6609804f, PR #1644, March 2026; checked at
HAMi 4707fb02 - older monitors, and ``--legacy-metrics``, export ``vGPU_device_memory_*`` /
``HostGPUMemoryUsage`` instead), checked against our own exposition sample in
``tests/fixtures/observe/hami_vgpu_monitor.prom``)
keeps its names as they are; fleetserve's gateway metrics (:mod:`fleetserve.serve.ingress.metrics`)
go through ``ray.util.metrics`` like Serve's.

What must stay true: a dashboard panel or alert names a metric only through a
:class:`PromMetric` from this module, so a rename in Ray, vLLM or HAMi is fixed in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["counter", "gauge", "histogram"]
MetricSource = Literal["vllm", "serve", "gateway", "hami"]

#: Ray's Prometheus namespace (``ray._private.telemetry.open_telemetry_metric_recorder``).
RAY_NAMESPACE = "ray"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def ray_metric_name(recorded_name: str) -> str:
    """The name ``ray.util.metrics`` takes for a Prometheus name, as vLLM's Ray wrappers
    write it (``vllm:x`` -> ``vllm_x``; OpenTelemetry allows ``[a-zA-Z0-9_]`` only)."""
    return _INVALID.sub("_", recorded_name)


def ray_exported_name(recorded_name: str, kind: MetricKind) -> str:
    """The name Prometheus stores for a metric recorded in Ray as ``recorded_name``.

    ``ray_exported_name("vllm:prompt_tokens", "counter") == "ray_vllm_prompt_tokens_total"``.
    For histograms this is the family name (append ``_bucket``/``_sum``/``_count``).
    """
    name = f"{RAY_NAMESPACE}_{ray_metric_name(recorded_name)}"
    if kind == "counter" and not name.endswith("_total"):
        name += "_total"
    return name


@dataclass(frozen=True)
class PromMetric:
    """One exported metric: where it comes from, its kind, and the labels queries use."""

    recorded: str
    kind: MetricKind
    source: MetricSource
    labels: tuple[str, ...]
    help: str
    #: Histogram bucket upper bounds (only for histograms fleetserve records itself).
    buckets: tuple[float, ...] = ()

    @property
    def name(self) -> str:
        """The exported family name (counters include ``_total``)."""
        if self.source == "hami":
            return self.recorded  # scraped straight from HAMi's monitor, not through Ray
        return ray_exported_name(self.recorded, self.kind)

    @property
    def bucket(self) -> str:
        """The ``_bucket`` series of a histogram (``histogram_quantile`` input)."""
        if self.kind != "histogram":
            raise ValueError(f"{self.recorded} is a {self.kind}, not a histogram")
        return f"{self.name}_bucket"

    @property
    def count(self) -> str:
        """The ``_count`` series of a histogram."""
        if self.kind != "histogram":
            raise ValueError(f"{self.recorded} is a {self.kind}, not a histogram")
        return f"{self.name}_count"


# --------------------------------------------------------------------------- vLLM engine
# Recorded by vllm.v1.metrics.loggers.PrometheusStatLogger through RayPrometheusStatLogger.
# Labels: model_name (the served model id), engine (engine index), ReplicaId (Serve replica).
_VLLM_LABELS = ("model_name", "engine", "ReplicaId")

VLLM_TTFT = PromMetric(
    "vllm:time_to_first_token_seconds",
    "histogram",
    "vllm",
    _VLLM_LABELS,
    "Time to first token (s).",
)
VLLM_ITL = PromMetric(
    "vllm:inter_token_latency_seconds",
    "histogram",
    "vllm",
    _VLLM_LABELS,
    "Inter-token latency (s).",
)
VLLM_E2E_LATENCY = PromMetric(
    "vllm:e2e_request_latency_seconds",
    "histogram",
    "vllm",
    _VLLM_LABELS,
    "End-to-end request latency inside the engine (s).",
)
VLLM_QUEUE_TIME = PromMetric(
    "vllm:request_queue_time_seconds",
    "histogram",
    "vllm",
    _VLLM_LABELS,
    "Time a request waited in the engine's queue (s).",
)
VLLM_KV_CACHE_USAGE = PromMetric(
    "vllm:kv_cache_usage_perc",
    "gauge",
    "vllm",
    _VLLM_LABELS,
    "KV cache usage, 0..1 (1 = full).",
)
VLLM_REQUESTS_RUNNING = PromMetric(
    "vllm:num_requests_running",
    "gauge",
    "vllm",
    _VLLM_LABELS,
    "Requests in the running batch.",
)
VLLM_REQUESTS_WAITING = PromMetric(
    "vllm:num_requests_waiting",
    "gauge",
    "vllm",
    _VLLM_LABELS,
    "Requests waiting for the scheduler (KV cache or max_num_seqs full).",
)
VLLM_PREEMPTIONS = PromMetric(
    "vllm:num_preemptions",
    "counter",
    "vllm",
    _VLLM_LABELS,
    "Sequences preempted because the KV cache ran out.",
)
VLLM_PROMPT_TOKENS = PromMetric(
    "vllm:prompt_tokens",
    "counter",
    "vllm",
    _VLLM_LABELS,
    "Prompt (prefill) tokens processed.",
)
VLLM_GENERATION_TOKENS = PromMetric(
    "vllm:generation_tokens",
    "counter",
    "vllm",
    _VLLM_LABELS,
    "Generated tokens.",
)
VLLM_REQUEST_SUCCESS = PromMetric(
    "vllm:request_success",
    "counter",
    "vllm",
    (*_VLLM_LABELS, "finished_reason"),
    "Finished requests by reason (stop, length, abort, ...).",
)

# --------------------------------------------------------------------------- Ray Serve
# Recorded by Ray Serve's proxy, router, replicas and controller (ray.serve._private).
SERVE_HTTP_REQUESTS = PromMetric(
    "serve_num_http_requests",
    "counter",
    "serve",
    ("route", "method", "application", "status_code"),
    "HTTP requests handled by the Serve proxy, by status code.",
)
SERVE_HTTP_ERRORS = PromMetric(
    "serve_num_http_error_requests",
    "counter",
    "serve",
    ("route", "error_code", "method", "application"),
    "HTTP requests the Serve proxy answered with an error.",
)
SERVE_HTTP_LATENCY = PromMetric(
    "serve_http_request_latency_ms",
    "histogram",
    "serve",
    ("method", "route", "application", "status_code"),
    "End-to-end HTTP latency measured at the Serve proxy (ms).",
)
SERVE_REPLICA_HEALTHY = PromMetric(
    "serve_deployment_replica_healthy",
    "gauge",
    "serve",
    ("deployment", "application"),
    "Healthy replicas of a deployment.",
)
SERVE_HEALTH_CHECK_FAILURES = PromMetric(
    "serve_health_check_failures_total",
    "counter",
    "serve",
    ("deployment", "application"),
    "Failed replica health checks.",
)
SERVE_DEPLOYMENT_STATUS = PromMetric(
    "serve_deployment_status",
    "gauge",
    "serve",
    ("deployment", "application"),
    "Deployment status: 0=UNKNOWN 1=DEPLOY_FAILED 2=UNHEALTHY 3=UPDATING 4=UPSCALING "
    "5=DOWNSCALING 6=HEALTHY.",
)
SERVE_APPLICATION_STATUS = PromMetric(
    "serve_application_status",
    "gauge",
    "serve",
    ("application",),
    "Application status: 0=UNKNOWN 1=DEPLOY_FAILED 2=UNHEALTHY 3=NOT_STARTED 4=DELETING "
    "5=DEPLOYING 6=RUNNING.",
)
SERVE_QUEUED_QUERIES = PromMetric(
    "serve_deployment_queued_queries",
    "gauge",
    "serve",
    ("deployment", "application", "handle", "actor_id"),
    "Requests queued in a handle, waiting for a replica slot (max_ongoing_requests).",
)
SERVE_TARGET_REPLICAS = PromMetric(
    "serve_autoscaling_target_replicas",
    "gauge",
    "serve",
    ("deployment", "application"),
    "Replicas the Serve autoscaler wants.",
)

SERVE_REPLICA_PROCESSING = PromMetric(
    "serve_replica_processing_queries",
    "gauge",
    "serve",
    ("deployment", "replica", "application"),
    "Requests a replica is processing now (its share of max_ongoing_requests).",
)

# --------------------------------------------------------------------------- gateway
# Recorded by fleetserve's ingress (fleetserve.serve.ingress.metrics) through ray.util.metrics.
# Label values are bounded by the spec: models and tenants not in it are "unknown", a
# request without a tenant (auth off) is "none", endpoints not routed are "other".
_GW = ("model", "tenant")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

GATEWAY_REQUESTS = PromMetric(
    "fleetserve_gateway_requests",
    "counter",
    "gateway",
    (*_GW, "endpoint", "status_code"),
    "HTTP requests the gateway answered, by model, tenant, endpoint and status code.",
)
GATEWAY_PROMPT_TOKENS = PromMetric(
    "fleetserve_gateway_prompt_tokens",
    "counter",
    "gateway",
    _GW,
    "Prompt tokens billed to a tenant (from the responses' usage).",
)
GATEWAY_COMPLETION_TOKENS = PromMetric(
    "fleetserve_gateway_completion_tokens",
    "counter",
    "gateway",
    _GW,
    "Completion tokens billed to a tenant (from the responses' usage).",
)
GATEWAY_TTFT = PromMetric(
    "fleetserve_gateway_time_to_first_token_seconds",
    "histogram",
    "gateway",
    _GW,
    "Time from the request's arrival to the first streamed byte, as the gateway sees it (s).",
    _LATENCY_BUCKETS,
)
GATEWAY_LATENCY = PromMetric(
    "fleetserve_gateway_request_latency_seconds",
    "histogram",
    "gateway",
    (*_GW, "endpoint"),
    "Time from the request's arrival to the end of its response (whole streams) (s).",
    _LATENCY_BUCKETS,
)
GATEWAY_REJECTIONS = PromMetric(
    "fleetserve_gateway_rejections",
    "counter",
    "gateway",
    (*_GW, "reason"),
    "Requests refused before an engine saw them, by reason "
    "(auth, quota, overload, draining, limit, unavailable).",
)
GATEWAY_IN_FLIGHT = PromMetric(
    "fleetserve_gateway_requests_in_flight",
    "gauge",
    "gateway",
    ("model",),
    "Model requests the gateway is relaying now (streams until their last byte).",
)

# --------------------------------------------------------------------------- HAMi
# HAMi's vGPU monitor (cmd/vGPUmonitor/metrics.go): one series per container and vGPU, with
# the engine pod's namespace/pod/container as labels (hence honorLabels on its monitor),
# plus the registry-wide ``zone="vGPU"``. Values: bytes; utilisation in percent (0-100).
_HAMI_CTR = ("namespace", "pod", "container", "vdevice_index", "device_uuid", "zone")

HAMI_VGPU_MEMORY_USED = PromMetric(
    "hami_vgpu_memory_used_bytes",
    "gauge",
    "hami",
    _HAMI_CTR,
    "GPU memory a container uses on its vGPU slice (bytes).",
)
HAMI_VGPU_MEMORY_LIMIT = PromMetric(
    "hami_vgpu_memory_limit_bytes",
    "gauge",
    "hami",
    _HAMI_CTR,
    "The vGPU slice's memory limit (nvidia.com/gpumem) (bytes).",
)
HAMI_CONTAINER_CORE_UTILIZATION = PromMetric(
    "hami_container_device_utilization_ratio",
    "gauge",
    "hami",
    _HAMI_CTR,
    "SM utilisation of a container's vGPU, percent (0-100).",
)
HAMI_HOST_GPU_MEMORY_USED = PromMetric(
    "hami_host_gpu_memory_used_bytes",
    "gauge",
    "hami",
    ("node", "device_index", "device_uuid", "device_type", "zone"),
    "Memory used on the physical card (all slices) (bytes).",
)
HAMI_HOST_GPU_UTILIZATION = PromMetric(
    "hami_host_gpu_utilization_ratio",
    "gauge",
    "hami",
    ("node", "device_index", "device_uuid", "device_type", "zone"),
    "Core utilisation of the physical card, percent (0-100).",
)

#: Deployment/application status values (``ray.serve._private`` enums as exported).
DEPLOYMENT_STATUS_DEPLOY_FAILED = 1
DEPLOYMENT_STATUS_UNHEALTHY = 2
APPLICATION_STATUS_DEPLOY_FAILED = 1
APPLICATION_STATUS_UNHEALTHY = 2

ALL_METRICS: tuple[PromMetric, ...] = (
    VLLM_TTFT,
    VLLM_ITL,
    VLLM_E2E_LATENCY,
    VLLM_QUEUE_TIME,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
    VLLM_PREEMPTIONS,
    VLLM_PROMPT_TOKENS,
    VLLM_GENERATION_TOKENS,
    VLLM_REQUEST_SUCCESS,
    SERVE_HTTP_REQUESTS,
    SERVE_HTTP_ERRORS,
    SERVE_HTTP_LATENCY,
    SERVE_REPLICA_HEALTHY,
    SERVE_HEALTH_CHECK_FAILURES,
    SERVE_DEPLOYMENT_STATUS,
    SERVE_APPLICATION_STATUS,
    SERVE_QUEUED_QUERIES,
    SERVE_TARGET_REPLICAS,
    SERVE_REPLICA_PROCESSING,
    GATEWAY_REQUESTS,
    GATEWAY_PROMPT_TOKENS,
    GATEWAY_COMPLETION_TOKENS,
    GATEWAY_TTFT,
    GATEWAY_LATENCY,
    GATEWAY_REJECTIONS,
    GATEWAY_IN_FLIGHT,
    HAMI_VGPU_MEMORY_USED,
    HAMI_VGPU_MEMORY_LIMIT,
    HAMI_CONTAINER_CORE_UTILIZATION,
    HAMI_HOST_GPU_MEMORY_USED,
    HAMI_HOST_GPU_UTILIZATION,
)


def exported_series_names() -> frozenset[str]:
    """Every series name a query may use (histograms: ``_bucket``, ``_sum``, ``_count``)."""
    names: set[str] = set()
    for metric in ALL_METRICS:
        if metric.kind == "histogram":
            names.update(f"{metric.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(metric.name)
    return frozenset(names)
