"""HandleModelClient: how the ingress calls model deployments and gets their responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from ray.serve.exceptions import BackPressureError

from fleetserve.engine.protocol import EngineRequest, ResponseHead
from fleetserve.engine.vllm_process import VllmProcessEngine
from fleetserve.serve.ingress import model_client
from fleetserve.serve.ingress.model_client import (
    HandleModelClient,
    ModelOverloadedError,
    ModelUnavailableError,
)
from fleetserve.serve.replica.model_server import answer_relayed
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


# -- handed-off streams (frontend: process) ----------------------------------------------


class ServerReplica:
    """A model replica as ModelServer runs it (``answer_relayed``), its engine the real
    process-frontend adapter on a small aiohttp server standing in for ``vllm serve``."""

    def __init__(self, engine: VllmProcessEngine, node: str = "node-a") -> None:
        self.engine = engine
        self.sender = RelaySender(node)
        self.responses: list[FakeResponse] = []
        self.handle_relayed = self

    def options(self, **_: Any) -> ServerReplica:
        return self

    def remote(self, request: EngineRequest, ticket: RelayTicket) -> FakeResponse:
        response = FakeResponse(answer_relayed(self.sender, ticket, self.engine, request))
        self.responses.append(response)
        return response


class StandIn:
    """``vllm serve`` on a Unix socket: a stream of ``events`` SSE events, 10 ms apart."""

    def __init__(self, events: int) -> None:
        self.events = events
        self.requests: list[tuple[str, bytes]] = []
        self.left = asyncio.Event()  # a client closed its stream before the end
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self._completions)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path, await request.read()))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i in range(self.events):
                await response.write(f"data: {i}\n\n".encode())
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            self.left.set()
            raise
        return response


@pytest.fixture
async def stand_in(process_stand_in: Any) -> tuple[StandIn, VllmProcessEngine]:
    """A 3-event stand-in server and the process engine on it (tests/unit/conftest.py)."""
    server = StandIn(3)
    return server, await process_stand_in.start(server.app)


Ingress = Callable[..., HandleModelClient]


@pytest.fixture
async def ingress(receiver: None) -> AsyncIterator[Ingress]:
    """HandleModelClients over one replica each; their pools closed after the test."""
    made: list[HandleModelClient] = []

    def make(replica: ServerReplica, **options: Any) -> HandleModelClient:
        made.append(HandleModelClient({"m": replica}, **options))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


def _body(items: list[ResponseHead | bytes]) -> bytes:
    return b"".join(i for i in items if isinstance(i, bytes))


@on_session_loop
async def test_a_process_replica_hands_its_stream_to_the_ingress_on_its_node(
    ingress: Ingress, stand_in: tuple[StandIn, VllmProcessEngine]
) -> None:
    server, engine = stand_in
    replica = ServerReplica(engine)
    items = await _read(ingress(replica))
    assert items[0] == ResponseHead(200, (), "text/event-stream")
    assert _body(items[1:]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert server.requests == [("/v1/completions", b"{}")]
    # the replica held the request until the ingress released it, then its call ended
    assert (
        await replica.responses[0].task
        == next(iter(replica.sender._connections.values())).result().id
    )
    stats = engine.stats()
    assert (stats.handed_off, stats.completed, stats.aborted, stats.in_flight) == (1, 1, 0, 0)
    # asked not to (server.stream_handoff: false), it relays (another node: test_relay.py)
    client = ingress(replica, handoff=False)
    assert _body((await _read(client))[1:]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    stats = engine.stats()
    assert (stats.handed_off, stats.completed, stats.in_flight) == (1, 2, 0)


async def _handed_off_long_stream(
    ingress: Ingress, stand_in: tuple[StandIn, VllmProcessEngine]
) -> tuple[ServerReplica, AsyncIterator[ResponseHead | bytes]]:
    """A stream of minutes handed off by a replica of the stand-in's engine, its head and
    first bytes read (the request is in flight at the engine)."""
    server, engine = stand_in
    server.events = 10_000
    replica = ServerReplica(engine)
    stream = ingress(replica).open("m", REQUEST)
    assert isinstance(await anext(stream), ResponseHead)
    await anext(stream)
    assert engine.stats().in_flight == 1
    return replica, stream


@on_session_loop
async def test_with_timelines_on_a_handed_off_request_passes_every_point_in_order(
    ingress: Ingress,
    stand_in: tuple[StandIn, VllmProcessEngine],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The handoff's own points: the replica sends HANDOFF, the ingress takes it, then reads
    # the head and first bytes from the server; benchmarks/gpu/timeline.py needs i_end.
    from fleetserve.observe.timeline import RECEIVED_NS, Timeline  # noqa: PLC0415
    from fleetserve.serve.replica import relay  # noqa: PLC0415

    on = Timeline(str(tmp_path / "timelines"))
    monkeypatch.setattr(model_client, "TIMELINE", on)
    monkeypatch.setattr(relay, "TIMELINE", on)
    RECEIVED_NS.set(1)
    _, engine = stand_in
    replica = ServerReplica(engine)
    await _read(ingress(replica))
    await asyncio.wait_for(replica.responses[0].task, 5)  # the replica's hold has ended
    on.flush()
    rows = [
        line.split("\t")
        for f in (tmp_path / "timelines").iterdir()
        for line in f.read_text().splitlines()
    ]
    assert len({stream for stream, _, _ in rows}) == 1
    points = {point: int(ns) for _, point, ns in rows}
    order = ["i_recv", "i_call", "r_recv", "r_handoff", "i_handoff", "i_head", "i_data", "i_end"]
    assert [points[p] for p in order] == sorted(points[p] for p in order)
    assert points["i_end"] <= points["r_end"]  # released after the stream's end
    assert "r_data" not in points  # no token passed the replica


@on_session_loop
async def test_a_client_that_leaves_a_handed_off_stream_aborts_it_and_frees_the_replica(
    ingress: Ingress, stand_in: tuple[StandIn, VllmProcessEngine]
) -> None:
    server, engine = stand_in
    replica, stream = await _handed_off_long_stream(ingress, stand_in)
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(server.left.wait(), 5)  # the server saw its client leave
    await asyncio.wait_for(replica.responses[0].task, 5)  # released, not cancelled
    assert not replica.responses[0].cancelled
    stats = engine.stats()
    assert (stats.handed_off, stats.aborted, stats.completed, stats.in_flight) == (1, 1, 0, 0)


@on_session_loop
async def test_a_handed_off_stream_whose_server_is_gone_is_a_clear_503(
    ingress: Ingress, stand_in: tuple[StandIn, VllmProcessEngine], tmp_path: Path
) -> None:
    _, engine = stand_in
    replica = ServerReplica(engine)
    # the server's socket is gone between the handoff and the ingress's connect
    engine._socket = str(tmp_path / "gone.sock")
    with pytest.raises(ModelUnavailableError, match="failed to answer") as info:
        await _read(ingress(replica))
    assert "gone.sock" not in str(info.value)
    await asyncio.wait_for(replica.responses[0].task, 5)
    stats = engine.stats()
    assert (stats.handed_off, stats.aborted, stats.in_flight) == (1, 1, 0)
    # the server exited (its engine died): refused before any handoff, as handle() refuses
    assert engine._proc is not None
    engine._proc.kill()
    engine._proc.wait()
    with pytest.raises(ModelUnavailableError, match="failed to answer"):
        await _read(ingress(replica))
    assert engine.stats().handed_off == 1


@on_session_loop
async def test_a_lost_relay_connection_ends_the_replicas_hold_on_a_handed_off_stream(
    ingress: Ingress, stand_in: tuple[StandIn, VllmProcessEngine]
) -> None:
    _, engine = stand_in
    replica, stream = await _handed_off_long_stream(ingress, stand_in)
    for pending in list(replica.sender._connections.values()):
        pending.result().close()
    await asyncio.wait_for(replica.responses[0].task, 5)  # the hold ended with it
    assert engine.stats().in_flight == 0
    await stream.aclose()  # type: ignore[attr-defined]
