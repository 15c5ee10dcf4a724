"""The routing decision, as a pure function over replica views (no Ray).

Design note - one cost per replica and request, in prompt blocks (the unit of prefill work):

    cost = uncached blocks          (prefill this replica must compute: blocks - matched)
         + adapter_weight           (only if the request names a LoRA adapter this replica
                                     is not believed to hold: loading it costs)
         + load_weight x load       (queue: what each ongoing request there delays this one)

and the request goes to the cheapest replica. So a conversation moves off the replica that
holds its history only when that replica's queue costs more than re-prefilling the history
elsewhere - a 1k-token conversation (~64 blocks) needs a queue ~16 requests deeper at home
with the default weight; a short prompt with little to reuse simply goes where the queue is
shortest. Load is judged per request (a hot replica loses only the requests whose saved
prefill is worth less than its queue), never by a global switch.

Why not a hard bound on load (consistent hashing with bounded loads, ``load_factor``, the
default before): a bound moves a conversation whenever its replica is above ``load_factor`` x
the mean, however much history it holds, and the moved turn re-prefills all of it (the
comparison is in docs/benchmarks.md, "Request routing"). The bound is still available
(``load_factor``; ``None``: off) for operators who want a hard cap.

A replica at ``max_ongoing_requests`` is never first (Serve would reject it); it is still
ranked, last, so the request is not failed. Ties (equal cost, e.g. a new prompt family on idle
replicas): lower load, then lower KV-cache usage, then rendezvous hashing of the request's
first block - a new prompt family lands on a stable replica, so its next requests find the
cache warm even before the index knows it.

The answer is a preference order; the caller sends to the first replica that accepts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve.serve.routing.index import PrefixIndex


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the router knows about one replica when it routes a request."""

    id: str
    load: int
    """Ongoing requests (running + queued inside the replica)."""
    max_ongoing: int
    kv_usage: float = 0.0
    """KV-cache usage in [0, 1] from the replica's last report (0: unknown)."""
    adapters: frozenset[str] = frozenset()
    """LoRA adapters the replica is believed to hold (loaded by an earlier request)."""


@dataclass(frozen=True, slots=True)
class PrefixParams:
    """The knobs of :class:`fleetserve.spec.RoutingSpec` the choice uses."""

    load_factor: float | None = None
    """Hard cap: ongoing requests at most ``load_factor`` x the mean (``None``: no cap)."""
    load_weight: float = 4.0
    """Prompt blocks one ongoing request on a replica costs a new request there."""
    adapter_weight: float = 32.0
    """Prompt blocks that loading a LoRA adapter into a replica costs."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A preference order over replica ids, and why the first one leads."""

    order: tuple[str, ...]
    matched_blocks: int
    """Blocks of the request the first replica is believed to hold."""
    reason: str
    """``affinity`` (a cached prefix or a held adapter decided), ``balance`` (no usable match)."""


def load_bound(total_load: int, replicas: int, load_factor: float) -> int:
    """Most ongoing requests a replica may hold after taking one more (the hard cap)."""
    return max(1, math.ceil(load_factor * (total_load + 1) / max(1, replicas)))


def replica_cost(
    blocks: int, matched: int, replica: ReplicaView, adapter: str | None, params: PrefixParams
) -> float:
    """What sending the request to ``replica`` costs, in prompt blocks (see the note)."""
    cost = float(blocks - matched) + params.load_weight * replica.load
    if adapter is not None and adapter not in replica.adapters:
        cost += params.adapter_weight
    return cost


def rank_replicas(
    blocks: Sequence[int],
    replicas: Sequence[ReplicaView],
    index: PrefixIndex,
    params: PrefixParams,
    adapter: str | None = None,
) -> Choice:
    """Order ``replicas`` for a request whose prompt hashes to ``blocks``.

    ``adapter``: the LoRA adapter the request names (``None``: the base model).
    """
    if not replicas:
        return Choice((), 0, "balance")
    matched = index.match(blocks, [r.id for r in replicas]) if blocks else {}
    cap = (
        load_bound(sum(r.load for r in replicas), len(replicas), params.load_factor)
        if params.load_factor is not None
        else None
    )
    anchor = blocks[0] if blocks else 0

    def usable(r: ReplicaView) -> bool:
        return r.load < r.max_ongoing and (cap is None or r.load + 1 <= cap)

    def key(r: ReplicaView) -> tuple[int, float, int, float, int]:
        cost = replica_cost(len(blocks), matched.get(r.id, 0), r, adapter, params)
        return (0 if usable(r) else 1, cost, r.load, r.kv_usage, -_rendezvous(anchor, r.id))

    order = sorted(replicas, key=key)
    first = order[0]
    depth = matched.get(first.id, 0)
    best_other = max((matched.get(r.id, 0) for r in order[1:]), default=0)
    holds = adapter is not None and adapter in first.adapters
    sticky = (depth > 0 and depth >= best_other) or holds
    reason = "affinity" if usable(first) and sticky else "balance"
    return Choice(tuple(r.id for r in order), depth, reason)


def _rendezvous(anchor: int, replica: str) -> int:
    digest = hashlib.blake2b(f"{anchor}:{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
