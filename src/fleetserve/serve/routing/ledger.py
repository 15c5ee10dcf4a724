"""What a model replica reports to the routers about its own prefix cache and load.

Design note. The replica hashes the prompt of every request it serves (same
:func:`~fleetserve.serve.routing.prefix.request_blocks` as the routers) into an LRU bounded
by its KV cache's capacity, expressed in prompt blocks. Ray Serve pulls
``record_routing_stats`` from each replica every ``stats_period_s`` and hands the result
to every router of the deployment (``RunningReplica.routing_stats``): no router ever
calls a replica on the request path, a router that restarts rebuilds its view from the
next reports, and a replica that restarts reports an empty cache under its new id.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from fleetserve.engine.protocol import EngineRequest, EngineStats
from fleetserve.serve.routing.index import DEFAULT_CAPACITY_BLOCKS
from fleetserve.serve.routing.prefix import request_blocks

#: Most block hashes one report carries (the newest; bounds the broadcast size).
REPORT_MAX_BLOCKS = 4096
#: Characters per token assumed when converting the engine's KV capacity into blocks.
CHARS_PER_TOKEN = 4


class CacheLedger:
    """The prompt blocks one replica has served recently (an LRU)."""

    def __init__(self, block_chars: int, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        self.block_chars = block_chars
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.served = 0

    def observe(self, request: EngineRequest) -> None:
        """Record one request's prompt blocks (called when the replica takes it)."""
        self.served += 1
        for h in request_blocks(request.body, self.block_chars):
            if h in self._lru:
                self._lru.move_to_end(h)
            else:
                self._lru[h] = None
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def set_kv_capacity_tokens(self, tokens: int) -> None:
        """Bound the ledger by the engine's KV cache (tokens) once it is known."""
        blocks = max(1, tokens * CHARS_PER_TOKEN // self.block_chars)
        self.capacity = min(blocks, REPORT_MAX_BLOCKS)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def report(self, stats: EngineStats, signals: Mapping[str, float]) -> dict[str, Any]:
        """The routing stats dict (JSON-able) Ray Serve hands to the routers."""
        blocks = list(self._lru)[-REPORT_MAX_BLOCKS:]
        out: dict[str, Any] = {
            "blocks": blocks,
            "capacity_blocks": self.capacity,
            "served": self.served,
            "running": stats.running,
            "in_flight": stats.in_flight,
        }
        out.update(signals)
        return out
