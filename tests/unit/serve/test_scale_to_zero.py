"""ColdStartClient: a request to a model scaled to zero waits (bounded) for its first
replica, is answered once one is up, and gets ModelUnavailableError (503) past the timeout
with its queued request cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.serve.model_client import ModelUnavailableError
from fleetserve.serve.scale_to_zero import ColdStart, ColdStartClient

REQUEST = EngineRequest("POST", "/v1/chat/completions", b"{}")


class QueueingClient:
    """Like a Serve handle: the response comes only once a replica exists."""

    def __init__(self) -> None:
        self.replicas = 0
        self.up = asyncio.Event()
        self.cancelled = 0
        self.closed = 0

    async def _stream(self) -> AsyncIterator[ResponseHead | bytes]:
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


def client(inner: QueueingClient, timeout_s: float) -> ColdStartClient:
    return ColdStartClient(
        inner,
        {"cold": ColdStart(deployment="model-cold", timeout_s=timeout_s)},
        replicas=lambda deployment: inner.replicas,
    )


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


async def test_past_the_timeout_the_caller_gets_unavailable_and_the_request_leaves() -> None:
    inner = QueueingClient()
    c = client(inner, timeout_s=0.3)
    with pytest.raises(ModelUnavailableError, match="scaled to zero"):
        await collect(c.open("cold", REQUEST))
    assert inner.cancelled == 1
    assert inner.closed == 1


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
