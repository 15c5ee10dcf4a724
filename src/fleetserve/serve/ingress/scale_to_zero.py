"""Hold a request while its model scales up from zero replicas, for a bounded time.

Design note. With ``replicas.min: 0`` Ray Serve keeps a request for a model without
replicas queued in the ingress's handle; the handle reports it, and Serve's autoscaler
starts a replica at once (its cold-start path). Serve would wait forever, though, so
:class:`ColdStartClient` wraps the ingress's :class:`ModelClient`: it opens the stream
(queuing the request, which is what triggers the scale-up) and, while the model's router
still sees no replica (``routing.registry``, no remote call), waits at most
``cold_start_timeout_s`` for the response head. Past that the caller gets
``ModelUnavailableError`` -> 503 with ``Retry-After``. Once a replica exists the wait is
no longer bounded here: a long non-streamed generation is not a cold start.

What must stay true: a request that timed out still wakes the model. Serve's handle
samples its queue every second or so and reports the samples (not the live count), so a
request queued for less than a sampling interval is never seen, and a model whose
``cold_start_timeout_s`` is short would never start, however often clients retry. So the
first timed-out request of a model is not cancelled at once: it stays queued in the
background (the *waker*, at most one per model, not counted against any tenant) until the
router sees a replica - the autoscaler has counted it and started one - or ``WAKE_HOLD_S``
passes; then it is cancelled (a replica that took it aborts it). Leaving earlier would let
the autoscaler see an empty queue and stop the replica it is starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.serve.ingress.model_client import ModelClient, ModelUnavailableError
from fleetserve.serve.ingress.probes import HealthSource, ModelHealth
from fleetserve.serve.routing import registry

#: How often the wait checks whether a replica has appeared.
POLL_S = 0.1
#: The longest a timed-out request stays queued to wake its model: long enough for a
#: large model's replica to be placed and loaded, bounded so that a model that can never
#: start (no node fits it) is not asked for forever by one request.
WAKE_HOLD_S = 900.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColdStart:
    """A model that may have no replica: its deployment and how long a request waits."""

    deployment: str
    timeout_s: float


class ColdStartClient:
    """A :class:`ModelClient` that bounds the wait for a model scaled to zero."""

    def __init__(
        self,
        inner: ModelClient,
        models: Mapping[str, ColdStart],
        replicas: Callable[[str], int | None] = registry.replicas,
        wake_hold_s: float = WAKE_HOLD_S,
    ) -> None:
        self._inner = inner
        self._models = dict(models)
        self._replicas = replicas
        self._wake_hold_s = wake_hold_s
        # model -> its waker; the strong reference keeps the task alive.
        self._wakers: dict[str, asyncio.Task[None]] = {}

    def scaled_to_zero(self, model: str) -> bool:
        """The model may scale to zero and its router sees no replica now."""
        cold = self._models.get(model)
        return cold is not None and not self._replicas(cold.deployment)

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        cold = self._models.get(model)
        if cold is None:
            return self._inner.open(model, request)
        return self._open_cold(model, cold, request)

    async def _open_cold(
        self, model: str, cold: ColdStart, request: EngineRequest
    ) -> AsyncIterator[ResponseHead | bytes]:
        stream = self._inner.open(model, request)
        first = asyncio.ensure_future(anext(stream))
        woken = False  # the waker owns the queued request now
        try:
            # Once a replica is up the request is no longer waiting for one: no bound.
            if not await self._head_or_replica(first, cold.deployment, cold.timeout_s):
                woken = self._hold_to_wake(model, cold, first, stream)
                raise ModelUnavailableError(
                    f"model '{model}' is scaled to zero and no replica started within "
                    f"{cold.timeout_s:g} s; retry later"
                )
            head = await first
        except BaseException:
            if not woken:
                await _cancel(first, stream)
            raise
        try:
            yield head
            async for item in stream:
                yield item
        finally:
            # Closing early (client gone) must reach the inner stream's cleanup now.
            await stream.aclose()  # type: ignore[attr-defined]

    def _hold_to_wake(
        self,
        model: str,
        cold: ColdStart,
        first: asyncio.Future[ResponseHead | bytes],
        stream: AsyncIterator[ResponseHead | bytes],
    ) -> bool:
        """Keep a timed-out request queued as the model's waker; False if one is running."""
        waker = self._wakers.get(model)
        if waker is not None and not waker.done():
            return False
        task = asyncio.create_task(self._wake(model, cold, first, stream))
        self._wakers[model] = task
        task.add_done_callback(lambda t: self._forget_waker(model, t))
        return True

    def _forget_waker(self, model: str, task: asyncio.Task[None]) -> None:
        if self._wakers.get(model) is task:  # not a newer waker that replaced it
            del self._wakers[model]

    async def _wake(
        self,
        model: str,
        cold: ColdStart,
        first: asyncio.Future[ResponseHead | bytes],
        stream: AsyncIterator[ResponseHead | bytes],
    ) -> None:
        try:
            if not await self._head_or_replica(first, cold.deployment, self._wake_hold_s):
                log.warning(
                    "model '%s' got no replica within %g s of a request waking it",
                    model,
                    self._wake_hold_s,
                )
        finally:
            await _cancel(first, stream)

    async def _head_or_replica(
        self, first: asyncio.Future[ResponseHead | bytes], deployment: str, timeout_s: float
    ) -> bool:
        """Wait until the response head came or the router sees a replica; False when
        ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not first.done() and not self._replicas(deployment):
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.wait({first}, timeout=min(POLL_S, left))
        return True

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        return await self._inner.stats(model, timeout_s)

    async def health(self) -> dict[str, ModelHealth]:
        """The inner client's fleet view (the probes' source), unchanged."""
        source: HealthSource = self._inner  # type: ignore[assignment]
        return await source.health()


async def _cancel(
    first: asyncio.Future[ResponseHead | bytes], stream: AsyncIterator[ResponseHead | bytes]
) -> None:
    """Take a request out of the handle's queue, or abort it where it went."""
    first.cancel()
    with contextlib.suppress(BaseException):
        await first
    with contextlib.suppress(BaseException):
        await stream.aclose()  # type: ignore[attr-defined]
