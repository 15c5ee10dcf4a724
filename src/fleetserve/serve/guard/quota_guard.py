"""The gateway's guard around each model request: tenant quota, then exact model admission.

Design note. ``Gateway.forward`` authenticates, parses ``model`` and hands the rest of
the request to :meth:`TenantGuard.run`, which

1. reserves the request's tokens in the tenant's (and key's) quota scopes through the
   shared :class:`~fleetserve.serve.guard.quota_store.QuotaStore` - one awaited round-trip; a
   refusal is 429 ``rate_limit_exceeded`` with ``Retry-After``;
2. takes a slot of the model's :class:`~fleetserve.serve.guard.admission.ModelGate` (exact
   capacity, fair queue; a full queue is 503 + ``Retry-After``, and its reservation is
   refunded: the server's overload is not the tenant's usage);
3. serves the request, adds OpenAI's ``x-ratelimit-*`` headers to whatever the response
   is, and - when the response's last byte is sent or the client leaves - frees the slot
   and settles the reservation with the usage the engine reported.

Usage of streams without re-serialising requests: when a tenant has token limits and a
streaming request did not set ``stream_options``, the body gets
``"stream_options":{"include_usage":true}`` spliced in after its opening brace (a byte
copy, no JSON encoding) and the usage-only event vLLM then sends before ``[DONE]`` is
read and cut out of the relayed stream, so the client sees exactly what it asked for.
A stream that ends without usage (cut by the client, or the client's own
``stream_options`` without ``include_usage``) keeps its whole reservation: the ledger
never counts less than was used.

429 (the tenant is over its quota) and 503 (the server is over capacity) stay apart:
different statuses, error types and rejection reasons (``quota`` / ``overload``).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from fleetserve.serve.guard.admission import GateLimits, ModelBusyError, ModelGate
from fleetserve.serve.guard.api_keys import KEY_ID_HEX, digest
from fleetserve.serve.guard.quota import Decision, Limits, RateLimitHeaders, reserve_tokens
from fleetserve.serve.guard.quota_store import QuotaStore, limits_from_args, limits_to_args
from fleetserve.serve.guard.usage import UsageScanner, usage_from_body
from fleetserve.serve.openai_errors import RETRY_AFTER_S, error_response
from fleetserve.spec import FleetSpec

#: Endpoints whose requests generate tokens (the rest reserve their prompt, or nothing).
GENERATING = frozenset({"/v1/chat/completions", "/v1/completions"})
#: Endpoints that cost prompt tokens only.
PROMPT_ONLY = frozenset({"/v1/embeddings"})
#: Scope names in the ledger: a tenant's, and the template of each of its keys'.
TENANT_SCOPE = "tenant:{}"
KEY_SCOPE = "key:{}/{}"
#: Seconds a reservation may stay open past the request timeout before its concurrency
#: slot is given back (an ingress replica died with the request in flight).
LEASE_MARGIN_S = 60.0

#: ``(model, tenant, reason)``: called for each request the guard refuses; reason is
#: ``quota`` (429) or ``overload`` (503). The gateway points it at its metrics.
RejectionHook = Callable[[str, str | None, str], None]
#: Running replicas of a model as the fleet view knows them (None: not known yet).
RunningReplicas = Callable[[str], int | None]
#: The gateway's own serving of an admitted request: (request, model, tenant, body).
ServeFn = Callable[[Request, str, str | None, bytes], Awaitable[Response]]


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's fairness weight and quotas (None: not limited)."""

    weight: float = 1.0
    quota: Limits | None = None
    per_key: Limits | None = None

    @property
    def counts_tokens(self) -> bool:
        return any(
            lim is not None and (lim.tokens_per_minute or lim.tokens_per_day)
            for lim in (self.quota, self.per_key)
        )


@dataclass(frozen=True)
class ModelPolicy:
    """A model's admission numbers and context length.

    ``capacity`` is every replica the deployment may run at ``max_ongoing_requests``; an
    autoscaled model (``per_replica`` set) admits ``running replicas x per_replica`` as the
    fleet view reports them (at least one replica's worth, so a request can still wake a
    model scaled to zero)."""

    capacity: int
    queue_limit: int
    max_model_len: int
    per_replica: int | None = None


