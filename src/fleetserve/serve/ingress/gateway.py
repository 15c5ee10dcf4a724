"""The ingress logic: authorise, route by ``model``, relay the engine's response.

Design note. The ingress does as little as possible per request, because it sits on the
hot path of every token: it reads the body once, parses it only to find ``model`` (and
never re-serialises it), checks the key, and forwards the raw bytes to the model's
deployment, whose vLLM app does all validation. Responses come back as a head plus
already-framed SSE/JSON bytes and are relayed untouched - no per-token JSON work here.

Errors the ingress itself answers, all in vLLM's error shape: 400 (body is not a JSON
object, or ``model`` missing while several models are served), 401 (auth), 404 (unknown
model, or a model of another tenant), 503 + ``Retry-After`` (overloaded, replica gone,
draining, no running replica), and, from :mod:`fleetserve.serve.ingress.limits`, 413 / 431 / 408
(request limits) and 400 for Ray Serve's control headers. Time: every wait on a model ends
at ``server.request_timeout_s`` (504 before the response starts); a stream that outlives
it, is cut by the drain timeout, or loses its replica ends with an SSE ``error`` event and
``data: [DONE]`` - never silently. Anything unexpected is a 500 in the same shape without
internals (logged here instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import pydantic_core
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetserve.engine.protocol import EngineRequest, ResponseHead
from fleetserve.observe.timeline import RECEIVED_NS, TIMELINE
from fleetserve.serve.guard.api_keys import ApiKeyTable, AuthError
from fleetserve.serve.guard.quota_guard import GuardConfig, TenantGuard
from fleetserve.serve.guard.quota_store import QuotaStore
from fleetserve.serve.guard.usage import UsageScanner, scan_stream, usage_from_body
from fleetserve.serve.ingress.adapters import AdapterRoute, AdapterTable, splice_model
from fleetserve.serve.ingress.limits import (
    Deadlines,
    HeaderGuard,
    RefusedError,
    RequestLimits,
    Wait,
    read_body,
)
from fleetserve.serve.ingress.metrics import (
    UNKNOWN,
    GatewayMetrics,
    LabelBounds,
    MetricsMiddleware,
    MetricsSink,
)
from fleetserve.serve.ingress.model_client import (
    ModelClient,
    ModelOverloadedError,
    ModelRequestTooLargeError,
    ModelUnavailableError,
)
from fleetserve.serve.ingress.probes import HealthSource, ProbeState
from fleetserve.serve.openai_errors import (
    REPLICA_RETRY_AFTER_S,
    RETRY_AFTER_S,
    bad_request,
    error_response,
    internal_error,
    model_not_found,
    sse_error,
    unauthorized,
    unavailable,
)

#: POST endpoints routed by the body's ``model`` (vLLM answers what it does not support).
MODEL_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
)
#: Request headers the engine may use; Authorization never leaves the ingress.
_FORWARDED_HEADERS = frozenset({"content-type", "x-request-id", "traceparent", "tracestate"})
#: How long ``/ready?engine=1`` waits for the models' engine counters.
ENGINE_STATS_TIMEOUT_S = 1.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRoute:
    """What the ingress knows about one served model."""

    name: str
    max_model_len: int
    min_replicas: int = 1
    adapters: tuple[str, ...] = ()  # LoRA adapter ids of the spec (serve/ingress/adapters.py)
    adapter_dir: str | None = None


class Gateway:
    """Routes requests to models; counts in-flight requests for drain."""

    def __init__(
        self,
        routes: list[ModelRoute],
        keys: ApiKeyTable,
        client: ModelClient,
        metrics_sink: MetricsSink | None = None,
        *,
        limits: RequestLimits | None = None,
        health: HealthSource | None = None,
        guard: GuardConfig | None = None,
        quota_store: QuotaStore | None = None,
    ) -> None:
        """``guard``: tenant quotas and exact per-model admission (None: neither), with
        ``quota_store`` holding the quota counters when a tenant has a quota."""
        self.routes = {r.name: r for r in routes}
        self.adapters = AdapterTable.of(routes)
        self.keys = keys
        self.client = client
        self.limits = limits or RequestLimits()
        self.deadlines = Deadlines(self.limits.request_timeout_s)
        # The fleet view probes read and fail-fast uses (refreshed off the request path).
        # Fleet health for probes and fail-fast: given, or the client's own (in-process).
        self.probes = ProbeState(
            health if health is not None else cast(HealthSource, client),
            {r.name: r.min_replicas for r in routes},
            on_down=self.deadlines.model_down,
        )
        self._engine_stats: dict[str, Any] = {}
        self._engine_stats_task: asyncio.Task[None] | None = None
        # Label values bounded by what the gateway serves: its models, tenants with keys.
        self.metrics = GatewayMetrics(
            LabelBounds.of(self.routes, keys.key_tenants.values()), metrics_sink
        )
        # Tenant quotas + exact per-model admission (serve/guard/quota_guard.py), built here
        # with what it reads and writes - the probes' fleet view, the metrics - given at
        # construction: the request goes gateway -> guard -> back to the gateway's _serve
        # only as the serve function of each call.
        self.quota_guard = (
            TenantGuard(
                guard,
                quota_store,
                on_rejection=self.metrics.record_rejection,
                running_replicas=self.probes.running,
            )
            if guard is not None
            else None
        )
        self.in_flight = 0
        self.draining = False
        self.created = int(time.time())

    # ------------------------------------------------------------------ models

    def _caller(self, request: Request) -> str | None:
        return self.keys.tenant(request.headers.get("authorization"))

    def _card(self, route: ModelRoute) -> dict[str, Any]:
        return {
            "id": route.name,
            "object": "model",
            "created": self.created,
            "owned_by": "fleetserve",
            "root": route.name,
            "parent": None,
            "max_model_len": route.max_model_len,
            "permission": [],
        }

    async def list_models(self, request: Request) -> Response:
        try:
            tenant = self._caller(request)
        except AuthError as e:
            return unauthorized(str(e))
        cards = [self._card(r) for r in self.routes.values() if self.keys.visible(tenant, r.name)]
        cards += [
            self._adapter_card(a)
            for a in self.adapters.listing()
            if self.keys.visible(tenant, a.tenancy_id)
        ]
        return JSONResponse({"object": "list", "data": cards})

    def _adapter_card(self, adapter: AdapterRoute) -> dict[str, Any]:
        card = self._card(self.routes[adapter.base])
        return {**card, "id": adapter.name, "root": adapter.name, "parent": adapter.base}

    def _adapter_target(
        self, model: str, tenant: str | None, payload: dict[str, Any], body: bytes
    ) -> tuple[str, bytes]:
        """The base deployment serving adapter ``model`` and the body vLLM must get
        (``base:adapter`` becomes ``adapter``); unchanged when no visible adapter."""
        adapter = self.adapters.find(model)
        if adapter is None or not self.keys.visible(tenant, adapter.tenancy_id):
            return model, body
        if model != adapter.name:
            body = splice_model(body, payload, adapter.name)
        return adapter.base, body

    async def get_model(self, request: Request, model: str) -> Response:
        try:
            tenant = self._caller(request)
        except AuthError as e:
            return unauthorized(str(e))
        adapter = None if model in self.routes else self.adapters.find(model)
        if adapter is not None and self.keys.visible(tenant, adapter.tenancy_id):
            return JSONResponse(self._adapter_card(adapter))
        if model not in self.routes or not self.keys.visible(tenant, model):
            return model_not_found(model)
        return JSONResponse(self._card(self.routes[model]))

    # ------------------------------------------------------------------ probes

    def _probe_visible(self, request: Request) -> Callable[[str], bool] | None:
        """Which models a probe caller may see: None (no names) without a valid key."""
        try:
            tenant = self._caller(request)
        except AuthError:
            return None
        if self.keys.enabled and tenant is None:
            return None
        return lambda name: self.keys.visible(tenant, name)

    async def health(self, request: Request) -> Response:
        """Liveness: 503 once a model's engine died (its deployment is unhealthy)."""
        self.probes.ensure_started()
        ok = self.probes.live()
        body: dict[str, Any] = {"status": "ok" if ok else "unhealthy"}
        visible = self._probe_visible(request)
        if visible is not None:
            body["models"] = self.probes.describe(visible)
        return JSONResponse(body, status_code=200 if ok else 503)

    async def ready(self, request: Request) -> Response:
        """Readiness: not draining and every model with min replicas >= 1 has one running.

        Answered from the cached fleet view, never by asking the model replicas; only
        ``?engine=1`` from a caller who may see the models adds the engines' counters
        (one shared, bounded fetch at a time).
        """
        self.probes.ensure_started()
        if self.probes.updated is None:
            await self.probes.refresh()
        ok = self.probes.ready(self.draining)
        status = "ready" if ok else ("draining" if self.draining else "not ready")
        body: dict[str, Any] = {"status": status}
        visible = self._probe_visible(request)
        if visible is not None:
            body["in_flight"] = self.in_flight
            models = self.probes.describe(visible)
            if request.query_params.get("engine") == "1":
                await self._refresh_engine_stats()
                for name, detail in models.items():
                    detail.update(self._engine_stats.get(name, {}))
            body["models"] = models
        return JSONResponse(body, status_code=200 if ok else 503)

    async def _refresh_engine_stats(self) -> None:
        if self._engine_stats_task is None or self._engine_stats_task.done():
            self._engine_stats_task = asyncio.get_running_loop().create_task(
                self._fetch_engine_stats()
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._engine_stats_task), ENGINE_STATS_TIMEOUT_S)

    async def _fetch_engine_stats(self) -> None:
        names = list(self.routes)
        results = await asyncio.gather(
            *(self.client.stats(n, 10 * ENGINE_STATS_TIMEOUT_S) for n in names),
            return_exceptions=True,
        )
        for name, result in zip(names, results, strict=True):
            if not isinstance(result, BaseException):
                self._engine_stats[name] = {
                    "running": result.running,
                    "in_flight": result.in_flight,
                    "aborted": result.aborted,
                    "completed": result.completed,
                    "handed_off": result.handed_off,
                }

    # ------------------------------------------------------------------ forwarding

    async def forward(self, request: Request) -> Response:
        """Route one model request (``MODEL_ENDPOINTS``) and relay the response."""
        if TIMELINE.enabled:
            RECEIVED_NS.set(time.monotonic_ns())
        self.probes.ensure_started()
        if self.draining:
            self.metrics.record_rejection(None, UNKNOWN, "draining")
            return unavailable("the server is shutting down; retry on another instance")
        try:
            tenant = self._caller(request)
        except AuthError as e:
            self.metrics.record_rejection(None, UNKNOWN, "auth")
            return unauthorized(str(e))
        try:
            body = await read_body(request.receive, request.headers, self.limits)
        except RefusedError as e:
            self.metrics.record_rejection(None, UNKNOWN, "limit")
            r = e.refusal
            refused = error_response(r.status, r.message, r.err_type, param=r.param)
            # The rest of the body is not read: the connection cannot be reused.
            refused.headers["connection"] = "close"
            return refused
        try:
            payload = pydantic_core.from_json(body) if body else None
        except ValueError as e:
            return bad_request(f"the request body is not valid JSON: {e}")
        if not isinstance(payload, dict):
            return bad_request("the request body must be a JSON object")
        model = payload.get("model")
        if model is None:
            visible = [n for n in self.routes if self.keys.visible(tenant, n)]
            if len(visible) != 1:
                return bad_request(
                    f"'model' is required: this server serves {len(visible)} models "
                    "(GET /v1/models lists them)",
                    param="model",
                )
            model = visible[0]
        requested = model
        if isinstance(model, str) and model not in self.routes and self.adapters:
            model, body = self._adapter_target(model, tenant, payload, body)
        self.metrics.tag(request, model=model, tenant=tenant)
        if not isinstance(model, str) or not self.keys.visible(tenant, model):
            return model_not_found(requested)
        if self.quota_guard is not None:
            return await self.quota_guard.run(
                request, tenant=tenant, model=model, payload=payload, body=body, serve=self._serve
            )
        return await self._serve(request, model, tenant, body)

    async def _serve(
        self, request: Request, model: str, tenant: str | None, body: bytes
    ) -> Response:
        """Forward one admitted request to ``model`` and relay its response."""
        headers = tuple(
            (k, v) for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS
        )
        engine_request = EngineRequest(
            method="POST",
            path=request.url.path,
            body=body,
            headers=headers,
            query_string=request.url.query,
        )
        if self.probes.no_replica(model):
            self.metrics.record_rejection(model, tenant, "unavailable")
            return _no_replica(model)
        wait = self.deadlines.open(model)
        handed_over = False
        stream = self.client.open(model, engine_request)
        try:
            try:
                async with self.deadlines.bounded(wait):
                    head = await anext(stream)
            except TimeoutError:
                if wait.reason in _REJECTION_OF:
                    self.metrics.record_rejection(model, tenant, _REJECTION_OF[wait.reason])
                return self._ended(wait)
            except ModelOverloadedError as e:
                self.metrics.record_rejection(model, tenant, "overload")
                return error_response(
                    503, e.message, "ServiceUnavailableError", retry_after=RETRY_AFTER_S
                )
            except ModelUnavailableError as e:
                self.metrics.record_rejection(model, tenant, "unavailable")
                return unavailable(e.message)
            except ModelRequestTooLargeError as e:
                return error_response(413, e.message, "RequestEntityTooLargeError")
            wait.waiting_for_head = False
            if not isinstance(head, ResponseHead):
                return error_response(
                    500, "the engine sent no response head", "InternalServerError"
                )
            if head.media_type.startswith("text/event-stream"):
                scanner = UsageScanner()
                handed_over = True
                return StreamingResponse(
                    self._account(
                        self._relay(scan_stream(stream, scanner), model, wait, raw=stream),
                        model,
                        tenant,
                        scanner,
                    ),
                    status_code=head.status,
                    headers=dict(head.headers),
                    media_type=head.media_type,
                )
            parts: list[bytes] = []
            try:
                while True:
                    async with self.deadlines.bounded(wait):
                        chunk = await anext(stream, None)
                    if chunk is None:
                        break
                    if isinstance(chunk, bytes):
                        parts.append(chunk)
            except TimeoutError:
                return self._ended(wait)
            except ModelUnavailableError as e:
                return unavailable(e.message)
        finally:
            if not handed_over:
                self.deadlines.close(wait)
                await _close(stream)
        content = b"".join(parts)
        self.metrics.record_usage(model, tenant, usage_from_body(content))
        return Response(
            content,
            status_code=head.status,
            headers=dict(head.headers),
            media_type=head.media_type,
        )

    def _ended(self, wait: Wait) -> Response:
        """The answer to a request whose wait was ended (timeout, drain, replica loss)."""
        if wait.reason == "unavailable":
            return _no_replica(wait.model)
        if wait.reason == "drain":
            return unavailable(_DRAIN_CUT)
        return error_response(504, self._timeout_message(), "TimeoutError")

    def _timeout_message(self) -> str:
        return (
            "the request did not finish within this server's request timeout "
            f"({self.limits.request_timeout_s:g} s)"
        )

    async def _relay(
        self,
        stream: AsyncIterator[ResponseHead | bytes],
        model: str,
        wait: Wait,
        raw: AsyncIterator[ResponseHead | bytes] | None = None,
    ) -> AsyncIterator[bytes]:
        """Relay a stream under its deadline; every abnormal end is an SSE error event.

        The bound covers only the wait for the next chunk, never a ``yield``, so a
        timeout or a cut always lands here (not in the server's send) and the client
        gets the error event.
        """
        try:
            while True:
                async with self.deadlines.bounded(wait):
                    chunk = await anext(stream, None)
                if chunk is None:
                    return
                if isinstance(chunk, bytes):
                    yield chunk
        except TimeoutError:
            if wait.reason == "drain":
                yield sse_error(503, _DRAIN_CUT, "ServiceUnavailableError")
            elif wait.reason == "unavailable":
                yield sse_error(503, _no_replica_message(model), "ServiceUnavailableError")
            else:
                yield sse_error(504, self._timeout_message(), "TimeoutError")
        except (ModelUnavailableError, ModelOverloadedError) as e:
            yield sse_error(503, e.message, "ServiceUnavailableError")
        except Exception:
            logger.exception("model %r failed mid-stream", model)
            yield sse_error(500, f"model '{model}' failed mid-stream", "InternalServerError")
        finally:
            self.deadlines.close(wait)
            await _close(stream)
            if raw is not None:
                await _close(raw)

    async def _account(
        self, chunks: AsyncIterator[bytes], model: str, tenant: str | None, scanner: UsageScanner
    ) -> AsyncIterator[bytes]:
        """Relay a stream, then record the usage it carried (once, at its end)."""
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.metrics.record_usage(model, tenant, scanner.usage)


