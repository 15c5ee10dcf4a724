"""The gateway's own metrics: requests, tokens, TTFT, latency and rejections per tenant.

Design note. The ingress answers HTTP itself (direct ingress), so Ray Serve's proxy metrics
no longer see requests; these are the front door's numbers. They are recorded through
``ray.util.metrics`` (:class:`RayMetricsSink`), so Ray's metrics agent exports them with
Serve's and vLLM's (``ray_fleetserve_gateway_*``, see :mod:`fleetserve.observe.metrics`,
which owns the names, labels and buckets). Three pieces:

* :class:`GatewayMetrics` - the recorder the gateway calls; it bounds every label value by
  what the spec knows (served models, tenants that have keys): anything else is
  ``"unknown"``, no tenant (auth off) is ``"none"``, an unrouted path is ``"other"``. No
  value from the request ever becomes a label as it is, so cardinality is fixed by the spec.
* a :class:`MetricsSink` - where values go: Ray in the ingress replica, :class:`MemorySink`
  in tests (it refuses wrong tag sets the way Ray does), :class:`NullSink` otherwise.
* :class:`MetricsMiddleware` - a pure ASGI middleware that times every exchange to its last
  byte (whole streams), records the status sent and the first streamed byte (TTFT as the
  client sees it); ``forward`` names the request's model and tenant with :meth:`GatewayMetrics.tag`.

What must stay true: recording never raises into a request (a failing sink loses a sample,
not a response); the label sets are exactly the ``labels`` of the PromMetric definitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetserve.observe import metrics as m
from fleetserve.observe.keeper import KEEPER
from fleetserve.observe.metrics import PromMetric
from fleetserve.serve.guard.usage import Usage

log = logging.getLogger(__name__)

#: Label value of a model or tenant the spec does not know.
UNKNOWN = "unknown"
#: Tenant label of requests when auth is off (no tenant identified).
NO_TENANT = "none"
#: Endpoint label of paths that are not routed endpoints.
OTHER = "other"
#: Why the gateway refused a request before an engine saw it.
REJECTION_REASONS = ("auth", "quota", "overload", "draining", "limit", "unavailable")
#: Paths that are not client traffic (probes); not counted.
UNCOUNTED_PATHS = frozenset({"/health", "/ready", "/metrics"})
#: Endpoints counted under their own name (anything else is ``OTHER``).
COUNTED_ENDPOINTS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/v1/models",
    }
)
#: Key of the per-request :class:`RequestTags` in the ASGI scope.
SCOPE_KEY = "fleetserve.metrics"


class MetricsSink(Protocol):
    """Where metric values go (Ray's metrics agent, memory, nowhere)."""

    def inc(self, metric: PromMetric, tags: Mapping[str, str], value: float = 1.0) -> None:
        """Add ``value`` to a counter."""

    def observe(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        """Record one histogram observation."""

    def set(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        """Set a gauge."""


class NullSink:
    """Drops everything (a gateway built outside Ray, e.g. by a tool)."""

    def inc(self, metric: PromMetric, tags: Mapping[str, str], value: float = 1.0) -> None:
        pass

    def observe(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        pass

    def set(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        pass


def _check_tags(metric: PromMetric, tags: Mapping[str, str]) -> None:
    # Ray refuses a record whose tags miss a declared key or add an undeclared one.
    if set(tags) != set(metric.labels):
        raise ValueError(
            f"{metric.recorded}: tags {sorted(tags)} are not its tag keys {sorted(metric.labels)}"
        )


_SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class MemorySink:
    """Keeps values in memory (tests); refuses wrong tag sets like Ray does."""

    counters: dict[_SeriesKey, float] = field(default_factory=dict)
    gauges: dict[_SeriesKey, float] = field(default_factory=dict)
    observations: dict[_SeriesKey, list[float]] = field(default_factory=dict)

    @staticmethod
    def _key(metric: PromMetric, tags: Mapping[str, str]) -> _SeriesKey:
        _check_tags(metric, tags)
        return metric.recorded, tuple(sorted(tags.items()))

    def inc(self, metric: PromMetric, tags: Mapping[str, str], value: float = 1.0) -> None:
        if metric.kind != "counter" or value < 0:
            raise ValueError(f"{metric.recorded}: cannot inc a {metric.kind} by {value}")
        key = self._key(metric, tags)
        self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        if metric.kind != "histogram":
            raise ValueError(f"{metric.recorded}: cannot observe a {metric.kind}")
        self.observations.setdefault(self._key(metric, tags), []).append(value)

    def set(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        if metric.kind != "gauge":
            raise ValueError(f"{metric.recorded}: cannot set a {metric.kind}")
        self.gauges[self._key(metric, tags)] = value

    def counter(self, metric: PromMetric, **tags: str) -> float:
        """A counter's value (0 when never incremented)."""
        return self.counters.get((metric.recorded, tuple(sorted(tags.items()))), 0.0)

    def series(self, metric: PromMetric) -> list[dict[str, str]]:
        """The tag sets recorded for ``metric`` (any kind)."""
        found = [*self.counters, *self.gauges, *self.observations]
        return [dict(tags) for name, tags in found if name == metric.recorded]


class RayMetricsSink:
    """``ray.util.metrics`` objects, made on first use in the process that records."""

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}

    def _get(self, metric: PromMetric) -> Any:
        obj = self._objects.get(metric.recorded)
        if obj is None:
            from ray.util import metrics as ray_metrics  # noqa: PLC0415 - Ray only in Ray

            if metric.kind == "counter":
                obj = ray_metrics.Counter(
                    metric.recorded, description=metric.help, tag_keys=metric.labels
                )
            elif metric.kind == "gauge":
                obj = ray_metrics.Gauge(
                    metric.recorded, description=metric.help, tag_keys=metric.labels
                )
            else:
                obj = ray_metrics.Histogram(
                    metric.recorded,
                    description=metric.help,
                    boundaries=list(metric.buckets),
                    tag_keys=metric.labels,
                )
            self._objects[metric.recorded] = obj
        return obj

    def inc(self, metric: PromMetric, tags: Mapping[str, str], value: float = 1.0) -> None:
        self._get(metric).inc(value, tags=dict(tags))

    def observe(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        self._get(metric).observe(value, tags=dict(tags))

    def set(self, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        # Ray forgets a gauge that is not set again: the keeper replays the last in-flight
        # count, so an idle gateway still reports 0 (fleetserve.observe.keeper).
        KEEPER.set(self._get(metric), value, tags)


@dataclass(frozen=True)
class LabelBounds:
    """The label values the spec allows; everything else collapses to a fixed value."""

    models: frozenset[str]
    tenants: frozenset[str]

    @classmethod
    def of(cls, models: Iterable[str], tenants: Iterable[str]) -> LabelBounds:
        return cls(frozenset(models), frozenset(tenants))

    def model(self, value: object) -> str:
        return value if isinstance(value, str) and value in self.models else UNKNOWN

    def tenant(self, value: object) -> str:
        if value is None:
            return NO_TENANT
        return value if isinstance(value, str) and value in self.tenants else UNKNOWN


def endpoint_label(path: str) -> str:
    """A bounded endpoint label for ``path``."""
    return path if path in COUNTED_ENDPOINTS else OTHER


@dataclass
class RequestTags:
    """What the gateway learnt about one request (filled in by ``forward``)."""

    endpoint: str
    model: str = UNKNOWN
    tenant: str = UNKNOWN
    tracked: bool = False  # counted in the in-flight gauge of ``model``


class GatewayMetrics:
    """The recorder the gateway calls. Every label value passes through ``bounds``."""

    def __init__(self, bounds: LabelBounds, sink: MetricsSink | None = None) -> None:
        self.bounds = bounds
        self.sink: MetricsSink = sink or NullSink()
        self._in_flight: dict[str, int] = {}

    def _safe(self, fn: Any, metric: PromMetric, tags: Mapping[str, str], value: float) -> None:
        try:
            fn(metric, tags, value)
        except Exception:  # a lost sample must never fail a request
            log.debug("cannot record %s", metric.recorded, exc_info=True)

    def _mt(self, model: object, tenant: object) -> dict[str, str]:
        return {"model": self.bounds.model(model), "tenant": self.bounds.tenant(tenant)}

    # ------------------------------------------------------------------ call sites

    def tag(self, scope_or_request: Any, *, model: object, tenant: object) -> None:
        """Name the model and tenant of the request being served (``forward`` calls it)."""
        scope = getattr(scope_or_request, "scope", scope_or_request)
        tags = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
        if not isinstance(tags, RequestTags):
            return
        tags.model = self.bounds.model(model)
        tags.tenant = self.bounds.tenant(tenant)
        if not tags.tracked and tags.model != UNKNOWN:
            tags.tracked = True
            self._move_in_flight(tags.model, +1)

    def record_rejection(self, model: object, tenant: object, reason: str) -> None:
        """A request refused before an engine saw it (reason: one of REJECTION_REASONS)."""
        if reason not in REJECTION_REASONS:
            raise ValueError(f"rejection reason {reason!r} is not one of {REJECTION_REASONS}")
        tags = {**self._mt(model, tenant), "reason": reason}
        self._safe(self.sink.inc, m.GATEWAY_REJECTIONS, tags, 1.0)

    def record_usage(self, model: object, tenant: object, usage: Usage | None) -> None:
        """Tokens of one response (nothing when the response carried no usage)."""
        if usage is None:
            return
        tags = self._mt(model, tenant)
        self._safe(self.sink.inc, m.GATEWAY_PROMPT_TOKENS, tags, float(usage.prompt_tokens))
        self._safe(self.sink.inc, m.GATEWAY_COMPLETION_TOKENS, tags, float(usage.completion_tokens))

    def record_ttft(self, tags: RequestTags, seconds: float) -> None:
        mt = {"model": tags.model, "tenant": tags.tenant}
        self._safe(self.sink.observe, m.GATEWAY_TTFT, mt, seconds)

    def record_request(self, tags: RequestTags, status: int, seconds: float) -> None:
        """One finished exchange (the middleware calls it at the last byte)."""
        base = {"model": tags.model, "tenant": tags.tenant, "endpoint": tags.endpoint}
        self._safe(self.sink.inc, m.GATEWAY_REQUESTS, {**base, "status_code": str(status)}, 1.0)
        self._safe(self.sink.observe, m.GATEWAY_LATENCY, base, seconds)
        if tags.tracked:
            tags.tracked = False
            self._move_in_flight(tags.model, -1)

    def _move_in_flight(self, model: str, delta: int) -> None:
        count = max(self._in_flight.get(model, 0) + delta, 0)
        self._in_flight[model] = count
        self._safe(self.sink.set, m.GATEWAY_IN_FLIGHT, {"model": model}, float(count))


class MetricsMiddleware:
    """Times every counted exchange to its last byte and records status and TTFT."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in UNCOUNTED_PATHS:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        tags = RequestTags(endpoint=endpoint_label(path))
        scope[SCOPE_KEY] = tags
        status = 500  # what the server answers when the app fails before a response starts
        streaming = False
        first_byte = True

        async def send_wrapper(message: Message) -> None:
            nonlocal status, streaming, first_byte
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = dict(message.get("headers") or [])
                streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif (
                message["type"] == "http.response.body"
                and streaming
                and first_byte
                and message.get("body")
            ):
                first_byte = False
                self.metrics.record_ttft(tags, time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.record_request(tags, status, time.perf_counter() - start)
