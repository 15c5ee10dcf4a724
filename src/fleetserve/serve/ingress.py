"""The Ray Serve ingress deployment: the HTTP front of the fleet.

Holds a :class:`~fleetserve.serve.gateway.Gateway` over the models' deployment handles and
serves its FastAPI app (built at replica start by ``__serve_build_asgi_app__``, so routes
close over this replica's gateway). ``begin_drain`` / ``in_flight`` are the lifecycle
hooks ``fleetserve serve`` calls on SIGTERM.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve

from fleetserve.serve.api_keys import ApiKeyTable
from fleetserve.serve.gateway import Gateway, ModelRoute, create_api
from fleetserve.serve.metrics import RayMetricsSink
from fleetserve.serve.model_client import HandleModelClient
from fleetserve.serve.scale_to_zero import ColdStart, ColdStartClient


@serve.deployment(graceful_shutdown_wait_loop_s=1)
@serve.ingress()
class Ingress:
    """Routes OpenAI requests by ``model`` to the model deployments."""

    def __init__(
        self,
        routes: list[dict[str, Any]],
        keys: dict[str, Any],
        handles: dict[str, Any],
        cold_starts: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        # Models with replicas.min 0: a request waits (bounded) for their first replica.
        client = ColdStartClient(
            HandleModelClient(handles),
            {m: ColdStart(**c) for m, c in (cold_starts or {}).items()},
        )
        self.gateway = Gateway(
            [ModelRoute(**r) for r in routes],
            ApiKeyTable.from_args(keys),
            client,
            metrics_sink=RayMetricsSink(),
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_api(self.gateway)

    def begin_drain(self) -> int:
        """Refuse new model requests (503); returns the requests still in flight."""
        self.gateway.draining = True
        return self.gateway.in_flight

    def in_flight(self) -> int:
        return self.gateway.in_flight
