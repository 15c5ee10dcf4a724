"""The ingress logic: authorise, route by ``model``, relay the engine's response.

Design note. The ingress does as little as possible per request, because it sits on the
hot path of every token: it reads the body once, parses it only to find ``model`` (and
never re-serialises it), checks the key, and forwards the raw bytes to the model's
deployment, whose vLLM app does all validation. Responses come back as a head plus
already-framed SSE/JSON bytes and are relayed untouched - no per-token JSON work here.

Errors the ingress itself answers, all in vLLM's error shape: 400 (body is not a JSON
object, or ``model`` missing while several models are served), 401 (auth), 404 (unknown
model, or a model of another tenant), 503 + ``Retry-After`` (overloaded, replica gone,
draining). A mid-stream transport failure becomes an SSE ``error`` event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetserve.engine.protocol import EngineRequest, ResponseHead
from fleetserve.serve.api_keys import ApiKeyTable, AuthError
from fleetserve.serve.metrics import (
    UNKNOWN,
    GatewayMetrics,
    LabelBounds,
    MetricsMiddleware,
    MetricsSink,
)
from fleetserve.serve.model_client import (
    ModelClient,
    ModelOverloadedError,
    ModelUnavailableError,
)
from fleetserve.serve.openai_errors import (
    RETRY_AFTER_S,
    bad_request,
    error_response,
    model_not_found,
    unauthorized,
    unavailable,
)
from fleetserve.serve.usage import UsageScanner, scan_stream, usage_from_body

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
#: How long /ready waits for each model's replica to answer.
READY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ModelRoute:
    """What the ingress knows about one served model."""

    name: str
    max_model_len: int
    min_replicas: int = 1


class Gateway:
    """Routes requests to models; counts in-flight requests for drain."""

    def __init__(
        self,
        routes: list[ModelRoute],
        keys: ApiKeyTable,
        client: ModelClient,
        metrics_sink: MetricsSink | None = None,
    ) -> None:
        self.routes = {r.name: r for r in routes}
        self.keys = keys
        self.client = client
        # Label values bounded by what the gateway serves: its models, tenants with keys.
        self.metrics = GatewayMetrics(
            LabelBounds.of(self.routes, keys.key_tenants.values()), metrics_sink
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
        return JSONResponse({"object": "list", "data": cards})

    async def get_model(self, request: Request, model: str) -> Response:
        try:
            tenant = self._caller(request)
        except AuthError as e:
            return unauthorized(str(e))
        if model not in self.routes or not self.keys.visible(tenant, model):
            return model_not_found(model)
        return JSONResponse(self._card(self.routes[model]))

    # ------------------------------------------------------------------ probes

    async def ready(self) -> Response:
        """200 when every model with min replicas >= 1 has a replica answering."""
        names = [r.name for r in self.routes.values() if r.min_replicas > 0]
        results = await asyncio.gather(
            *(self.client.stats(n, READY_TIMEOUT_S) for n in names), return_exceptions=True
        )
        models: dict[str, Any] = {}
        ok = not self.draining
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                models[name] = {"ready": False, "reason": str(result)}
            else:
                models[name] = {
                    "ready": True,
                    "running": result.running,
                    "in_flight": result.in_flight,
                    "aborted": result.aborted,
                    "completed": result.completed,
                }
        status = "ready" if ok else ("draining" if self.draining else "not ready")
        return JSONResponse(
            {"status": status, "in_flight": self.in_flight, "models": models},
            status_code=200 if ok else 503,
        )

    # ------------------------------------------------------------------ forwarding

    async def forward(self, request: Request) -> Response:
        """Route one model request (``MODEL_ENDPOINTS``) and relay the response."""
        if self.draining:
            self.metrics.record_rejection(None, UNKNOWN, "draining")
            return unavailable("the server is shutting down; retry on another instance")
        try:
            tenant = self._caller(request)
        except AuthError as e:
            self.metrics.record_rejection(None, UNKNOWN, "auth")
            return unauthorized(str(e))
        body = await request.body()
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
        self.metrics.tag(request, model=model, tenant=tenant)
        if not isinstance(model, str) or not self.keys.visible(tenant, model):
            return model_not_found(model)
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
        stream = self.client.open(model, engine_request)
        try:
            head = await anext(stream)
        except ModelOverloadedError as e:
            self.metrics.record_rejection(model, tenant, "overload")
            return error_response(
                503, e.message, "ServiceUnavailableError", retry_after=RETRY_AFTER_S
            )
        except ModelUnavailableError as e:
            self.metrics.record_rejection(model, tenant, "unavailable")
            return unavailable(e.message)
        if not isinstance(head, ResponseHead):
            return error_response(500, "the engine sent no response head", "InternalServerError")
        if head.media_type.startswith("text/event-stream"):
            scanner = UsageScanner()
            return StreamingResponse(
                self._account(_relay(scan_stream(stream, scanner), model), model, tenant, scanner),
                status_code=head.status,
                headers=dict(head.headers),
                media_type=head.media_type,
            )
        parts = [c async for c in stream if isinstance(c, bytes)]
        content = b"".join(parts)
        self.metrics.record_usage(model, tenant, usage_from_body(content))
        return Response(
            content,
            status_code=head.status,
            headers=dict(head.headers),
            media_type=head.media_type,
        )

    async def _account(
        self, chunks: AsyncIterator[bytes], model: str, tenant: str | None, scanner: UsageScanner
    ) -> AsyncIterator[bytes]:
        """Relay a stream, then record the usage it carried (once, at its end)."""
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.metrics.record_usage(model, tenant, scanner.usage)


async def _relay(stream: AsyncIterator[ResponseHead | bytes], model: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            if isinstance(chunk, bytes):
                yield chunk
    except (ModelUnavailableError, ModelOverloadedError) as e:
        yield _sse_error(503, e.message, "ServiceUnavailableError")
    except Exception as e:
        yield _sse_error(500, f"model '{model}' failed mid-stream: {e}", "InternalServerError")


def _sse_error(status: int, message: str, err_type: str) -> bytes:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


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
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @api.get("/ready")
    async def ready() -> Response:
        return await gateway.ready()

    api.add_middleware(InFlightMiddleware, gateway=gateway)
    api.add_middleware(MetricsMiddleware, metrics=gateway.metrics)
    return api
