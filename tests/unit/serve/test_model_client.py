"""HandleModelClient: how the ingress calls model deployments and gets their responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from ray.serve.exceptions import BackPressureError

from fleetserve.engine.protocol import EngineRequest, ResponseHead
from fleetserve.serve.ingress import model_client
from fleetserve.serve.ingress.model_client import (
    HandleModelClient,
    ModelOverloadedError,
    ModelUnavailableError,
)
from fleetserve.serve.replica.relay import RelayReceiver, RelaySender, RelayTicket, relay_stream

#: The relay's sockets live on one loop: the fixture's and the test's (the session's).
on_session_loop = pytest.mark.asyncio(loop_scope="session")

HEAD = ResponseHead(status=200, media_type="text/event-stream")
REQUEST = EngineRequest(method="POST", path="/v1/completions", body=b"{}")


class RecordingHandle:
    def __init__(self) -> None:
        self.options_seen: list[dict[str, Any]] = []

    def options(self, **kwargs: Any) -> RecordingHandle:
        self.options_seen.append(kwargs)
        return self


def test_calls_use_serves_grpc_transport_on_any_cluster() -> None:
    # Not by reference: items go over the replicas' gRPC server instead of becoming Ray
    # objects (benchmarks/serve_path.py); this must hold on clusters fleetserve did not
    # start, where the fast-path environment flags are absent.
    handle = RecordingHandle()
    HandleModelClient({"m": handle})
    assert handle.options_seen == [{"stream": True, "_by_reference": False}]


class FakeResponse:
    """A Serve ``DeploymentResponseGenerator``: its replica runs as a task; iterating it
    yields the replica's items; ``cancel()`` cancels the replica's handler."""

    def __init__(self, replica: Coroutine[Any, Any, int]) -> None:
        self.task = asyncio.ensure_future(replica)
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[int]:
        return self._items()

    async def _items(self) -> AsyncIterator[int]:
        yield await self.task

    def cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()


class Replica:
    """A model replica's ``handle_relayed``, the way ModelServer runs it, over a real relay."""

    def __init__(
        self,
        items: list[ResponseHead | bytes],
        *,
        fail_after: int | None = None,
        refuse: BaseException | None = None,
        hang: bool = False,
    ) -> None:
        self.sender = RelaySender("node-a")
        self.items, self.fail_after, self.refuse, self.hang = items, fail_after, refuse, hang
        self.closed = asyncio.Event()
        self.responses: list[FakeResponse] = []
        self.handle_relayed = self

    def options(self, **_: Any) -> Replica:
        return self

    async def _engine(self) -> AsyncIterator[ResponseHead | bytes]:
        try:
            for i, item in enumerate(self.items):
                if i == self.fail_after:
                    raise RuntimeError("the engine died")
                yield item
                await asyncio.sleep(0)
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed.set()

    async def _run(self, ticket: RelayTicket) -> int:
        if self.refuse is not None:
            raise self.refuse
        return await relay_stream(self.sender, ticket, self._engine())

    def remote(self, request: EngineRequest, ticket: RelayTicket) -> FakeResponse:
        response = FakeResponse(self._run(ticket))
        self.responses.append(response)
        return response


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The ingress's relay receiver (the tests and it share the session's loop)."""
    started: list[RelayReceiver] = []

    async def start() -> RelayReceiver:
        started.append(await RelayReceiver.start(node_id="node-a", tcp_host=None))
        return started[0]

    monkeypatch.setattr(model_client, "_start_receiver", start)
    yield
    for r in started:
        r.close()


async def _read(client: HandleModelClient) -> list[ResponseHead | bytes]:
    return [item async for item in client.open("m", REQUEST)]


@on_session_loop
async def test_a_relayed_stream_arrives_whole(receiver: None) -> None:
    replica = Replica([HEAD, b"data: 1\n\n", b"data: 2\n\n"])
    items = await _read(HandleModelClient({"m": replica}))
    assert items[0] == HEAD
    assert b"".join(i for i in items[1:] if isinstance(i, bytes)) == b"data: 1\n\ndata: 2\n\n"


@on_session_loop
async def test_an_engine_failure_mid_stream_ends_it_with_a_clear_error(
    receiver: None,
) -> None:
    replica = Replica([HEAD, b"data: 1\n\n", b"data: 2\n\n"], fail_after=2)
    got: list[object] = []

    async def read() -> None:
        async for item in HandleModelClient({"m": replica}).open("m", REQUEST):
            got.append(item)

    with pytest.raises(ModelUnavailableError, match="failed to answer") as info:
        await read()
    assert got[0] == HEAD
    assert "RuntimeError" not in str(info.value)


@on_session_loop
async def test_serves_back_pressure_is_an_overload(receiver: None) -> None:
    replica = Replica(
        [HEAD], refuse=BackPressureError(num_queued_requests=9, max_queued_requests=8)
    )
    with pytest.raises(ModelOverloadedError, match="overloaded"):
        await _read(HandleModelClient({"m": replica}))


@on_session_loop
async def test_a_client_that_leaves_cancels_the_call_and_the_engine_stream(
    receiver: None,
) -> None:
    replica = Replica([HEAD, b"data: 1\n\n"], hang=True)
    stream = HandleModelClient({"m": replica}).open("m", REQUEST)
    assert await anext(stream) == HEAD
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert replica.responses[0].cancelled
    await asyncio.wait_for(replica.closed.wait(), 5)  # the engine's stream was closed


@on_session_loop
async def test_a_lost_relay_connection_fails_the_stream(receiver: None) -> None:
    replica = Replica([HEAD, b"data: 1\n\n"], hang=True)
    stream = HandleModelClient({"m": replica}).open("m", REQUEST)
    assert await anext(stream) == HEAD
    for pending in list(replica.sender._connections.values()):
        pending.result().close()
    with pytest.raises(ModelUnavailableError, match="connection to its replica was lost"):
        async for _ in stream:
            pass


@on_session_loop
async def test_the_serve_stream_mode_does_not_use_the_relay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_relay() -> RelayReceiver:
        raise AssertionError("the relay was started")

    monkeypatch.setattr(model_client, "_start_receiver", no_relay)

    class StreamingHandle:
        def __init__(self) -> None:
            self.handle = self

        def options(self, **_: Any) -> StreamingHandle:
            return self

        def remote(self, request: EngineRequest) -> Any:
            async def gen() -> AsyncIterator[ResponseHead | bytes]:
                yield HEAD
                yield b"x"

            return gen()

    client = HandleModelClient({"m": StreamingHandle()}, relay="serve")
    assert [i async for i in client.open("m", REQUEST)] == [HEAD, b"x"]


@on_session_loop
async def test_with_timelines_on_a_request_passes_every_point_in_order(
    receiver: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # One Timeline for the ingress's and the replica's side (one process here, two there).
    from fleetserve.observe.timeline import RECEIVED_NS, Timeline  # noqa: PLC0415
    from fleetserve.serve.replica import relay  # noqa: PLC0415

    on = Timeline(str(tmp_path))
    monkeypatch.setattr(model_client, "TIMELINE", on)
    monkeypatch.setattr(relay, "TIMELINE", on)
    RECEIVED_NS.set(1)  # what the gateway sets when it takes the HTTP request
    replica = Replica([HEAD, b"data: 1\n\n", b"data: 2\n\n"])
    await _read(HandleModelClient({"m": replica}))
    on.flush()
    rows = [line.split("\t") for f in tmp_path.iterdir() for line in f.read_text().splitlines()]
    assert len({stream for stream, _, _ in rows}) == 1
    points = {point: int(ns) for _, point, ns in rows}
    order = ["i_recv", "i_call", "r_recv", "r_head", "r_data", "r_end", "i_end"]
    assert [points[p] for p in order] == sorted(points[p] for p in order)
    assert points["i_recv"] == 1
    assert points["r_head"] <= points["i_head"] <= points["i_data"] <= points["i_end"]
