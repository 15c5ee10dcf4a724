"""Weighted fair queuing of waiting requests: the Virtual Token Counter (VTC).

Design note. From "Fairness in Serving Large Language Models" (Sheng et al., OSDI'24):
each tenant has a counter of the service it received, in tokens divided by its weight;
when a slot of a saturated model frees, the waiting request of the tenant with the
*smallest* counter goes next (FIFO within a tenant). Two rules keep it fair:

* charge the service: a request in service counts as *pending* service (its reserved
  tokens, the number the quota reserves) from its start, and as its real usage once it
  ends - so a tenant holding many slots, or sending long generations, pays for them.
  A tenant's place in line is (served + pending) / weight;
* no banking: a tenant that had nothing waiting has its served counter lifted to the
  smallest served counter of the tenants that are waiting when it joins them, so an idle
  tenant cannot save credit and then monopolise the model, and a newcomer is not starved
  by tenants that have been served for a long time. The lift uses *served* only: pending
  reservations are upper bounds that shrink to real usage, and a newcomer lifted to an
  inflated number would then wait behind the tenant it should alternate with.

Over any interval in which two tenants are both backlogged, their received service
(divided by weight) differs by at most a bounded amount (the paper's Theorem: about
twice the largest request's cost) - a flooding tenant only lengthens its own queue.
Pure: no clocks, no asyncio; :mod:`fleetserve.serve.guard.admission` drives it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


@dataclass(slots=True)
class _Tenant(Generic[T]):
    weight: float
    counter: float = 0.0  # served tokens / weight
    pending: float = 0.0  # reserved tokens of requests in service / weight
    waiting: deque[tuple[int, T]] = field(default_factory=deque)  # (arrival, item)


class FairQueue(Generic[T]):
    """Waiting items by tenant; ``pop`` returns the next item in VTC order."""

    def __init__(self, weights: dict[str, float] | None = None, default_weight: float = 1.0):
        self._weights = dict(weights or {})
        self._default = default_weight
        self._tenants: dict[str, _Tenant[T]] = {}
        self._size = 0
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return self._size

    def _tenant(self, name: str) -> _Tenant[T]:
        t = self._tenants.get(name)
        if t is None:
            t = self._tenants[name] = _Tenant(self._weights.get(name, self._default))
        return t

    def counter(self, tenant: str) -> float:
        """The tenant's virtual counter ((served + pending) / weight)."""
        t = self._tenants.get(tenant)
        return t.counter + t.pending if t is not None else 0.0

    def push(self, tenant: str, item: T) -> None:
        t = self._tenant(tenant)
        if not t.waiting:
            backlogged = [o.counter for o in self._tenants.values() if o.waiting]
            if backlogged:
                t.counter = max(t.counter, min(backlogged))  # no banking while idle
        t.waiting.append((next(self._arrivals), item))
        self._size += 1

    def remove(self, tenant: str, item: T) -> bool:
        """Take a waiting item out (its client left); False if it is not waiting."""
        t = self._tenants.get(tenant)
        if t is None:
            return False
        for entry in t.waiting:
            if entry[1] == item:
                t.waiting.remove(entry)
                self._size -= 1
                return True
        return False

    def pop(self) -> tuple[str, T] | None:
        """The next (tenant, item): the backlogged tenant with the smallest counter.

        Ties go to the request that arrived first; call :meth:`start` when it runs."""
        best: tuple[float, int, str, _Tenant[T]] | None = None
        for name, t in self._tenants.items():
            if t.waiting:
                key = (t.counter + t.pending, t.waiting[0][0], name, t)
                if best is None or key[:2] < best[:2]:
                    best = key
        if best is None:
            return None
        self._size -= 1
        return best[2], best[3].waiting.popleft()[1]

    def start(self, tenant: str, reserved: float) -> None:
        """A request of ``tenant`` entered service holding ``reserved`` tokens."""
        t = self._tenant(tenant)
        t.pending += reserved / t.weight

    def finish(self, tenant: str, reserved: float, used: float) -> None:
        """That request ended having used ``used`` tokens (0: it never ran)."""
        t = self._tenant(tenant)
        t.pending = max(0.0, t.pending - reserved / t.weight)
        t.counter += used / t.weight


__all__ = ["FairQueue"]
