"""What a model replica reports to the routers about its own prefix cache and load.

Design note. The replica hashes the prompt of every request it serves (same
:func:`~fleetserve.serve.routing.prefix.request_blocks` as the routers) into an LRU bounded
by its KV cache's capacity, expressed in prompt blocks. Ray Serve pulls
``record_routing_stats`` from each replica every ``stats_period_s`` and hands the result
to every router of the deployment (``RunningReplica.routing_stats``): no router ever
calls a replica on the request path, a router that restarts rebuilds its view from the
next reports, and a replica that restarts reports an empty cache under its new id.

It also keeps the model ids it served most recently (``models``, oldest first): for a LoRA
adapter that is the adapter vLLM loaded on this replica (routers prefer replicas that hold
the adapter a request names; they know which id is the base model).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from fleetserve.engine.protocol import EngineRequest, EngineStats
from fleetserve.serve.routing.index import DEFAULT_CAPACITY_BLOCKS
from fleetserve.serve.routing.prefix import request_key

#: Most block hashes one report carries (the newest; bounds the broadcast size).
REPORT_MAX_BLOCKS = 4096
#: Most model ids (base and adapters) a report carries, most recently served last.
REPORT_MAX_MODELS = 256
#: Characters per token assumed when converting the engine's KV capacity into blocks.
CHARS_PER_TOKEN = 4


class CacheLedger:
    """The prompt blocks one replica has served recently (an LRU)."""

    def __init__(self, block_chars: int, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        self.block_chars = block_chars
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._models: OrderedDict[str, None] = OrderedDict()
        self.served = 0

    def observe(self, request: EngineRequest) -> None:
        """Record one request's prompt blocks (called when the replica takes it)."""
        self.served += 1
        key = request_key(request.body, self.block_chars)
        for h in key.blocks:
            if h in self._lru:
                self._lru.move_to_end(h)
            else:
                self._lru[h] = None
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)
        if key.model is not None:
            self._models[key.model] = None
            self._models.move_to_end(key.model)
            if len(self._models) > REPORT_MAX_MODELS:
                self._models.popitem(last=False)

    def set_kv_capacity_tokens(self, tokens: int) -> None:
        """Bound the ledger by the engine's KV cache (tokens) once it is known."""
        blocks = max(1, tokens * CHARS_PER_TOKEN // self.block_chars)
        self.capacity = min(blocks, REPORT_MAX_BLOCKS)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def report(
        self,
        stats: EngineStats,
        signals: Mapping[str, float],
        adapters: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The routing stats dict (JSON-able) Ray Serve hands to the routers.

        ``adapters``: the LoRA adapters the engine holds now (``Engine.adapters()``), when
        the replica asks the engine; routers then trust it over the served ``models``.
        """
        blocks = list(self._lru)[-REPORT_MAX_BLOCKS:]
        out: dict[str, Any] = {
            "blocks": blocks,
            "models": list(self._models),
            "capacity_blocks": self.capacity,
            "served": self.served,
            "running": stats.running,
            "in_flight": stats.in_flight,
        }
        if adapters is not None:
            out["adapters"] = list(adapters)
        out.update(signals)
        return out