@dataclass(frozen=True)
class GuardConfig:
    """Everything the guard needs, as plain data that travels in Serve's arguments."""

    models: dict[str, ModelPolicy]
    tenants: dict[str, TenantPolicy] = field(default_factory=dict)
    lease_s: float = 3600.0
    #: Longest a request waits in a model's gateway queue (the server's request timeout).
    queue_timeout_s: float = 600.0

    @classmethod
    def from_spec(cls, spec: FleetSpec, max_model_lens: Mapping[str, int]) -> GuardConfig:
        models = {
            m.name: ModelPolicy(
                # Every replica the deployment may run, each at max_ongoing_requests.
                capacity=m.replicas.max * m.replicas.max_ongoing_requests,
                queue_limit=m.replicas.max_queued_requests,
                max_model_len=max_model_lens[m.name],
                per_replica=(
                    m.replicas.max_ongoing_requests if m.replicas.min != m.replicas.max else None
                ),
            )
            for m in spec.models
        }
        tenants = {
            t.name: TenantPolicy(
                weight=t.weight,
                quota=Limits.from_spec(t.quota) if t.quota and t.quota.limited else None,
                per_key=(
                    Limits.from_spec(t.quota_per_key)
                    if t.quota_per_key and t.quota_per_key.limited
                    else None
                ),
            )
            for t in spec.tenants
        }
        timeout = spec.server.request_timeout_s
        return cls(models, tenants, timeout + LEASE_MARGIN_S, timeout)

    @property
    def quotas(self) -> bool:
        """Whether any tenant has a quota (then a quota keeper runs)."""
        return any(t.quota or t.per_key for t in self.tenants.values())

    def scope_limits(self) -> dict[str, Limits]:
        """The ledger's limits by scope (``key:<tenant>/*`` applies to each key)."""
        out: dict[str, Limits] = {}
        for name, t in self.tenants.items():
            if t.quota is not None:
                out[TENANT_SCOPE.format(name)] = t.quota
            if t.per_key is not None:
                out[KEY_SCOPE.format(name, "*")] = t.per_key
        return out

    def to_args(self) -> dict[str, Any]:
        return {
            "models": {
                n: {
                    "capacity": p.capacity,
                    "queue_limit": p.queue_limit,
                    "max_model_len": p.max_model_len,
                    "per_replica": p.per_replica,
                }
                for n, p in self.models.items()
            },
            "tenants": {
                n: {
                    "weight": t.weight,
                    "quota": limits_to_args({"q": t.quota})["q"] if t.quota else None,
                    "per_key": limits_to_args({"q": t.per_key})["q"] if t.per_key else None,
                }
                for n, t in self.tenants.items()
            },
            "lease_s": self.lease_s,
            "queue_timeout_s": self.queue_timeout_s,
        }

    @classmethod
    def from_args(cls, data: Mapping[str, Any]) -> GuardConfig:
        def lim(d: dict[str, Any] | None) -> Limits | None:
            return None if d is None else limits_from_args({"q": d})["q"]

        return cls(
            models={n: ModelPolicy(**p) for n, p in data["models"].items()},
            tenants={
                n: TenantPolicy(
                    weight=t["weight"], quota=lim(t["quota"]), per_key=lim(t["per_key"])
                )
                for n, t in data.get("tenants", {}).items()
            },
            lease_s=float(data.get("lease_s", 3600.0)),
            queue_timeout_s=float(data.get("queue_timeout_s", 600.0)),
        )


_NO_POLICY = TenantPolicy()
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


