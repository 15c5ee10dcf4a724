"""The stream relay (serve/replica/relay.py) over real sockets, without Ray."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetserve.engine.protocol import ResponseHead
from fleetserve.serve.replica import relay
from fleetserve.serve.replica.relay import (
    DATA,
    END,
    END_OF_STREAM,
    HEAD,
    PAUSE,
    PAUSE_BYTES,
    FrameDecoder,
    FrameError,
    Handoff,
    RelayConnection,
    RelayEndpoint,
    RelayError,
    RelayReceiver,
    RelaySender,
    RelayTicket,
    StreamInbox,
    encode_frame,
    encode_head,
    relay_handoff,
    relay_stream,
)

HEAD_ITEM = ResponseHead(
    status=200, headers=(("x-request-id", "r1"),), media_type="text/event-stream"
)


@given(
    frames=st.lists(
        st.tuples(st.integers(0, 2**64 - 1), st.sampled_from([HEAD, DATA, END]), st.binary()),
        max_size=8,
    ),
    cuts=st.lists(st.integers(0, 400), max_size=6),
)
def test_frames_decode_across_any_read_boundaries(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(encode_frame(*f) for f in frames)
    decoder = FrameDecoder()
    out: list[tuple[int, int, bytes]] = []
    start = 0
    for cut in [*sorted({min(c, len(wire)) for c in cuts}), len(wire)]:
        out.extend(decoder.feed(wire[start:cut]))
        start = cut
    assert out == frames


def test_a_bad_frame_is_refused() -> None:
    with pytest.raises(FrameError, match="kind 9"):
        list(FrameDecoder().feed(encode_frame(1, 9, b"")))
    with pytest.raises(FrameError, match="over the limit of 4"):
        list(FrameDecoder(max_payload=4).feed(encode_frame(1, DATA, b"12345")))


async def test_the_inbox_joins_body_chunks_that_wait_together() -> None:
    inbox = StreamInbox(1)
    inbox.push(HEAD_ITEM)
    inbox.push(b"a")
    inbox.push(b"b")
    inbox.push(END_OF_STREAM)
    inbox.push(b"after the end is dropped")
    assert [await inbox.get() for _ in range(3)] == [HEAD_ITEM, b"ab", END_OF_STREAM]


async def _receiver(**kwargs: object) -> RelayReceiver:
    return await RelayReceiver.start(node_id="node-a", **kwargs)  # type: ignore[arg-type]


async def _drain(inbox: StreamInbox) -> list[object]:
    items: list[object] = []
    while True:
        item = await asyncio.wait_for(inbox.get(), 5)
        items.append(item)
        if item is END_OF_STREAM or isinstance(item, BaseException):
            return items


@pytest.mark.parametrize("where", ["unix", "tcp"])
async def test_streams_of_one_pass_leave_in_one_write_and_arrive_in_order(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = await _receiver(tcp_host="127.0.0.1", unix=where == "unix")
    try:
        # A replica on the ingress's node uses the Unix socket; another node uses TCP.
        sender = RelaySender("node-a" if where == "unix" else "node-b")
        (t1, in1), (t2, in2) = receiver.open_stream(), receiver.open_stream()
        conn = await sender.connection(t1.endpoint)
        assert await sender.connection(t2.endpoint) is conn  # one connection per ingress
        writes: list[bytes] = []
        transport = conn._transport
        assert transport is not None
        real_write = transport.write
        monkeypatch.setattr(transport, "write", lambda b: (writes.append(b), real_write(b)))
        for ticket in (t1, t2):  # one "engine step": both streams answered in one pass
            conn.send(ticket.stream, HEAD_ITEM)
            conn.send(ticket.stream, b"data: 1\n\n")
        await asyncio.sleep(0)
        conn.send(t1.stream, b"data: 2\n\n")
        conn.end(t1.stream)
        conn.end(t2.stream)
        # (body chunks waiting together are joined by the inbox)
        assert await _drain(in1) == [HEAD_ITEM, b"data: 1\n\ndata: 2\n\n", END_OF_STREAM]
        assert await _drain(in2) == [HEAD_ITEM, b"data: 1\n\n", END_OF_STREAM]
        assert len(writes) == 2  # two loop passes, two writes for six frames
        sender.close()
    finally:
        receiver.close()


async def test_a_connection_without_the_secret_is_dropped() -> None:
    receiver = await _receiver(tcp_host="127.0.0.1", unix=False)
    try:
        ticket, inbox = receiver.open_stream()
        assert repr(receiver.endpoint.secret) not in repr(ticket)  # never in a log line
        assert ticket.endpoint.tcp is not None
        reader, writer = await asyncio.open_connection(*ticket.endpoint.tcp)
        writer.write(relay.encode_hello(b"x" * relay.SECRET_BYTES, 7))
        writer.write(encode_frame(ticket.stream, HEAD, encode_head(HEAD_ITEM)))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the ingress
        assert not inbox.ended
        assert inbox.bound is None
    finally:
        receiver.close()


async def test_a_lost_connection_fails_the_streams_it_carried() -> None:
    receiver = await _receiver(tcp_host=None)
    try:
        sender = RelaySender("node-a")
        ticket, inbox = receiver.open_stream()
        conn = await sender.connection(ticket.endpoint)
        conn.send(ticket.stream, HEAD_ITEM)
        assert await asyncio.wait_for(inbox.get(), 5) == HEAD_ITEM
        conn.close()
        [error] = await _drain(inbox)
        assert isinstance(error, RelayError)
        # The replica's side: the next send fails, and a new stream gets a new connection.
        await asyncio.sleep(0.05)
        with pytest.raises(RelayError, match="gone"):
            conn.send(ticket.stream, b"late")
        assert await sender.connection(ticket.endpoint) is not conn
    finally:
        receiver.close()


async def test_frames_of_a_closed_stream_are_dropped() -> None:
    receiver = await _receiver(tcp_host=None)
    try:
        sender = RelaySender("node-a")
        (gone, gone_inbox), (kept, kept_inbox) = receiver.open_stream(), receiver.open_stream()
        receiver.close_stream(gone_inbox)  # the client left
        conn = await sender.connection(kept.endpoint)
        for ticket in (gone, kept):
            conn.send(ticket.stream, HEAD_ITEM)
            conn.end(ticket.stream)
        assert await _drain(kept_inbox) == [HEAD_ITEM, END_OF_STREAM]
        assert not gone_inbox.ended
    finally:
        receiver.close()


async def _settled(
    value: object = None, error: BaseException | None = None
) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


async def test_the_calls_outcome_decides_a_stream_without_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = await _receiver(tcp_host=None)
    try:
        # The call failed before any frame: the stream ends with the call's error.
        _, failed = receiver.open_stream()
        boom = RuntimeError("replica raised")
        receiver.call_done(failed, await _settled(error=boom))
        assert await failed.get() is boom
        # The call succeeded first, its frames follow on a live connection.
        sender = RelaySender("node-a")
        ticket, late = receiver.open_stream()
        conn = await sender.connection(ticket.endpoint)
        await asyncio.sleep(0.05)  # the hello is in
        receiver.call_done(late, await _settled(conn.id))
        conn.send(ticket.stream, HEAD_ITEM)
        conn.end(ticket.stream)
        assert await _drain(late) == [HEAD_ITEM, END_OF_STREAM]
        # The call's result came before the connection's hello: the stream waits for it,
        # is bound when the hello comes, and fails when that connection closes.
        ticket, early = receiver.open_stream()
        other = await RelaySender("node-a").connection(ticket.endpoint)
        receiver.call_done(early, await _settled(other.id))  # its hello not read yet
        assert early.bound is None
        assert not early.ended
        await asyncio.sleep(0.05)
        assert early.bound is not None
        other.close()
        assert isinstance(await asyncio.wait_for(early.get(), 5), RelayError)
        # A result naming a connection that has already closed fails at once.
        _, closed = receiver.open_stream()
        receiver.call_done(closed, await _settled(other.id))
        assert isinstance(await closed.get(), RelayError)
        # A connection named by a result that never says hello: the stream gives up.
        monkeypatch.setattr(relay, "HELLO_GRACE_S", 0.01)
        _, orphan = receiver.open_stream()
        receiver.call_done(orphan, await _settled(67890))
        assert "never reached" in str(await asyncio.wait_for(orphan.get(), 5))
    finally:
        receiver.close()


async def test_an_unreachable_ingress_is_a_relay_error_naming_the_way_out() -> None:
    receiver = await _receiver(tcp_host=None)
    endpoint = receiver.endpoint
    receiver.close()
    with pytest.raises(RelayError, match="stream_relay: serve"):
        # Another node, and no TCP listener: nothing to connect to.
        await RelaySender("node-b").connection(endpoint)
    with pytest.raises(RelayError, match="unix socket"):
        await RelaySender("node-a").connection(endpoint)


async def test_a_connection_is_made_once_for_concurrent_first_streams() -> None:
    receiver = await _receiver(tcp_host=None)
    try:
        sender = RelaySender("node-a")
        conns = await asyncio.gather(*(sender.connection(receiver.endpoint) for _ in range(5)))
        assert len({id(c) for c in conns}) == 1
        assert isinstance(conns[0], RelayConnection)
    finally:
        receiver.close()


def test_the_relay_works_on_uvloop() -> None:
    # Ray Serve runs replicas on uvloop, whose transports are not asyncio.Transport
    # subclasses (a check for that once dropped every connection there).
    import uvloop  # noqa: PLC0415

    async def exchange() -> list[object]:
        receiver = await _receiver(tcp_host="127.0.0.1")
        try:
            ticket, inbox = receiver.open_stream()
            conn = await RelaySender("node-a").connection(ticket.endpoint)
            conn.send(ticket.stream, HEAD_ITEM)
            conn.send(ticket.stream, b"x")
            conn.end(ticket.stream)
            return await _drain(inbox)
        finally:
            receiver.close()

    assert uvloop.run(exchange()) == [HEAD_ITEM, b"x", END_OF_STREAM]


async def test_a_large_body_is_split_into_frames_and_arrives_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "DATA_FRAME_BYTES", 1000)
    receiver = await _receiver(tcp_host=None)
    try:
        ticket, inbox = receiver.open_stream()
        conn = await RelaySender("node-a").connection(ticket.endpoint)
        frames: list[bytes] = []
        real_write = conn._write
        monkeypatch.setattr(conn, "_write", lambda f: (frames.append(f), real_write(f)))
        body = bytes(range(256)) * 20  # 5,120 bytes
        conn.send(ticket.stream, HEAD_ITEM)
        conn.send(ticket.stream, body)
        conn.end(ticket.stream)
        assert len(frames) == 1 + 6 + 1
        assert await _drain(inbox) == [HEAD_ITEM, body, END_OF_STREAM]
    finally:
        receiver.close()


async def test_the_receiver_closes_from_another_thread() -> None:
    # Serve may call an ingress replica's __del__ off the loop that serves it.
    receiver = await _receiver(tcp_host="127.0.0.1")
    ticket, _ = receiver.open_stream()
    unix_path = ticket.endpoint.unix_path
    assert unix_path is not None
    await asyncio.to_thread(receiver.close)
    await asyncio.sleep(0.05)
    assert not os.path.exists(unix_path)
    assert ticket.endpoint.tcp is not None
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(*ticket.endpoint.tcp)


async def test_a_connection_that_never_says_hello_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "HELLO_TIMEOUT_S", 0.05)
    receiver = await _receiver(tcp_host="127.0.0.1", unix=False)
    try:
        assert receiver.endpoint.tcp is not None
        reader, _ = await asyncio.open_connection(*receiver.endpoint.tcp)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the ingress
    finally:
        receiver.close()


class Engine:
    """A stream of ``n`` body chunks that counts how many were pulled (one loop pass each,
    as an engine step is)."""

    def __init__(self, n: int, size: int = 4096) -> None:
        self.n, self.size, self.pulled = n, size, 0

    async def items(self, tag: bytes) -> AsyncIterator[ResponseHead | bytes]:
        yield HEAD_ITEM
        for i in range(self.n):
            await asyncio.sleep(0)
            self.pulled += 1
            yield tag + i.to_bytes(4, "big") + b"." * (self.size - len(tag) - 4)

    def body(self, tag: bytes) -> bytes:
        return b"".join(
            tag + i.to_bytes(4, "big") + b"." * (self.size - len(tag) - 4) for i in range(self.n)
        )


async def _whole(inbox: StreamInbox) -> list[object]:
    """A stream read to its end, its body chunks joined (they arrive as they come)."""
    items = await _drain(inbox)
    body = [i for i in items if isinstance(i, bytes)]
    return [items[0], b"".join(body), items[-1]] if body else items


async def _pulled_settles(engine: Engine) -> int:
    before = -1
    while engine.pulled != before:
        before = engine.pulled
        await asyncio.sleep(0.05)
    return before


async def test_a_slow_reader_pauses_its_stream_only_and_loses_nothing() -> None:
    receiver = await _receiver(tcp_host=None)
    sender = RelaySender("node-a")
    try:
        (t_slow, slow), (t_fast, fast) = receiver.open_stream(), receiver.open_stream()
        e_slow, e_fast = Engine(400), Engine(400)  # 1.6 MiB each, 6x the pause threshold
        s_task = asyncio.create_task(relay_stream(sender, t_slow, e_slow.items(b"s")))
        f_task = asyncio.create_task(relay_stream(sender, t_fast, e_fast.items(b"f")))
        # The other stream on the same connection runs to its end meanwhile.
        assert await _whole(fast) == [HEAD_ITEM, e_fast.body(b"f"), END_OF_STREAM]
        await f_task
        # Nobody reads the slow one: its relay stopped pulling from its engine.
        held = await _pulled_settles(e_slow)
        assert held * e_slow.size < PAUSE_BYTES + 256 * 1024 < e_slow.n * e_slow.size
        assert slow.paused
        assert not s_task.done()
        # Reading it resumes it; every byte arrives, in order.
        assert await _whole(slow) == [HEAD_ITEM, e_slow.body(b"s"), END_OF_STREAM]
        await asyncio.wait_for(s_task, 5)
        assert e_slow.pulled == e_slow.n
    finally:
        sender.close()
        receiver.close()


async def test_a_paused_stream_fails_when_its_connection_drops() -> None:
    receiver = await _receiver(tcp_host=None)
    sender = RelaySender("node-a")
    try:
        ticket, inbox = receiver.open_stream()
        engine = Engine(400)
        task = asyncio.create_task(relay_stream(sender, ticket, engine.items(b"s")))
        await _pulled_settles(engine)
        assert inbox.paused
        receiver.close()
        with pytest.raises(RelayError):
            await asyncio.wait_for(task, 5)
        assert engine.pulled < engine.n  # the engine's stream was closed, not run out
    finally:
        sender.close()
        receiver.close()


async def test_the_replica_ignores_a_late_pause_and_drops_a_bad_frame() -> None:
    receiver = await _receiver(tcp_host=None)
    sender = RelaySender("node-a")
    try:
        ticket, _ = receiver.open_stream()
        conn = await sender.connection(ticket.endpoint)
        conn.data_received(encode_frame(ticket.stream, PAUSE))  # no such stream being sent
        assert not conn.paused(ticket.stream)
        conn.data_received(encode_frame(ticket.stream, DATA, b""))  # the ingress never sends it
        await asyncio.sleep(0.05)
        assert conn.lost is not None
    finally:
        sender.close()
        receiver.close()


def test_only_a_replica_on_the_ingresss_node_may_hand_a_stream_off() -> None:
    # the ingress reads a handed-off stream from the engine server's Unix socket: only a
    # replica on its Ray node (one host or pod) shares that file system
    here = RelayEndpoint("node-a", b"s", unix_path="/tmp/r/s", tcp=("10.0.0.1", 1))
    tcp_only = RelayEndpoint("node-a", b"s", tcp=("10.0.0.1", 1))
    sender = RelaySender("node-a")
    assert sender.can_hand_off(RelayTicket(here, 1, handoff=True))
    assert not sender.can_hand_off(RelayTicket(here, 1))  # the ingress did not ask
    assert not RelaySender("node-b").can_hand_off(RelayTicket(here, 1, handoff=True))
    assert not sender.can_hand_off(RelayTicket(tcp_only, 1, handoff=True))


async def test_a_handoff_is_the_streams_last_frame_and_its_release_ends_the_hold() -> None:
    receiver = await _receiver(tcp_host=None)
    try:
        sender = RelaySender("node-a")
        ticket, inbox = receiver.open_stream(handoff=True)
        assert ticket.handoff
        hold = asyncio.ensure_future(relay_handoff(sender, ticket, "/run/engine/vllm.sock"))
        assert await asyncio.wait_for(inbox.get(), 5) == Handoff("/run/engine/vllm.sock")
        await asyncio.sleep(0.05)
        assert not hold.done()  # held until released
        inbox.release(finished=True)
        conn_id, finished = await asyncio.wait_for(hold, 5)
        assert finished
        assert conn_id == (await sender.connection(ticket.endpoint)).id
        # a stream left before its end is released as such
        ticket, inbox = receiver.open_stream(handoff=True)
        hold = asyncio.ensure_future(relay_handoff(sender, ticket, "/x"))
        await asyncio.wait_for(inbox.get(), 5)
        inbox.release(finished=False)
        assert (await asyncio.wait_for(hold, 5))[1] is False
        # a late release (the call was cancelled meanwhile) is ignored
        inbox.release(finished=True)
        await asyncio.sleep(0.05)
        assert not (await sender.connection(ticket.endpoint)).lost
    finally:
        receiver.close()
