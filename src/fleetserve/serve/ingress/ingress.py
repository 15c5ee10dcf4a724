"""The Ray Serve ingress deployment: the HTTP front of the fleet.

Holds a :class:`~fleetserve.serve.ingress.gateway.Gateway` over the models' deployment handles and
serves its FastAPI app (built at replica start by ``__serve_build_asgi_app__``, so routes
close over this replica's gateway). ``begin_drain`` / ``in_flight`` are the lifecycle
hooks ``fleetserve serve`` calls on SIGTERM.
"""

from __future__ import annotations

import socket
from typing import Any

from fastapi import FastAPI
from ray import serve

from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.serve.guard.quota_guard import GuardConfig
from fleetserve.serve.guard.quota_store import HandleQuotaStore
from fleetserve.serve.ingress.gateway import Gateway, ModelRoute, create_api
from fleetserve.serve.ingress.limits import RequestLimits, install_http_guard
from fleetserve.serve.ingress.metrics import RayMetricsSink
from fleetserve.serve.ingress.model_client import HandleModelClient, StreamRelay
from fleetserve.serve.ingress.scale_to_zero import ColdStart, ColdStartClient


def install_address_reuse() -> bool:
    """Make Serve's direct-ingress HTTP socket in this process bind with ``SO_REUSEADDR``.

    Why: Ray 2.60 binds that socket without it, so while the connections of a killed
    ingress replica linger in TIME_WAIT (any replica killed with clients connected) its
    replacement's bind fails with EADDRINUSE; Serve then *blocks* the port for good and,
    the range being the one port ``server.port``, every later replacement fails with
    ``NoAvailablePortError``: the ingress never came back. ``SO_REUSEADDR`` (what uvicorn
    and asyncio set on their own sockets) still refuses a port another socket listens
    on; ``SO_REUSEPORT`` (Serve's other option) would not, so it is not used. Returns
    False when Serve's module no longer looks as expected (nothing changed).
    """
    from ray.serve._private import http_util  # noqa: PLC0415 - Ray only where Ray runs

    current = getattr(http_util, "socket", None)
    if isinstance(current, _ReusingSocketModule):
        return True
    if current is not socket:
        return False
    http_util.socket = _ReusingSocketModule()  # type: ignore[attr-defined,assignment]
    return True


class _ReusingSocketModule:
    """The ``socket`` module as Serve's ``http_util`` sees it: new sockets reuse addresses."""

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)

    @staticmethod
    def socket(*args: Any, **kwargs: Any) -> socket.socket:
        sock = socket.socket(*args, **kwargs)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return sock


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
        stream_relay: StreamRelay = "multiplexed",
        stream_handoff: bool = True,
    ) -> None:
        self.limits = RequestLimits.from_args(limits)
        # Before Serve starts this replica's HTTP server (direct ingress): header limits
        # and the header timeout at the protocol level (serve/ingress/limits.py), and a listening
        # socket that can take over the port of a killed predecessor.
        install_http_guard(self.limits)
        install_address_reuse()
        # Models with replicas.min 0: a request waits (bounded) for their first replica.
        models = HandleModelClient(handles, relay=stream_relay, handoff=stream_handoff)
        self._models = models
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
            guard=GuardConfig.from_args(guard) if guard is not None else None,
            quota_store=HandleQuotaStore(quota) if quota is not None else None,
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

    def __del__(self) -> None:
        # Serve calls this when the replica shuts down: stop the relay's listeners.
        models = getattr(self, "_models", None)  # absent when __init__ failed
        if models is not None:
            models.close()
