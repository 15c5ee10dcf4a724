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
from fleetserve.serve.limits import RequestLimits, install_http_guard
from fleetserve.serve.metrics import RayMetricsSink
from fleetserve.serve.model_client import HandleModelClient
from fleetserve.serve.quota_guard import GuardConfig, TenantGuard
from fleetserve.serve.quota_store import HandleQuotaStore
from fleetserve.serve.scale_to_zero import ColdStart, ColdStartClient


@serve.deployment(graceful_shutdown_wait_loop_s=1)
@serve.ingress()
class Ingress:
    """Routes OpenAI requests by ``model`` to the model deployments."""

    def __init__(  # noqa: PLR0917 - Serve's bind() passes the arguments in order
        self,
        routes: list[dict[str, Any]],
        keys: dict[str, Any],
        handles: dict[str, Any],
        cold_starts: dict[str, dict[str, Any]] | None = None,
        guard: dict[str, Any] | None = None,
        quota: Any = None,
        *,
        limits: dict[str, Any] | None = None,
    ) -> None:
        self.limits = RequestLimits.from_args(limits)
        # Before Serve starts this replica's HTTP server (direct ingress): header limits
        # and the header timeout at the protocol level (serve/limits.py).
        install_http_guard(self.limits)
        # Models with replicas.min 0: a request waits (bounded) for their first replica.
        models = HandleModelClient(handles)
        client = ColdStartClient(
            models,
            {m: ColdStart(**c) for m, c in (cold_starts or {}).items()},
        )
        self.gateway = Gateway(
            [ModelRoute(**r) for r in routes],
            ApiKeyTable.from_args(keys),
            client,
            metrics_sink=RayMetricsSink(),
            limits=self.limits,
            health=models,
            # Quotas (the shared keeper's handle, when a tenant has one) + exact admission.
            quota_guard=(
                TenantGuard(
                    GuardConfig.from_args(guard),
                    HandleQuotaStore(quota) if quota is not None else None,
                )
                if guard is not None
                else None
            ),
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_api(self.gateway)

    def begin_drain(self) -> int:
        """Refuse new model requests (503); returns the requests still in flight."""
        self.gateway.draining = True
        return self.gateway.in_flight

    def in_flight(self) -> int:
        return self.gateway.in_flight

    async def end_requests(self) -> int:
        """Drain timeout: end every open request now with an error (an SSE error event
        for streams); returns how many were ended. Async: it must run on the loop that
        serves the requests (Serve runs sync methods in a thread)."""
        return self.gateway.deadlines.cut_all("drain")
