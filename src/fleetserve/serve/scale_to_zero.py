"""Hold a request while its model scales up from zero replicas, for a bounded time.

Design note. With ``replicas.min: 0`` Ray Serve keeps a request for a model without
replicas queued in the ingress's handle; the handle reports it, and Serve's autoscaler
starts a replica at once (its cold-start path). Serve would wait forever, though, so
:class:`ColdStartClient` wraps the ingress's :class:`ModelClient`: it opens the stream
(queuing the request, which is what triggers the scale-up) and, while the model's router
still sees no replica (``routing.registry``, no remote call), waits at most
``cold_start_timeout_s`` for the response head. Past that the stream is cancelled (the
queued request leaves the handle) and the caller gets ``ModelUnavailableError`` -> 503
with ``Retry-After``. Once a replica exists the wait is no longer bounded here: a long
non-streamed generation is not a cold start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.serve.model_client import ModelClient, ModelUnavailableError
from fleetserve.serve.probes import HealthSource, ModelHealth
from fleetserve.serve.routing import registry

#: How often the wait checks whether a replica has appeared.
POLL_S = 0.1


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
    ) -> None:
        self._inner = inner
        self._models = dict(models)
        self._replicas = replicas

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
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + cold.timeout_s
            while not first.done():
                if self._replicas(cold.deployment):
                    break  # a replica is up: the request is no longer waiting for one
                left = deadline - loop.time()
                if left <= 0:
                    raise ModelUnavailableError(
                        f"model '{model}' is scaled to zero and no replica started within "
                        f"{cold.timeout_s:g} s; retry later"
                    )
                await asyncio.wait({first}, timeout=min(POLL_S, left))
            head = await first
        except BaseException:
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            with contextlib.suppress(BaseException):
                await stream.aclose()  # type: ignore[attr-defined]
            raise
        try:
            yield head
            async for item in stream:
                yield item
        finally:
            # Closing early (client gone) must reach the inner stream's cleanup now.
            await stream.aclose()  # type: ignore[attr-defined]

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        return await self._inner.stats(model, timeout_s)

    async def health(self) -> dict[str, ModelHealth]:
        """The inner client's fleet view (the probes' source), unchanged."""
        source: HealthSource = self._inner  # type: ignore[assignment]
        return await source.health()