#: Why a wait ended -> the metrics' rejection reason (a timeout is not a rejection).
_REJECTION_OF = {"drain": "draining", "unavailable": "unavailable"}
_DRAIN_CUT = (
    "the server is shutting down and its drain timeout ended this request; "
    "retry on another instance"
)


def _no_replica_message(model: str) -> str:
    return f"model '{model}' has no running replica right now (it is restarting); retry later"


def _no_replica(model: str) -> Response:
    return unavailable(_no_replica_message(model), retry_after=REPLICA_RETRY_AFTER_S)


async def _close(stream: AsyncIterator[ResponseHead | bytes]) -> None:
    """Close a model stream early (the replica stops generating)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


class InFlightMiddleware:
    """Counts open HTTP exchanges (streams included) on the gateway, for drain.

    A pure ASGI middleware so the count drops only when the response - a whole SSE
    stream - is finished or cancelled, whatever happened inside.
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.gateway.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.gateway.in_flight -= 1


def create_api(gateway: Gateway) -> FastAPI:
    """The OpenAI-compatible HTTP app over ``gateway``."""
    api = FastAPI(title="fleetserve", docs_url=None, redoc_url=None, openapi_url=None)

    async def forward(request: Request) -> Response:
        return await gateway.forward(request)

    for path in MODEL_ENDPOINTS:
        api.add_api_route(path, forward, methods=["POST"], include_in_schema=False)

    @api.get("/v1/models")
    async def list_models(request: Request) -> Response:
        return await gateway.list_models(request)

    @api.get("/v1/models/{model:path}")
    async def get_model(request: Request, model: str) -> Response:
        return await gateway.get_model(request, model)

    @api.get("/health")
    async def health(request: Request) -> Response:
        return await gateway.health(request)

    @api.get("/ready")
    async def ready(request: Request) -> Response:
        return await gateway.ready(request)

    async def on_error(request: Request, error: Exception) -> Response:
        # Never a bare-text 500, never a traceback or an internal id in the answer.
        logger.error("unhandled error on %s", request.url.path, exc_info=error)
        return internal_error()

    api.add_exception_handler(Exception, on_error)
    api.add_middleware(InFlightMiddleware, gateway=gateway)
    # Header limits and Serve's control headers, before any route (and inside metrics).
    api.add_middleware(HeaderGuard, limits=gateway.limits)
    api.add_middleware(MetricsMiddleware, metrics=gateway.metrics)
    return api
