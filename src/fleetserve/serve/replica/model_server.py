"""The Ray Serve deployment of one model: a replica owns one engine.

Replicas are started by Serve with the engine's config as a plain dict (it travels in a
Serve config). ``handle_relayed`` runs one request and sends the engine's response items to
the ingress over the stream relay (``serve/replica/relay.py``, the default), or, for an
engine with a server of its own (``frontend: process``) and an ingress on this node, hands
the stream to the ingress to read from that server; ``handle`` streams them
back over a streaming ``DeploymentHandle`` call (``server.stream_relay: serve``). Serve's
health check calls ``check_health``; a dead vLLM engine makes the replica unhealthy and
Serve replaces it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.factory import create_engine
from fleetserve.engine.protocol import Engine, EngineRequest, HandoffEngine, ResponseHead
from fleetserve.engine.signals import KV_CAPACITY_TOKENS, engine_signals
from fleetserve.serve.replica.relay import (
    RelaySender,
    RelayTicket,
    relay_handoff,
    relay_stream,
)
from fleetserve.serve.routing.ledger import CacheLedger, model_cache_span


@serve.deployment(
    health_check_period_s=10,
    health_check_timeout_s=60,
    graceful_shutdown_wait_loop_s=1,
)
class ModelServer:
    """One replica of one model."""

    # Ray Serve awaits an async constructor; the engine loads before the replica is ready.
    async def __init__(self, engine: dict[str, Any], block_chars: int) -> None:  # type: ignore[misc]
        self._config = EngineConfig.model_validate(engine)
        self._engine = create_engine(self._config)
        # The prompt blocks this replica served, reported to the routers (routing.ledger).
        self._ledger = CacheLedger(
            block_chars,
            span=model_cache_span(self._config.model_path, self._config.settings.max_model_len),
        )
        # Connections to the ingresses' stream relays, made on their first stream.
        self._relay = RelaySender(ray.get_runtime_context().get_node_id())
        await self._engine.start()

    async def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Stream one request's response (head first)."""
        self._ledger.observe(request)
        async for item in self._engine.handle(request):
            yield item

    async def handle_relayed(
        self, request: EngineRequest, ticket: RelayTicket
    ) -> AsyncIterator[int]:
        """Run one request and send its response over the ingress's stream relay.

        The call lasts as long as the stream (Serve counts it as ongoing and cancels it when
        the ingress does; cancelling closes the engine's stream, which aborts the request).
        Its one item, at the end, is the relay connection's id: the END frame is queued on
        it by then. A streaming call, not a unary one, although it carries one item: over
        gRPC, Serve's router learns that a unary call was accepted only when it has ended,
        so its routed hook (our routers' load and affinity bookkeeping) would come after
        the request's completion; a streaming call is confirmed before the first item.
        """
        self._ledger.observe(request)
        yield await answer_relayed(self._relay, ticket, self._engine, request)

    async def check_health(self) -> None:
        await self._engine.check_health()

    def stats(self) -> dict[str, Any]:
        """This replica's engine stats (see :class:`EngineStats`)."""
        return dataclasses.asdict(self._engine.stats())

    def _signals(self) -> tuple[Any, dict[str, float]]:
        stats = self._engine.stats()
        return stats, engine_signals(stats, self._config.settings.max_num_seqs)

    async def record_routing_stats(self) -> dict[str, Any]:
        """Pulled by Serve every ``routing.stats_period_s`` and handed to the routers."""
        stats, signals = self._signals()
        capacity = signals.get(KV_CAPACITY_TOKENS)
        if capacity:
            self._ledger.set_kv_capacity_tokens(int(capacity))
        # The LoRA adapters loaded now, so routers prefer a replica that needs no load.
        return self._ledger.report(stats, signals, await self._engine.adapters())

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Custom autoscaling metrics (fleetserve.serve.control.autoscaling reads them)."""
        stats, signals = self._signals()
        return {**signals, "running": float(stats.running)}

    async def __del__(self) -> None:
        self._relay.close()
        await self._engine.shutdown()


async def answer_relayed(
    relay: RelaySender, ticket: RelayTicket, engine: Engine, request: EngineRequest
) -> int:
    """One request answered over ``ticket``'s stream relay; returns the relay connection's
    id (the call's one item: see ModelServer.handle_relayed).

    An engine with a server of its own (``frontend: process``) hands the stream to an
    ingress on this node that asked for it: the ingress reads it from the server, and this
    call holds the request - Serve's slot, its ongoing count - until the ingress releases
    it. Anything else is relayed item by item from the engine.
    """
    if isinstance(engine, HandoffEngine) and relay.can_hand_off(ticket):
        socket_path = engine.handoff()  # refuses as handle() does: the call fails
        finished = False
        try:
            conn_id, finished = await relay_handoff(relay, ticket, socket_path)
        finally:
            engine.handed_back(finished)
        return conn_id
    return await relay_stream(relay, ticket, engine.handle(request))
