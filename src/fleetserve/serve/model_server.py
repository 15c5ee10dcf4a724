"""The Ray Serve deployment of one model: a replica owns one engine.

Replicas are started by Serve with the engine's config as a plain dict (it travels in a
Serve config); ``handle`` streams the engine's response items back to the ingress over a
streaming ``DeploymentHandle`` call. Serve's health check calls ``check_health``; a dead
vLLM engine makes the replica unhealthy and Serve replaces it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.factory import create_engine
from fleetserve.engine.protocol import EngineRequest, ResponseHead


@serve.deployment(
    health_check_period_s=10,
    health_check_timeout_s=60,
    graceful_shutdown_wait_loop_s=1,
)
class ModelServer:
    """One replica of one model."""

    # Ray Serve awaits an async constructor; the engine loads before the replica is ready.
    async def __init__(self, engine: dict[str, Any]) -> None:  # type: ignore[misc]
        self._config = EngineConfig.model_validate(engine)
        self._engine = create_engine(self._config)
        await self._engine.start()

    async def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Stream one request's response (head first)."""
        async for item in self._engine.handle(request):
            yield item

    async def check_health(self) -> None:
        await self._engine.check_health()

    def stats(self) -> dict[str, Any]:
        """This replica's engine stats (see :class:`EngineStats`)."""
        return dataclasses.asdict(self._engine.stats())

    async def __del__(self) -> None:
        await self._engine.shutdown()
