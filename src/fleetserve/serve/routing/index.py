"""Which replica is likely to hold which prompt blocks in its KV cache (a router's view).

Design note. Each replica gets an LRU set of block hashes bounded by its cache capacity in
blocks (what the replica reports; a default until it has), mirroring vLLM's own LRU
eviction. Two sources feed it: the router's own decisions (``add`` right after routing, so
the next turn of a conversation finds its replica before any report arrives) and the
replica's periodic report of the blocks it served (``merge``), which is what makes the view
survive a restart of the router's process and agree across several routers. A replica that
leaves is forgotten (``retain``/``drop``): a restarted replica is a new id with a cold cache.

``match`` walks the request's chained hashes from the start; because block ``i``'s hash
covers the whole prefix up to ``i``, the first miss ends the match for that replica.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

#: Blocks remembered for a replica that has not reported its capacity yet.
DEFAULT_CAPACITY_BLOCKS = 8192


class PrefixIndex:
    """Per-replica LRU sets of block hashes, with a reverse map for matching."""

    def __init__(self, default_capacity: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        self._default_capacity = default_capacity
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._owners: dict[int, set[str]] = {}
        #: Blocks added by routing since the replica's last report, per replica.
        self._pending: dict[str, list[int]] = {}

    def replicas(self) -> set[str]:
        return set(self._blocks)

    def size(self, replica: str) -> int:
        """Blocks remembered for ``replica``."""
        return len(self._blocks.get(replica, ()))

    def set_capacity(self, replica: str, blocks: int) -> None:
        self._capacity[replica] = max(1, blocks)
        self._evict(replica)

    def add(self, replica: str, hashes: Sequence[int]) -> None:
        """``replica`` now holds ``hashes`` (most recently used), by a routing decision.

        Last block first, as the replica's ledger records them: the head of the prompt is
        the most recent, so the capacity's LRU drops tails first (vLLM evicts a request's
        blocks tail first too) and never leaves a conversation without its head."""
        newest_last = list(reversed(hashes))
        pending = self._pending.setdefault(replica, [])
        pending.extend(newest_last)
        del pending[: -self._capacity.get(replica, self._default_capacity)]
        self._insert(replica, newest_last)

    def _insert(self, replica: str, hashes: Sequence[int]) -> None:
        lru = self._blocks.setdefault(replica, OrderedDict())
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._owners.setdefault(h, set()).add(replica)
        self._evict(replica)

    def merge(self, replica: str, reported: Sequence[int], complete: bool = True) -> None:
        """A replica's report of the blocks it holds (oldest first).

        ``complete`` (the report is all the replica's ledger holds): it replaces our view -
        the replica is the authority on what it still caches. Otherwise (a big cache's
        report carries only its newest blocks) those blocks are refreshed in our view and
        the older ones kept, to leave by the capacity's LRU as the replica's do. Either
        way the blocks this router added since the previous report (the report lags by a
        period) go on top.
        """
        pending = self._pending.pop(replica, [])
        if complete:
            old = self._blocks.pop(replica, OrderedDict())
            for h in old:
                self._forget(h, replica)
        self._insert(replica, reported)
        self._insert(replica, pending)
        self._pending[replica] = []

    def drop(self, replica: str) -> None:
        lru = self._blocks.pop(replica, None)
        self._capacity.pop(replica, None)
        self._pending.pop(replica, None)
        for h in lru or ():
            self._forget(h, replica)

    def retain(self, replicas: Iterable[str]) -> None:
        """Forget every replica not in ``replicas``."""
        keep = set(replicas)
        for replica in list(self._blocks):
            if replica not in keep:
                self.drop(replica)

    def match(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``hashes`` each of ``replicas`` holds."""
        depth = dict.fromkeys(replicas, 0)
        alive = set(depth)
        for i, h in enumerate(hashes):
            owners = self._owners.get(h)
            if not owners:
                break
            alive &= owners
            if not alive:
                break
            for replica in alive:
                depth[replica] = i + 1
        return depth

    def _evict(self, replica: str) -> None:
        lru = self._blocks.get(replica)
        if lru is None:
            return
        cap = self._capacity.get(replica, self._default_capacity)
        while len(lru) > cap:
            h, _ = lru.popitem(last=False)
            self._forget(h, replica)

    def _forget(self, h: int, replica: str) -> None:
        owners = self._owners.get(h)
        if owners is not None:
            owners.discard(replica)
            if not owners:
                del self._owners[h]


class AdapterIndex:
    """Which LoRA adapters each replica is believed to hold (an LRU per replica).

    vLLM keeps up to ``max_cpu_loras`` adapters loaded per engine and evicts the least
    recently used one; ``slots`` mirrors that bound. Fed like :class:`PrefixIndex`: the
    router's own decisions (``add``) and each replica's report of the adapters it served,
    oldest first (``merge``, authoritative but a period late, so adapters routed since the
    last report are kept on top).
    """

    def __init__(self, slots: int) -> None:
        self._slots = max(1, slots)
        self._held: dict[str, OrderedDict[str, None]] = {}
        self._pending: dict[str, list[str]] = {}

    def held(self, replica: str) -> frozenset[str]:
        return frozenset(self._held.get(replica, ()))

    def add(self, replica: str, adapter: str) -> None:
        self._pending.setdefault(replica, []).append(adapter)
        del self._pending[replica][: -self._slots]
        self._touch(replica, [adapter])

    def merge(self, replica: str, reported: Sequence[str]) -> None:
        self._held[replica] = OrderedDict()
        self._touch(replica, reported)
        self._touch(replica, self._pending.pop(replica, []))

    def drop(self, replica: str) -> None:
        self._held.pop(replica, None)
        self._pending.pop(replica, None)

    def retain(self, replicas: Iterable[str]) -> None:
        keep = set(replicas)
        for replica in list(self._held):
            if replica not in keep:
                self.drop(replica)

    def _touch(self, replica: str, adapters: Iterable[str]) -> None:
        lru = self._held.setdefault(replica, OrderedDict())
        for name in adapters:
            lru[name] = None
            lru.move_to_end(name)
        while len(lru) > self._slots:
            lru.popitem(last=False)
