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

What must stay true: a dashboard panel or alert names a metric only through a
:class:`PromMetric` from this module, so a rename in Ray or vLLM is fixed in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["counter", "gauge", "histogram"]
MetricSource = Literal["vllm", "serve"]

#: Ray's Prometheus namespace (``ray._private.telemetry.open_telemetry_metric_recorder``).
RAY_NAMESPACE = "ray"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def ray_exported_name(recorded_name: str, kind: MetricKind) -> str:
    """The name Prometheus stores for a metric recorded in Ray as ``recorded_name``.

    ``ray_exported_name("vllm:prompt_tokens", "counter") == "ray_vllm_prompt_tokens_total"``.
    For histograms this is the family name (append ``_bucket``/``_sum``/``_count``).
    """
    name = f"{RAY_NAMESPACE}_{_INVALID.sub('_', recorded_name)}"
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

    @property
    def name(self) -> str:
        """The exported family name (counters include ``_total``)."""
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
