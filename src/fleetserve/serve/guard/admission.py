"""Exact admission per model at the gateway, with weighted fair queuing.

Design note. Ray Serve's own limits (``max_ongoing_requests`` per replica,
``max_queued_requests`` per handle) are approximate at the ingress: routers decide on
cached replica queue lengths, so 40 requests against a capacity of 16 admitted 23, and a
request was once refused below capacity (issue #9, point 7). So the gateway keeps the
count itself, per model: at most ``capacity`` (replicas x ``max_ongoing_requests``)
requests are in service, at most ``queue_limit`` (``max_queued_requests``) wait in the
gateway, and the next one gets 503 + ``Retry-After`` at once. Waiting requests are ordered
by :class:`~fleetserve.serve.guard.fairness.FairQueue` (VTC), which is where tenants sharing a
saturated model get service in proportion to their weights.

The decision core (:class:`GateState`) is pure; :class:`ModelGate` wraps it with asyncio
futures. What must stay true: ``in_service <= capacity`` and ``waiting <= queue_limit``
always; a slot freed while requests wait is handed to one of them immediately (never
left idle); a waiter whose client leaves is removed, and a slot handed to a waiter that
was cancelled at the same moment is passed on.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Literal

from fleetserve.errors import ServeError
from fleetserve.serve.guard.fairness import FairQueue

Verdict = Literal["run", "wait", "reject"]


class ModelBusyError(ServeError):
    """The model's capacity and its gateway queue are full (maps to 503)."""


@dataclass(frozen=True, slots=True)
class GateLimits:
    """One model's admission numbers."""

    capacity: int
    queue_limit: int


class GateState:
    """Counts of one model's gate and its fair queue (pure)."""

    def __init__(self, limits: GateLimits, weights: dict[str, float] | None = None) -> None:
        self.limits = limits
        self.in_service = 0
        self.queue: FairQueue[int] = FairQueue(weights)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def offer(self, tenant: str, ticket: int, cost: int) -> Verdict:
        """A new request: run now, wait (queued), or reject (503)."""
        if self.in_service < self.limits.capacity and not self.queue:
            self.in_service += 1
            self.queue.start(tenant, cost)
            return "run"
        if self.waiting < self.limits.queue_limit:
            self.queue.push(tenant, ticket)
            return "wait"
        return "reject"

    def finish(self) -> None:
        """A request in service ended: its slot is free."""
        self.in_service -= 1

    def next_waiter(self) -> tuple[str, int] | None:
        """Hand a free slot to the next waiter (VTC order), if any."""
        if self.in_service >= self.limits.capacity:
            return None
        nxt = self.queue.pop()
        if nxt is not None:
            self.in_service += 1
        return nxt


class ModelGate:
    """The asyncio shell of one model's :class:`GateState`."""

    def __init__(
        self, model: str, limits: GateLimits, weights: dict[str, float] | None = None
    ) -> None:
        self.model = model
        self.state = GateState(limits, weights)
        self._waiters: dict[int, tuple[asyncio.Future[None], int]] = {}
        self._ids = itertools.count()

    async def acquire(self, tenant: str, cost: int) -> None:
        """Wait for a slot; ModelBusyError when the gate's queue is full."""
        ticket = next(self._ids)
        verdict = self.state.offer(tenant, ticket, cost)
        if verdict == "run":
            return
        if verdict == "reject":
            lim = self.state.limits
            raise ModelBusyError(
                f"model '{self.model}' is overloaded: {lim.capacity} requests in service "
                f"and {lim.queue_limit} waiting; retry later"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = (future, cost)
        try:
            await future
        except BaseException:
            self._waiters.pop(ticket, None)
            handed = not self.state.queue.remove(tenant, ticket)
            if handed and future.done() and not future.cancelled():
                # The slot was handed to us as we were cancelled: pass it on (a request
                # that never ran used nothing).
                self.release(tenant, cost, 0)
            raise

    def set_capacity(self, capacity: int) -> None:
        """Follow the model's running replicas (autoscaling); more room wakes waiters at
        once, less lets the requests in service finish (none is cut)."""
        if capacity != self.state.limits.capacity:
            self.state.limits = GateLimits(capacity, self.state.limits.queue_limit)
            self._wake()

    def release(self, tenant: str, cost: int, used: int | None) -> None:
        """A request ended (``used`` tokens; None: unknown, the reservation counts):
        charge its tenant and wake the next waiter."""
        self.state.queue.finish(tenant, cost, cost if used is None else used)
        self.state.finish()
        self._wake()

    def _wake(self) -> None:
        while True:
            nxt = self.state.next_waiter()
            if nxt is None:
                return
            tenant, ticket = nxt
            waiter = self._waiters.pop(ticket, None)
            if waiter is None or waiter[0].done():
                self.state.finish()  # its client left between pop and wake
                continue
            future, cost = waiter
            self.state.queue.start(tenant, cost)
            future.set_result(None)
            return


__all__ = ["GateLimits", "GateState", "ModelBusyError", "ModelGate"]
