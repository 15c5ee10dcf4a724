"""Exact per-model admission and weighted fair queuing (pure cores + the asyncio gate)."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.serve.guard.admission import GateLimits, GateState, ModelBusyError, ModelGate
from fleetserve.serve.guard.fairness import FairQueue


def served(q: FairQueue[int], tenant: str, tokens: int) -> None:
    q.start(tenant, tokens)
    q.finish(tenant, tokens, tokens)


def test_exactly_capacity_plus_queue_are_admitted() -> None:
    """Issue #9 point 7: 40 requests against capacity 16 (+ queue 8) admit exactly 24, and
    nothing is refused below capacity."""
    state = GateState(GateLimits(capacity=16, queue_limit=8))
    verdicts = [state.offer("t", i, 10) for i in range(40)]
    assert verdicts[:16] == ["run"] * 16
    assert verdicts[16:24] == ["wait"] * 8
    assert verdicts[24:] == ["reject"] * 16
    # Each finished request hands its slot to exactly one waiter.
    for _ in range(8):
        state.finish()
        assert state.next_waiter() is not None
        assert state.in_service == 16
    state.finish()
    assert state.next_waiter() is None
    assert state.in_service == 15


def test_fair_queue_serves_the_least_served_tenant_first() -> None:
    q: FairQueue[int] = FairQueue({"a": 1.0, "b": 1.0})
    for i in range(10):
        q.push("a", i)
    q.push("b", 100)
    assert q.counter("b") == q.counter("a")  # b joins at the backlogged minimum
    assert q.pop() == ("a", 0)  # a tie: the earlier arrival
    served(q, "a", 1000)  # a was served a lot
    assert q.pop() == ("b", 100)


def test_weights_share_service_in_proportion() -> None:
    """Two backlogged tenants, weights 3:1, equal request costs: service 3:1."""
    q: FairQueue[int] = FairQueue({"gold": 3.0, "free": 1.0})
    for i in range(400):
        q.push("gold", i)
        q.push("free", i)
    got = {"gold": 0, "free": 0}
    for _ in range(400):
        popped = q.pop()
        assert popped is not None
        got[popped[0]] += 1
        served(q, popped[0], 10)
    assert got["gold"] == pytest.approx(300, abs=2)
    assert got["free"] == pytest.approx(100, abs=2)


def test_an_idle_tenant_cannot_bank_credit() -> None:
    q: FairQueue[int] = FairQueue()
    for i in range(100):
        q.push("busy", i)
    for _ in range(50):
        popped = q.pop()
        assert popped is not None
        served(q, "busy", 10)
    # "late" was idle while "busy" got 500 tokens of service: it joins at busy's counter,
    # so it alternates with busy instead of taking the next 50 slots.
    for i in range(10):
        q.push("late", i)
    assert q.counter("late") == q.counter("busy")
    order = []
    for _ in range(6):
        popped = q.pop()
        assert popped is not None
        order.append(popped[0])
        served(q, popped[0], 10)
    assert order.count("late") == 3


def test_a_newcomer_is_not_held_back_by_shrinking_reservations() -> None:
    """A running request counts its reservation (an upper bound) until it ends with its
    real, smaller usage; a tenant that joins meanwhile must not be lifted to the inflated
    number and then wait behind the flood."""
    q: FairQueue[int] = FairQueue()
    q.start("flood", 110)  # running: reserved 110, will use 15
    for i in range(10):
        q.push("flood", i)
    q.push("light", 0)
    q.finish("flood", 110, 15)
    assert q.pop() == ("light", 0)


async def test_gate_wakes_waiters_in_fair_order_and_rejects_past_the_queue() -> None:
    gate = ModelGate("m", GateLimits(capacity=1, queue_limit=4))
    await gate.acquire("a", 10)  # in service
    order: list[str] = []

    async def request(tenant: str) -> None:
        await gate.acquire(tenant, 10)
        order.append(tenant)

    # a floods (three waiting), then b sends one: FIFO would serve b fourth.
    tasks = [asyncio.create_task(request(t)) for t in ("a", "a", "a", "b")]
    await asyncio.sleep(0)
    with pytest.raises(ModelBusyError, match="overloaded"):
        await gate.acquire("c", 10)
    for _ in range(4):
        gate.release(order[-1] if order else "a", 10, 10)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    # a's running request counts as pending service; b has none: b goes next.
    assert order == ["b", "a", "a", "a"]
    assert gate.state.in_service == 1


async def test_a_waiter_that_leaves_frees_its_place() -> None:
    gate = ModelGate("m", GateLimits(capacity=1, queue_limit=1))
    await gate.acquire("a", 1)
    waiter = asyncio.create_task(gate.acquire("b", 1))
    await asyncio.sleep(0)
    assert gate.state.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.state.waiting == 0
    nxt = asyncio.create_task(gate.acquire("c", 1))
    await asyncio.sleep(0)
    gate.release("a", 1, 1)
    await nxt
    assert gate.state.in_service == 1


async def test_a_slot_handed_to_a_leaving_waiter_is_passed_on() -> None:
    gate = ModelGate("m", GateLimits(capacity=1, queue_limit=2))
    await gate.acquire("a", 1)
    first = asyncio.create_task(gate.acquire("b", 1))
    second = asyncio.create_task(gate.acquire("c", 1))
    await asyncio.sleep(0)
    gate.release("a", 1, 1)  # hands the slot to b ...
    first.cancel()  # ... which leaves before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # c gets it
    assert gate.state.in_service == 1
    assert gate.state.waiting == 0


async def test_more_replicas_wake_waiters_fewer_cut_nothing() -> None:
    gate = ModelGate("m", GateLimits(capacity=1, queue_limit=4))
    await gate.acquire("a", 1)
    waiter = asyncio.create_task(gate.acquire("b", 1))
    await asyncio.sleep(0)
    assert not waiter.done()
    gate.set_capacity(2)  # the autoscaler added a replica
    await asyncio.wait_for(waiter, 1)
    assert gate.state.in_service == 2
    gate.set_capacity(1)  # one went away: both requests keep running
    assert gate.state.in_service == 2
    late = asyncio.create_task(gate.acquire("c", 1))
    await asyncio.sleep(0)
    gate.release("a", 1, 1)
    await asyncio.sleep(0)
    assert not late.done()  # still at capacity 1 with b in service
    gate.release("b", 1, 1)
    await asyncio.wait_for(late, 1)