class TenantGuard:
    """Quota + admission for every model request of one gateway."""

    def __init__(
        self,
        config: GuardConfig,
        store: QuotaStore | None = None,
        *,
        on_rejection: RejectionHook | None = None,
        running_replicas: RunningReplicas | None = None,
    ) -> None:
        """``on_rejection``: where refusals are counted (the gateway's metrics);
        ``running_replicas``: the fleet view that sizes autoscaled models' gates (the
        gateway's probes). Both are given here, by whoever owns them: the guard never
        reaches back into the gateway."""
        if config.quotas and store is None:
            raise ValueError("tenants have quotas but no quota store was given")
        self.config = config
        self.store = store
        self.on_rejection = on_rejection
        self.running_replicas = running_replicas
        weights = {n: t.weight for n, t in config.tenants.items()}
        self.gates = {
            name: ModelGate(name, GateLimits(p.capacity, p.queue_limit), weights)
            for name, p in config.models.items()
        }
        self._tasks: set[asyncio.Task[None]] = set()

    def _scopes(
        self, tenant: str | None, policy: TenantPolicy, request: Request
    ) -> tuple[str, ...]:
        if tenant is None:
            return ()
        scopes: list[str] = []
        if policy.quota is not None:
            scopes.append(TENANT_SCOPE.format(tenant))
        if policy.per_key is not None:
            token = request.headers.get("authorization", "").partition(" ")[2].strip()
            scopes.append(KEY_SCOPE.format(tenant, digest(token)[:KEY_ID_HEX]))
        return tuple(scopes)

    def _reject(self, model: str, tenant: str | None, reason: str) -> None:
        if self.on_rejection is not None:
            self.on_rejection(model, tenant, reason)

    async def run(
        self,
        request: Request,
        *,
        tenant: str | None,
        model: str,
        payload: Mapping[str, Any],
        body: bytes,
        serve: ServeFn,
    ) -> Response:
        """Admit (429/503 when not), serve, and settle one model request."""
        policy = self.config.tenants.get(tenant or "", _NO_POLICY)
        path = request.url.path
        mp = self.config.models[model]
        generates = path in GENERATING
        tokens = 0
        if generates or path in PROMPT_ONLY:
            tokens = reserve_tokens(
                body_bytes=len(body),
                max_tokens=_int_or_none(
                    payload.get("max_completion_tokens") or payload.get("max_tokens")
                ),
                n=_int_or_none(payload.get("n")) or 1,
                max_model_len=mp.max_model_len,
                generates=generates,
            )
        scopes = self._scopes(tenant, policy, request)
        decision: Decision | None = None
        if scopes and self.store is not None:
            decision = await self.store.admit(scopes, tokens)
            if decision.refusal is not None:
                self._reject(model, tenant, "quota")
                return rate_limited(decision)
        settle = _Settlement(self, decision, model, tenant or "", tokens)
        self._follow_replicas(model, mp)
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                await self.gates[model].acquire(tenant or "", tokens)
        except (ModelBusyError, TimeoutError) as e:
            settle.refund()
            self._reject(model, tenant, "overload")
            message = (
                e.message
                if isinstance(e, ModelBusyError)
                else f"model '{model}' is overloaded: the request waited "
                f"{self.config.queue_timeout_s:g} s for a free slot; retry later"
            )
            return settle.decorate(
                error_response(503, message, "ServiceUnavailableError", retry_after=RETRY_AFTER_S)
            )
        except BaseException:
            settle.refund()
            raise
        settle.holds_slot = True
        inject = (
            generates
            and policy.counts_tokens
            and payload.get("stream") is True
            and "stream_options" not in payload
        )
        if inject:
            body = _with_include_usage(body)
        try:
            response = await serve(request, model, tenant, body)
        except BaseException:
            settle.finish(used=None, served=True)
            raise
        return settle.wrap(response, strip_usage=inject)

    def _follow_replicas(self, model: str, policy: ModelPolicy) -> None:
        """An autoscaled model's gate admits what its running replicas can take."""
        if policy.per_replica is None or self.running_replicas is None:
            return
        running = self.running_replicas(model)
        if running is not None:
            capacity = min(policy.capacity, max(1, running) * policy.per_replica)
            self.gates[model].set_capacity(capacity)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Settlement:
    """One admitted request's obligations: free the slot and settle, exactly once."""

    def __init__(
        self,
        guard: TenantGuard,
        decision: Decision | None,
        model: str,
        tenant: str,
        tokens: int,
    ) -> None:
        self.guard = guard
        self.decision = decision
        self.model = model
        self.tenant = tenant
        self.tokens = tokens
        self.holds_slot = False
        self.done = False

    def decorate(self, response: Response) -> Response:
        if self.decision is not None:
            for key, value in self.decision.headers.items():
                response.headers[key] = value
        return response

    def refund(self) -> None:
        """Not served (server overload): give back the reservation and the request."""
        self.finish(used=0, served=False)

    def finish(self, *, used: int | None, served: bool) -> None:
        if self.done:
            return
        self.done = True
        if self.holds_slot:
            self.guard.gates[self.model].release(self.tenant, self.tokens, used)
        rid = self.decision.reservation if self.decision is not None else None
        store = self.guard.store
        if rid is not None and store is not None:
            self.guard._spawn(store.settle(rid, used, served))

    def wrap(self, response: Response, *, strip_usage: bool) -> Response:
        self.decorate(response)
        if isinstance(response, StreamingResponse):
            tap = _StreamTap(strip_usage)
            if response.status_code < 400:
                response.body_iterator = tap.relay(response.body_iterator)
            return _Settled(response, lambda: self._after_stream(response.status_code, tap))
        return _Settled(response, lambda: self._after_body(response))

    def _after_body(self, response: Response) -> None:
        if not self._after_error(response.status_code):
            usage = usage_from_body(bytes(response.body))
            self.finish(used=_total(usage), served=True)

    def _after_stream(self, status: int, tap: _StreamTap) -> None:
        if not self._after_error(status):
            self.finish(used=_total(tap.scanner.usage) if tap.complete else None, served=True)

    def _after_error(self, status: int) -> bool:
        """Settle an error response; False when ``status`` is not an error.

        503: never served (overload, no replica, draining) - refunded. Other 4xx: refused
        by the engine's validation before generating - no tokens. Other 5xx (504 timeout,
        500): the engine may have generated - the reservation stays."""
        if status < 400:
            return False
        if status == 503:
            self.finish(used=0, served=False)
        elif status < 500:
            self.finish(used=0, served=True)
        else:
            self.finish(used=None, served=True)
        return True


