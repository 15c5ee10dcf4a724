"""What a model replica reports to the routers about its own prefix cache and load.

Design note. The replica hashes the prompt of every request it serves (same
:func:`~fleetserve.serve.routing.prefix.request_blocks` as the routers) into an LRU bounded
by its KV cache's capacity, expressed in prompt blocks. Ray Serve pulls
``record_routing_stats`` from each replica every ``stats_period_s`` and hands the result
to every router of the deployment (``RunningReplica.routing_stats``): no router ever
calls a replica on the request path, a router that restarts rebuilds its view from the
next reports, and a replica that restarts reports an empty cache under its new id.

The bound is the engine's cache as a router should see it: vLLM's token count
(``kv_capacity_tokens``, every layer full) times the model's cache span - on a model with
sliding-window layers a cached conversation keeps only its last window there, so the cache
holds several times its token count of long prompts (:func:`fleetserve.plan.memory.cache_span`;
Gemma 3 about 2.7x at 4k tokens) - capped by :data:`LEDGER_MAX_BLOCKS`. A prompt's blocks
enter last first, so a bound that binds drops conversations' tails, as vLLM evicts them,
not their heads. A report carries the newest :data:`REPORT_MAX_BLOCKS` blocks (the
broadcast stays small on big caches) and says whether that is all of them (``complete``);
a router then replaces its view with it, else refreshes those blocks in its own view,
which its routing decisions keep (index.py).

It also keeps the model ids it served most recently (``models``, oldest first): for a LoRA
adapter that is the adapter vLLM loaded on this replica (routers prefer replicas that hold
the adapter a request names; they know which id is the base model).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from fleetserve.engine.protocol import EngineRequest, EngineStats
from fleetserve.engine.signals import ENGINE_DOWN
from fleetserve.errors import FleetServeError
from fleetserve.plan.architecture import load_model_config
from fleetserve.plan.memory import cache_span
from fleetserve.serve.routing.index import DEFAULT_CAPACITY_BLOCKS
from fleetserve.serve.routing.prefix import request_key

logger = logging.getLogger(__name__)

#: Most block hashes one report carries (the newest; bounds the broadcast size).
REPORT_MAX_BLOCKS = 4096
#: Most blocks a ledger (and a router's view of one replica) keeps: about 2M prompt
#: characters, ~500k tokens of conversations; a router's view of a full one takes ~13 MB.
LEDGER_MAX_BLOCKS = 32768
#: Most model ids (base and adapters) a report carries, most recently served last.
REPORT_MAX_MODELS = 256
#: Characters per token assumed when converting the engine's KV capacity into blocks.
CHARS_PER_TOKEN = 4


class CacheLedger:
    """The prompt blocks one replica has served recently (an LRU)."""

    def __init__(
        self,
        block_chars: int,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        span: float = 1.0,
    ) -> None:
        """``span``: prompt tokens one token of the engine's KV capacity holds
        (:func:`model_cache_span`)."""
        self.block_chars = block_chars
        self.capacity = capacity_blocks
        self.span = span
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._models: OrderedDict[str, None] = OrderedDict()
        self.served = 0

    def observe(self, request: EngineRequest) -> None:
        """Record one request's prompt blocks (called when the replica takes it)."""
        self.served += 1
        key = request_key(request.body, self.block_chars)
        # Last block first, so the prompt's head is the most recent and its tail leaves the
        # LRU first, as vLLM frees a request's blocks tail first: a bound that binds cuts
        # conversations short, never off at their head (the rest unmatchable).
        for h in reversed(key.blocks):
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
        blocks = max(1, int(tokens * self.span * CHARS_PER_TOKEN) // self.block_chars)
        self.capacity = min(blocks, LEDGER_MAX_BLOCKS)
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
            "complete": len(blocks) == len(self._lru),
            "models": list(self._models),
            "capacity_blocks": self.capacity,
            "served": self.served,
            "running": stats.running,
            "in_flight": stats.in_flight,
            ENGINE_DOWN: not stats.alive,
        }
        if adapters is not None:
            out["adapters"] = list(adapters)
        out.update(signals)
        return out


def model_cache_span(model_path: str, max_model_len: int) -> float:
    """The ledger's span for a replica of ``model_path`` (conversations up to
    ``max_model_len`` tokens); 1.0 when its config cannot be read (the fake engine, a repo id
    outside the catalogue): the view is then smaller than the cache, never larger."""
    try:
        return cache_span(load_model_config(model_path), max_model_len)
    except (FleetServeError, OSError, ValueError) as exc:
        logger.debug("no cache span for %s: %s", model_path, exc)
        return 1.0
