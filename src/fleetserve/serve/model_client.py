"""How the ingress reaches a model's replicas: a Protocol with a Ray and a local version.

``HandleModelClient`` streams through Ray Serve ``DeploymentHandle``s (the real path);
``LocalModelClient`` calls engines in this process (unit tests of routing, auth and
errors without Ray). Both map transport failures to the two errors the ingress turns into
HTTP: :class:`ModelOverloadedError` (503 + Retry-After) and
:class:`ModelUnavailableError` (503 + Retry-After).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from fleetserve.engine.protocol import Engine, EngineRequest, EngineStats, ResponseHead
from fleetserve.errors import ServeError


class ModelOverloadedError(ServeError):
    """Every replica of the model is at max_ongoing_requests and the queue is full."""


class ModelUnavailableError(ServeError):
    """No replica of the model can take the request (starting, dead, or shut down)."""


class ModelClient(Protocol):
    """Opens streams to a model and reads replica stats."""

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Stream the model's response: a ResponseHead, then bytes."""

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        """One replica's engine stats (ModelUnavailableError when none answers)."""


class LocalModelClient:
    """Engines in this process, by model name (for tests and single-process tools)."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self._engines = dict(engines)

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        return self._engines[model].handle(request)

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        return self._engines[model].stats()


class HandleModelClient:
    """Ray Serve deployment handles, by model name."""

    def __init__(self, handles: Mapping[str, Any]) -> None:
        # Streaming handles are made once: ``.options()`` per request costs a copy.
        self._streams = {
            name: h.options(stream=True, _by_reference=False) for name, h in handles.items()
        }
        self._handles = dict(handles)

    async def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        from ray.serve.exceptions import (  # noqa: PLC0415 - Ray only where Ray runs
            BackPressureError,
            DeploymentUnavailableError,
        )

        gen = self._streams[model].handle.remote(request)
        finished = False
        try:
            try:
                first = await gen.__anext__()
            except BackPressureError as e:
                raise ModelOverloadedError(
                    f"model '{model}' is overloaded: every replica is busy and its queue "
                    "is full; retry later"
                ) from e
            except DeploymentUnavailableError as e:
                raise ModelUnavailableError(f"model '{model}' is unavailable: {e}") from e
            except StopAsyncIteration as e:
                raise ModelUnavailableError(f"model '{model}' returned no response") from e
            except Exception as e:
                if _is_replica_gone(e):
                    raise ModelUnavailableError(
                        f"model '{model}': its replica stopped; retry later"
                    ) from e
                raise
            yield first
            async for item in gen:
                yield item
            finished = True
        finally:
            if not finished:
                # Client gone or error: make sure the replica stops generating.
                gen.cancel()

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        try:
            data = await asyncio.wait_for(self._handles[model].stats.remote(), timeout_s)
        except Exception as e:
            raise ModelUnavailableError(f"model '{model}': no replica answered: {e}") from e
        return EngineStats(**data)


def _is_replica_gone(error: BaseException) -> bool:
    name = type(error).__name__
    return name in {"ActorDiedError", "ActorUnavailableError", "RayActorError"}
