"""ColdStartClient: a request to a model scaled to zero waits (bounded) for its first
replica, is answered once one is up, and gets ModelUnavailableError (503) past the timeout;
the first timed-out request stays queued (the waker) until a replica is up, so the model
starts however short the timeout, then leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.serve.ingress.model_client import ModelUnavailableError
from fleetserve.serve.ingress.scale_to_zero import ColdStart, ColdStartClient

REQUEST = EngineRequest("POST", "/v1/chat/completions", b"{}")


class QueueingClient:
    """Like a Serve handle: the response comes only once a replica exists."""

    def __init__(self) -> None:
        self.replicas = 0
        self.up = asyncio.Event()
        self.opened = 0
        self.cancelled = 0
        self.closed = 0

    @property
    def queued(self) -> int:
        """Requests still waiting in the 'handle' (what Serve's autoscaler counts)."""
        return self.opened - self.closed

    async def _stream(self) -> AsyncIterator[ResponseHead | bytes]:
        self.opened += 1
        try:
            await self.up.wait()
            yield ResponseHead(200)
            yield b"hello"
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.closed += 1

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        return self._stream()

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        return EngineStats()


def client(inner: QueueingClient, timeout_s: float, wake_hold_s: float = 30) -> ColdStartClient:
    return ColdStartClient(
        inner,
        {"cold": ColdStart(deployment="model-cold", timeout_s=timeout_s)},
        replicas=lambda deployment: inner.replicas,
        wake_hold_s=wake_hold_s,
    )


async def until(condition: Callable[[], bool], timeout_s: float = 5) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def collect(stream: AsyncIterator[ResponseHead | bytes]) -> list[ResponseHead | bytes]:
    return [item async for item in stream]


async def test_request_waits_for_the_first_replica_and_is_answered() -> None:
    inner = QueueingClient()
    c = client(inner, timeout_s=5)
    assert c.scaled_to_zero("cold")
    task = asyncio.create_task(collect(c.open("cold", REQUEST)))
    await asyncio.sleep(0.3)
    assert not task.done()
    inner.replicas = 1  # the autoscaler started one...
    await asyncio.sleep(0.2)
    inner.up.set()  # ... and it answers
    assert await task == [ResponseHead(200), b"hello"]
    assert not c.scaled_to_zero("cold")


async def test_past_the_timeout_the_caller_gets_503_and_the_request_wakes_the_model() -> None:
    inner = QueueingClient()
    c = client(inner, timeout_s=0.05)
    with pytest.raises(ModelUnavailableError, match="scaled to zero"):
        await collect(c.open("cold", REQUEST))
    # Serve's autoscaler samples the handle's queue about once a second: a request gone
    # after 0.05 s would never be seen, and the model would never start.
    await asyncio.sleep(0.5)
    assert inner.queued == 1
    inner.replicas = 1  # the autoscaler counted it and started a replica
    await until(lambda: inner.queued == 0)
    assert inner.cancelled == 1  # it leaves without being answered


async def test_one_waker_per_model_and_the_other_timed_out_requests_leave_at_once() -> None:
    inner = QueueingClient()
    c = client(inner, timeout_s=0.05)
    for _ in range(5):
        with pytest.raises(ModelUnavailableError):
            await collect(c.open("cold", REQUEST))
    assert inner.queued == 1
    inner.replicas = 1
    await until(lambda: inner.queued == 0)
    # Once the waker is gone, a later timeout at zero replicas leaves a new one.
    inner.replicas = 0
    with pytest.raises(ModelUnavailableError):
        await collect(c.open("cold", REQUEST))
    assert inner.queued == 1
    inner.replicas = 1
    await until(lambda: inner.queued == 0)


async def test_the_waker_gives_up_after_its_hold() -> None:
    inner = QueueingClient()
    c = client(inner, timeout_s=0.05, wake_hold_s=0.3)
    with pytest.raises(ModelUnavailableError):
        await collect(c.open("cold", REQUEST))
    assert inner.queued == 1
    await until(lambda: inner.queued == 0)  # no replica ever: it stops asking
    assert inner.cancelled == 1


async def test_a_waker_answered_by_the_new_replica_is_closed() -> None:
    inner = QueueingClient()
    c = client(inner, timeout_s=0.05)
    with pytest.raises(ModelUnavailableError):
        await collect(c.open("cold", REQUEST))
    inner.up.set()  # the replica answers before the router reports it
    await until(lambda: inner.queued == 0)


async def test_once_a_replica_exists_a_slow_response_is_not_cut() -> None:
    inner = QueueingClient()
    inner.replicas = 1
    c = client(inner, timeout_s=0.2)
    task = asyncio.create_task(collect(c.open("cold", REQUEST)))
    await asyncio.sleep(0.5)  # longer than the cold-start timeout: a long generation
    inner.up.set()
    assert await task == [ResponseHead(200), b"hello"]


async def test_other_models_pass_through() -> None:
    inner = QueueingClient()
    inner.up.set()
    c = client(inner, timeout_s=0.1)
    assert not c.scaled_to_zero("warm")
    assert await collect(c.open("warm", REQUEST)) == [ResponseHead(200), b"hello"]


async def test_client_gone_mid_stream_closes_the_inner_stream() -> None:
    inner = QueueingClient()
    inner.replicas = 1
    inner.up.set()
    stream = ColdStartClient(
        inner, {"cold": ColdStart("model-cold", 5)}, replicas=lambda d: 1
    ).open("cold", REQUEST)
    assert isinstance(await anext(stream), ResponseHead)
    await stream.aclose()  # type: ignore[attr-defined]
    assert inner.closed == 1