class _Settled(Response):
    """A response that runs a callback when it has been sent (or its client left)."""

    def __init__(self, inner: Response, done: Callable[[], None]) -> None:
        # No super().__init__: the inner response owns body, status and headers.
        self.inner = inner
        self.status_code = inner.status_code
        self.background = None
        self._done = done

    @property
    def headers(self) -> Any:
        return self.inner.headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self._done()
            if self.background is not None:
                await self.background()


class _StreamTap:
    """Reads the usage of a relayed SSE stream; cuts out the usage event we asked for."""

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.scanner = UsageScanner()
        self.complete = False

    async def relay(self, chunks: AsyncIterable[Any]) -> AsyncIterator[Any]:
        try:
            async for chunk in chunks:
                if isinstance(chunk, bytes) and b'"usage"' in chunk:
                    self.scanner.feed(chunk)
                    kept = _strip_usage_event(chunk) if self.strip else chunk
                    if kept:
                        yield kept
                    continue
                yield chunk
            self.complete = True
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()  # the relay's own cleanup runs now, not at GC


def _strip_usage_event(chunk: bytes) -> bytes:
    """``chunk`` without its usage-only SSE event (``choices`` empty, ``usage`` set)."""
    out: list[bytes] = []
    for event in chunk.split(b"\n\n"):
        if b'"usage"' in event and event.startswith(b"data:"):
            try:
                obj = json.loads(event[5:])
            except ValueError:
                obj = None
            if isinstance(obj, dict) and obj.get("choices") == [] and obj.get("usage"):
                continue
        out.append(event)
    return b"\n\n".join(out)


def _with_include_usage(body: bytes) -> bytes:
    """The JSON object ``body`` with ``stream_options.include_usage`` first (no re-encode)."""
    brace = body.find(b"{")
    return body[: brace + 1] + _INCLUDE_USAGE + body[brace + 1 :]


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _total(usage: Any) -> int | None:
    if usage is None:
        return None
    return int(usage.prompt_tokens) + int(usage.completion_tokens)


def rate_limited(decision: Decision) -> Response:
    """429 in OpenAI's shape, with ``Retry-After`` and the ``x-ratelimit-*`` headers."""
    refusal = decision.refusal
    assert refusal is not None
    body = {
        "error": {
            "message": refusal.message,
            "type": "rate_limit_exceeded",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    headers = dict(decision.headers.items())
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(refusal.retry_after_s)))
    return Response(
        json.dumps(body), status_code=429, media_type="application/json", headers=headers
    )


__all__ = [
    "GuardConfig",
    "ModelPolicy",
    "RateLimitHeaders",
    "RejectionHook",
    "TenantGuard",
    "TenantPolicy",
    "rate_limited",
]
