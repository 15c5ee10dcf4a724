"""The stream relay: every stream from a model replica to an ingress over one connection.

Design note. Serve's streaming call carries one gRPC message per item per stream, and on the
hot path an item is one SSE event: a replica running 32 streams sends 32 messages per engine
step and the ingress receives 32. That per-message work (gRPC core, event-loop wake-ups,
Serve's wrappers) was most of the serving layer's CPU per streamed token
(docs/benchmarks.md, serving path), while vLLM's own API server gets one message per engine
step for all of its streams. The relay gives the Ray hop the same shape:

* The request still goes through Serve: a ``DeploymentHandle`` call that lasts as long as
  its stream (a streaming call with one item at its end: see ModelServer.handle_relayed).
  Routing (our request routers), ``max_ongoing_requests``, Serve's queue and its
  back-pressure errors, autoscaling metrics and cancellation all stay Serve's.
* The response goes over one connection per (replica process, ingress process) as frames
  (:class:`FrameDecoder`); the frames a replica writes in one event-loop pass leave in one
  write at the end of that pass. The streams of an engine step are answered in the same
  pass, so a step's tokens for all streams travel together, and nothing waits on a timer:
  a lone first token leaves at the end of the pass that produced it.
* The ingress listens on a Unix socket (for replicas on its Ray node, i.e. its pod) and on
  TCP at its node's address (for the others). A connection must open with the ingress's
  secret (random per ingress process, handed to the replica inside the Serve call), so
  nothing else on the network can write into a stream.
* Outcome and failure: the Serve call's outcome is the stream's. An error raised on the
  replica, a replica that dies, Serve's back-pressure: the call fails and the ingress raises
  as it did over Serve's stream. A relay connection that drops fails every stream bound to
  it. Cancellation: the ingress cancels the call, Serve cancels the replica's handler, which
  closes the engine's stream (vLLM aborts the request); frames still in flight for a closed
  stream are dropped.

Handoff (``server.stream_handoff``, on by default): a replica whose engine has an HTTP
server of its own (``frontend: process``, a ``vllm serve`` beside it on a Unix socket) on
the ingress's Ray node sends, instead of the stream, one HANDOFF frame naming the server's
socket. The ingress sends the request there and reads the response itself - every token
one process hop and one event-loop pass fewer - and sends RELEASE when the stream ended
(read to its end or left). The replica's call lasts until then, so Serve's slot, its
ongoing counts (routing, autoscaling) and cancellation stay as above; the replica admits
the request (refusing it, as before, when its engine is dead) and the ingress's client
leaving closes its connection to the server, which is vLLM's own abort. Only on one node:
a Ray node is one host or pod, so the ingress sees the socket's file.

Flow control per stream, never per connection: when a stream's unread body at the ingress
passes :data:`PAUSE_BYTES` (its HTTP client reads slower than the engine writes), the
ingress sends that stream's PAUSE back on the connection and the replica stops pulling the
stream from its engine until RESUME (unread bytes down to :data:`RESUME_BYTES`). The
connection's other streams keep flowing; the engine's side holds its own bounded buffer
(engine/asgi_bridge.py) and then vLLM merges the stream's outputs until it is read again.
So a slow or stalled reader holds at most about ``PAUSE_BYTES`` plus the frames in flight
in the ingress, whatever its ``max_tokens`` (Serve's own streaming calls have no such
bound).

What must stay true: one stream's frames are written in order on one connection; a replica
returns from the call only after the stream's END frame is queued on that connection (the
call's result names it, so a stream whose frames were all lost is still failed); the ingress
trusts a frame only from a connection that presented the secret; a pause holds one stream,
never the connection (that would stall every other stream on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import shutil
import struct
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from fleetserve.engine.protocol import ResponseHead
from fleetserve.errors import ServeError
from fleetserve.observe.timeline import TIMELINE

logger = logging.getLogger(__name__)

#: Frame header: stream id (u64), kind (u8), payload length (u32), little-endian.
_HEADER = struct.Struct("<QBI")
HEADER_BYTES = _HEADER.size
#: The first frame of a connection: payload = the ingress's secret + the connection's id.
HELLO = 0
#: A stream's :class:`ResponseHead` (JSON: status, media type, headers).
HEAD = 1
#: Body bytes of a stream.
DATA = 2
#: A stream's last frame (empty payload).
END = 3
#: Ingress to replica: stop pulling this stream from the engine (empty payload).
PAUSE = 4
#: Ingress to replica: go on with this stream (empty payload).
RESUME = 5
#: Replica to ingress: read this stream from the engine's own server (payload: the path
#: of its Unix socket); the stream's last frame from the replica.
HANDOFF = 6
#: Ingress to replica: a handed-off stream ended (payload: one byte, 1 when it was read to
#: its end, 0 when its client left or it failed).
RELEASE = 7
_KINDS = frozenset({HELLO, HEAD, DATA, END, PAUSE, RESUME, HANDOFF, RELEASE})
#: Unread body bytes of one stream at the ingress that pause it at the replica; about a
#: thousand streamed tokens (an SSE event is ~250 bytes), far more than a reader that keeps
#: up ever holds, so only a slow or stalled reader meets it.
PAUSE_BYTES = 256 * 1024
#: Unread body bytes at or below which a paused stream resumes (hysteresis: a reader at
#: the line does not send a PAUSE and a RESUME per chunk).
RESUME_BYTES = 64 * 1024
#: A stream whose call ended well waits this long for the hello of the connection its
#: frames come on (both left the replica before the call's result; the result can still
#: arrive first). A connection that never says hello then cannot deliver them.
HELLO_GRACE_S = 30.0
#: Seconds a new connection has to present the secret (a replica sends it at once).
HELLO_TIMEOUT_S = 10.0
#: Ids of closed connections remembered (a call's result may name one after it closed).
_CLOSED_IDS_KEPT = 4096
SECRET_BYTES = 32
_CONN_ID = struct.Struct("<Q")
#: Largest frame payload the ingress accepts (a connection sending more is dropped, with
#: every stream on it).
MAX_FRAME_BYTES = 1 << 30
#: Body bytes per DATA frame: a larger item (a big non-streamed response) is split, so one
#: response can never reach MAX_FRAME_BYTES and take its connection's other streams down.
DATA_FRAME_BYTES = 1 << 24


class RelayError(ServeError):
    """A relay connection failed or was refused (the stream cannot be delivered)."""


class FrameError(RelayError):
    """Bytes on a relay connection that are not a valid frame."""


@dataclass(frozen=True, slots=True)
class RelayEndpoint:
    """Where an ingress process listens; the same for all of its streams."""

    node_id: str
    secret: bytes = field(repr=False)  # never in a log line
    unix_path: str | None = None
    tcp: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class RelayTicket:
    """Where a replica sends one stream's frames (travels inside the Serve call)."""

    endpoint: RelayEndpoint
    stream: int
    #: The ingress reads the stream from the engine's own server when the replica offers
    #: it (server.stream_handoff; only a replica on the ingress's node can).
    handoff: bool = False


# --- frames (pure) ---------------------------------------------------------------------


def encode_frame(stream: int, kind: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(stream, kind, len(payload)) + payload


def encode_head(head: ResponseHead) -> bytes:
    return json.dumps([head.status, head.media_type, head.headers]).encode()


def decode_head(payload: bytes) -> ResponseHead:
    try:
        status, media_type, headers = json.loads(payload)
        return ResponseHead(
            status=int(status),
            headers=tuple((str(k), str(v)) for k, v in headers),
            media_type=str(media_type),
        )
    except (ValueError, TypeError) as e:
        raise FrameError(f"bad response head on the relay: {e}") from e


def encode_hello(secret: bytes, conn_id: int) -> bytes:
    return encode_frame(0, HELLO, secret + _CONN_ID.pack(conn_id))


class FrameDecoder:
    """Splits a byte stream into ``(stream, kind, payload)`` frames, across reads."""

    def __init__(self, max_payload: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        #: Largest payload accepted; read per frame, so it may change between frames.
        self.max_payload = max_payload

    def feed(self, data: bytes) -> Iterator[tuple[int, int, bytes]]:
        """The frames completed by ``data`` (FrameError on a bad header)."""
        buf = self._buf
        buf += data
        offset = 0
        end = len(buf)
        try:
            while end - offset >= HEADER_BYTES:
                stream, kind, length = _HEADER.unpack_from(buf, offset)
                if kind not in _KINDS:
                    raise FrameError(f"unknown relay frame kind {kind}")
                if length > self.max_payload:
                    raise FrameError(
                        f"relay frame of {length} bytes is over the limit of {self.max_payload}"
                    )
                start = offset + HEADER_BYTES
                if end - start < length:
                    break
                offset = start + length
                yield stream, kind, bytes(buf[start:offset])
        finally:
            del buf[:offset]


# --- the ingress's end -----------------------------------------------------------------


class _End:
    """The item after a stream's last byte."""


END_OF_STREAM = _End()


@dataclass(frozen=True, slots=True)
class Handoff:
    """The replica handed the stream over: read it from the engine's server on
    ``socket_path`` and :meth:`StreamInbox.release` it when done. Nothing follows it."""

    socket_path: str


#: What :meth:`StreamInbox.get` returns: a head, body bytes (already joined when several
#: were waiting), the end, a handoff, or the error that ended the stream.
InboxItem = ResponseHead | bytes | _End | Handoff | BaseException


class StreamInbox:
    """One stream's items at the ingress, in order; one reader.

    Cheaper than an ``asyncio.Queue`` (no getter/putter bookkeeping), and it joins body
    chunks that are waiting together into one item: under load the ingress then writes to
    its HTTP client once per wake-up, not once per token.
    """

    __slots__ = ("_items", "_unread", "_waiter", "bound", "ended", "paused", "stream")

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self._items: deque[InboxItem] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: Body bytes pushed and not yet read (flow control, see the module note).
        self._unread = 0
        #: The connection its frames come on (set by its first frame or by the call's result).
        self.bound: _IngressConnection | None = None
        #: An END or an error was pushed: nothing after it matters.
        self.ended = False
        #: A PAUSE was sent for it and no RESUME since.
        self.paused = False

    def push(self, item: InboxItem) -> None:
        if self.ended:
            return
        if isinstance(item, bytes):
            self._unread += len(item)
            if self._unread > PAUSE_BYTES and not self.paused and self.bound is not None:
                self.paused = self.bound.control(self.stream, PAUSE)
        elif isinstance(item, _End | Handoff | BaseException):
            self.ended = True
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> InboxItem:
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if not isinstance(item, bytes):
            return item
        if items and isinstance(items[0], bytes):
            parts = [item]
            while items and isinstance(items[0], bytes):
                parts.append(items.popleft())  # type: ignore[arg-type]
            item = b"".join(parts)
        self._unread -= len(item)
        if self.paused and self._unread <= RESUME_BYTES and self.bound is not None:
            self.bound.control(self.stream, RESUME)
            self.paused = False
        return item

    def release(self, finished: bool) -> None:
        """Tell the replica a handed-off stream ended, so its call (Serve's slot for the
        request) ends too. Nothing to tell when the connection is gone: the replica's
        wait ended with it."""
        if self.bound is not None:
            self.bound.control(self.stream, RELEASE, b"\x01" if finished else b"\x00")


class RelayReceiver:
    """The ingress's end: its listeners, its open streams and the replicas' connections."""

    def __init__(self, node_id: str, secret: bytes) -> None:
        self._secret = secret
        #: Where replicas reach this receiver (complete once :meth:`start` has listened).
        self.endpoint = RelayEndpoint(node_id, secret)
        self._servers: list[asyncio.AbstractServer] = []
        self._unix_dir: str | None = None
        self._streams: dict[int, StreamInbox] = {}
        self._connections: dict[int, _IngressConnection] = {}
        #: Streams whose call named a connection not yet seen, by that connection's id.
        self._awaiting: dict[int, list[StreamInbox]] = {}
        self._closed_ids: dict[int, None] = {}  # insertion-ordered, bounded
        self._next_stream = 1
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def start(cls, *, node_id: str, tcp_host: str | None, unix: bool = True) -> RelayReceiver:
        """Listen on a private Unix socket (unless ``unix`` is False or the temp directory
        is not writable) and on ``tcp_host`` (any free port; none when ``tcp_host`` is
        None). At least one listener must start."""
        receiver = cls(node_id, secrets.token_bytes(SECRET_BYTES))
        loop = receiver._loop = asyncio.get_running_loop()
        unix_path = None
        if unix:
            try:
                receiver._unix_dir = tempfile.mkdtemp(prefix="fleetserve-relay-")  # mode 0700
                unix_path = os.path.join(receiver._unix_dir, "s")
                receiver._servers.append(
                    await loop.create_unix_server(lambda: _IngressConnection(receiver), unix_path)
                )
            except OSError as e:
                logger.info("relay: no Unix socket (%s); replicas connect over TCP", e)
                receiver._remove_unix_dir()
                unix_path = None
        tcp = None
        if tcp_host is not None:
            try:
                server = await loop.create_server(lambda: _IngressConnection(receiver), tcp_host, 0)
            except OSError as e:
                logger.warning("relay: cannot listen on %s (%s)", tcp_host, e)
            else:
                receiver._servers.append(server)
                tcp = (tcp_host, int(server.sockets[0].getsockname()[1]))
        if not receiver._servers:
            raise RelayError("the stream relay could not listen on a Unix socket or on TCP")
        receiver.endpoint = RelayEndpoint(node_id, receiver._secret, unix_path, tcp)
        return receiver

    def _remove_unix_dir(self) -> None:
        if self._unix_dir is not None:
            shutil.rmtree(self._unix_dir, ignore_errors=True)
            self._unix_dir = None

    def open_stream(self, *, handoff: bool = False) -> tuple[RelayTicket, StreamInbox]:
        """A new stream's ticket (for the replica) and inbox; ``handoff``: the replica may
        hand it over (:class:`Handoff`)."""
        stream = self._next_stream
        self._next_stream += 1
        inbox = StreamInbox(stream)
        self._streams[stream] = inbox
        return RelayTicket(self.endpoint, stream, handoff), inbox

    def close_stream(self, inbox: StreamInbox) -> None:
        self._streams.pop(inbox.stream, None)
        if inbox.bound is not None:
            inbox.bound.streams.discard(inbox)

    def call_done(self, inbox: StreamInbox, call: asyncio.Future[Any]) -> None:
        """The Serve call of ``inbox``'s stream ended: fail the stream with its error, or,
        on success (the replica queued every frame), make sure the connection it names
        either delivers the END frame or fails the stream."""
        if call.cancelled():
            return
        error = call.exception()
        if error is not None:
            if not inbox.ended:
                inbox.push(error)
            elif self._streams.get(inbox.stream) is inbox:
                logger.warning("relay: stream ended, then its call failed: %r", error)
            return
        if inbox.ended or inbox.bound is not None:
            return  # its frames came: a lost connection fails it (connection_lost)
        conn_id = call.result()
        conn = self._connections.get(conn_id)
        if conn is not None:
            self._bind(inbox, conn)
        elif conn_id in self._closed_ids:
            inbox.push(RelayError("the relay connection of the stream closed"))
        else:
            # The connection's hello is still on its way (the result came first).
            self._awaiting.setdefault(conn_id, []).append(inbox)
            asyncio.get_running_loop().call_later(HELLO_GRACE_S, self._give_up, inbox)

    def _give_up(self, inbox: StreamInbox) -> None:
        if inbox.bound is None and not inbox.ended:
            inbox.push(RelayError("the relay connection of the stream never reached the ingress"))

    @staticmethod
    def _bind(inbox: StreamInbox, conn: _IngressConnection) -> None:
        inbox.bound = conn
        conn.streams.add(inbox)

    def _connected(self, conn_id: int, conn: _IngressConnection) -> None:
        self._connections[conn_id] = conn
        for inbox in self._awaiting.pop(conn_id, ()):
            if inbox.bound is None and not inbox.ended:
                self._bind(inbox, conn)

    def _disconnected(self, conn_id: int, conn: _IngressConnection) -> None:
        if conn_id in self._connections and self._connections[conn_id] is conn:
            del self._connections[conn_id]
        self._closed_ids[conn_id] = None
        if len(self._closed_ids) > _CLOSED_IDS_KEPT:
            del self._closed_ids[next(iter(self._closed_ids))]
        for inbox in self._awaiting.pop(conn_id, ()):
            inbox.push(RelayError("the relay connection of the stream closed"))

    def _frame(self, conn: _IngressConnection, stream: int, kind: int, payload: bytes) -> None:
        inbox = self._streams.get(stream)
        if inbox is None:
            return  # a stream the ingress closed (client gone): its late frames are dropped
        if inbox.bound is None:
            self._bind(inbox, conn)
        if kind == DATA:
            inbox.push(payload)
        elif kind == HEAD:
            inbox.push(decode_head(payload))
        elif kind == END:
            inbox.push(END_OF_STREAM)
            conn.streams.discard(inbox)
        elif kind == HANDOFF:
            # Past this the stream is read from the engine's server; a lost relay
            # connection no longer fails it (the inbox stays bound: its release goes there).
            inbox.push(Handoff(payload.decode(errors="replace")))
            conn.streams.discard(inbox)
        else:
            raise FrameError(f"relay frame kind {kind} after the hello")

    def close(self) -> None:
        """Stop listening and drop every connection (the ingress is shutting down). Safe
        from any thread: Serve may shut a replica down off the loop that serves."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._close_now)
                return
        self._close_now()

    def _close_now(self) -> None:
        for server in self._servers:
            server.close()
        for conn in list(self._connections.values()):
            conn.abort(RelayError("the ingress's relay was closed"))
        self._remove_unix_dir()


class _IngressConnection(asyncio.Protocol):
    """One replica's connection, at the ingress."""

    def __init__(self, receiver: RelayReceiver) -> None:
        self._receiver = receiver
        self._decoder = FrameDecoder(max_payload=SECRET_BYTES + _CONN_ID.size)
        self._transport: asyncio.Transport | None = None
        self._id: int | None = None
        self.streams: set[StreamInbox] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (Ray Serve's loop) are not asyncio.Transport subclasses.
        self._transport = cast(asyncio.Transport, transport)
        # A connection that does not say hello in time is dropped: the listeners are open
        # to the node's network, and a silent connection must not be held for ever.
        asyncio.get_running_loop().call_later(HELLO_TIMEOUT_S, self._hello_deadline)

    def _hello_deadline(self) -> None:
        if self._id is None and self._transport is not None and not self._transport.is_closing():
            logger.warning("relay: dropping a connection that did not say hello")
            self.abort(RelayError("no hello in time"))

    def data_received(self, data: bytes) -> None:
        try:
            for stream, kind, payload in self._decoder.feed(data):
                if self._id is None:
                    self._hello(kind, payload)
                else:
                    self._receiver._frame(self, stream, kind, payload)
        except RelayError as e:
            logger.warning("relay: dropping a connection: %s", e)
            self.abort(e)

    def _hello(self, kind: int, payload: bytes) -> None:
        secret = payload[:SECRET_BYTES]
        if (
            kind != HELLO
            or len(payload) != SECRET_BYTES + _CONN_ID.size
            or not hmac.compare_digest(secret, self._receiver._secret)
        ):
            raise RelayError("a connection did not present the relay's secret")
        (conn_id,) = _CONN_ID.unpack(payload[SECRET_BYTES:])
        if conn_id in self._receiver._connections:
            raise RelayError("a connection reused another's id")
        self._id = conn_id
        self._receiver._connected(conn_id, self)
        # Past the hello, frames carry response bodies.
        self._decoder.max_payload = MAX_FRAME_BYTES

    def control(self, stream: int, kind: int, payload: bytes = b"") -> bool:
        """Send ``stream``'s PAUSE, RESUME or RELEASE to the replica; False when the
        connection is gone (its streams are failed then, nothing is left to tell)."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._id is None:
            return False
        transport.write(encode_frame(stream, kind, payload))
        return True

    def abort(self, error: BaseException) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._fail(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RelayError(f"a replica's relay connection closed ({exc or 'EOF'})"))

    def _fail(self, error: BaseException) -> None:
        if self._id is not None:
            self._receiver._disconnected(self._id, self)
        streams, self.streams = self.streams, set()
        for inbox in streams:
            inbox.push(error)


# --- the replica's end -----------------------------------------------------------------


class RelaySender:
    """The replica's end: one connection per ingress endpoint, shared by its streams."""

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._connections: dict[RelayEndpoint, asyncio.Future[RelayConnection]] = {}

    async def connection(self, endpoint: RelayEndpoint) -> RelayConnection:
        """The open connection to ``endpoint`` (made on first use; RelayError if it cannot)."""
        pending = self._connections.get(endpoint)
        if pending is not None:
            if not pending.done():
                return await asyncio.shield(pending)
            if pending.exception() is None and not pending.result().lost:
                return pending.result()
        loop = asyncio.get_running_loop()
        pending = loop.create_future()
        self._connections[endpoint] = pending
        try:
            conn = await self._connect(endpoint)
        except BaseException as e:
            if self._connections.get(endpoint) is pending:
                del self._connections[endpoint]
            error = e if isinstance(e, RelayError) else RelayError(str(e))
            pending.set_exception(error)
            pending.exception()  # retrieved: waiters re-raise it, nobody else must
            raise error from e
        conn.on_lost = lambda: self._forget(endpoint, pending)
        pending.set_result(conn)
        return conn

    def _forget(self, endpoint: RelayEndpoint, pending: asyncio.Future[RelayConnection]) -> None:
        if self._connections.get(endpoint) is pending:
            del self._connections[endpoint]

    async def _connect(self, endpoint: RelayEndpoint) -> RelayConnection:
        loop = asyncio.get_running_loop()
        errors = []
        if endpoint.unix_path is not None and endpoint.node_id == self._node_id:
            try:
                _, conn = await loop.create_unix_connection(RelayConnection, endpoint.unix_path)
            except OSError as e:
                errors.append(f"unix socket: {e}")
            else:
                conn.hello(endpoint.secret)
                return conn
        if endpoint.tcp is not None:
            try:
                _, conn = await loop.create_connection(RelayConnection, *endpoint.tcp)
            except OSError as e:
                errors.append(f"{endpoint.tcp[0]}:{endpoint.tcp[1]}: {e}")
            else:
                conn.hello(endpoint.secret)
                return conn
        raise RelayError(
            "cannot reach the ingress's stream relay ("
            + ("; ".join(errors) or "no address for another node")
            + "); Ray pods must reach each other on any port, or set "
            "server.stream_relay: serve"
        )

    def can_hand_off(self, ticket: RelayTicket) -> bool:
        """Whether ``ticket``'s ingress may read the stream from an engine's server on this
        node itself: it asked for it and listens on this node (a Ray node is one host or
        pod, so it sees the server's socket)."""
        endpoint = ticket.endpoint
        return (
            ticket.handoff and endpoint.unix_path is not None and endpoint.node_id == self._node_id
        )

    def close(self) -> None:
        for pending in self._connections.values():
            if pending.done() and pending.exception() is None:
                pending.result().close()
        self._connections.clear()


async def relay_stream(
    sender: RelaySender, ticket: RelayTicket, items: AsyncIterator[ResponseHead | bytes]
) -> int:
    """Send one stream's items to ``ticket``'s ingress; returns the connection's id.

    The replica's whole part of a relayed request: the END frame is queued when this
    returns. On any exit other than the end of ``items`` (cancellation by Serve, a lost
    connection) ``items`` is closed at once, not at garbage collection: that is what aborts
    the request in the engine.
    """
    stream = ticket.stream
    timeline = TIMELINE if TIMELINE.enabled else None
    if timeline is not None:
        timeline.point(stream, "r_recv")
    conn = await sender.connection(ticket.endpoint)
    conn.open(stream)
    it = aiter(items)
    marked = 0  # timeline points passed: the head, then the first body bytes
    try:
        while True:
            if conn.paused(stream):  # its reader is behind: leave the rest in the engine
                await conn.resumed(stream)
            try:
                item = await anext(it)
            except StopAsyncIteration:
                break
            if timeline is not None and marked < 2:
                marked = 2 if isinstance(item, bytes) else 1
                timeline.point(stream, "r_data" if marked == 2 else "r_head")
            conn.send(stream, item)
    finally:
        conn.forget(stream)
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()
    conn.end(stream)
    if timeline is not None:
        timeline.point(stream, "r_end")
    return conn.id


async def relay_handoff(
    sender: RelaySender, ticket: RelayTicket, socket_path: str
) -> tuple[int, bool]:
    """Hand one stream to ``ticket``'s ingress, which reads it from the engine's server on
    ``socket_path`` itself; returns the connection's id and whether the stream was read to
    its end, once the ingress released it.

    The replica's whole part of a handed-off request is to hold it - Serve's slot, its
    in-flight count - until then. A lost connection ends the wait (not read to its end:
    the ingress that would read it is gone with it); cancellation by Serve propagates.
    """
    stream = ticket.stream
    timeline = TIMELINE if TIMELINE.enabled else None
    if timeline is not None:
        timeline.point(stream, "r_recv")
    conn = await sender.connection(ticket.endpoint)
    released = conn.await_release(stream)
    try:
        conn.handoff(stream, socket_path)
        if timeline is not None:
            timeline.point(stream, "r_handoff")
        finished = await released
    finally:
        conn.forget(stream)
    if timeline is not None:
        timeline.point(stream, "r_end")
    return conn.id, finished


class RelayConnection(asyncio.Protocol):
    """A replica's connection to one ingress; frames written in a loop pass leave together."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self.id = secrets.randbits(64)
        self.lost: BaseException | None = None
        self.on_lost: Callable[[], None] | None = None
        # The ingress writes only PAUSE, RESUME (empty) and RELEASE (one byte) frames.
        self._decoder = FrameDecoder(max_payload=1)
        #: Streams being relayed now (a PAUSE for any other is late and ignored).
        self._active: set[int] = set()
        #: Paused streams, with the future their relay waits on (None: nobody waits yet).
        self._paused: dict[int, asyncio.Future[None] | None] = {}
        #: Handed-off streams, with the future their wait for a RELEASE is on.
        self._handed_off: dict[int, asyncio.Future[bool]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (Ray Serve's loop) are not asyncio.Transport subclasses.
        self._transport = cast(asyncio.Transport, transport)

    def hello(self, secret: bytes) -> None:
        self._write(encode_hello(secret, self.id))

    def send(self, stream: int, item: ResponseHead | bytes) -> None:
        """Queue a head or body frame of ``stream`` (RelayError when the connection is gone)."""
        if isinstance(item, ResponseHead):
            self._write(encode_frame(stream, HEAD, encode_head(item)))
            return
        # One frame for a usual item (a whole-bytes slice is the object itself, no copy).
        for start in range(0, len(item), DATA_FRAME_BYTES):
            self._write(encode_frame(stream, DATA, item[start : start + DATA_FRAME_BYTES]))

    def end(self, stream: int) -> None:
        self._write(encode_frame(stream, END))

    def await_release(self, stream: int) -> asyncio.Future[bool]:
        """The future a RELEASE of ``stream`` settles (with whether it was read to its
        end); False at once when the connection is gone."""
        released = self._loop.create_future()
        if self.lost is not None:
            released.set_result(False)
        else:
            self._handed_off[stream] = released
        return released

    def handoff(self, stream: int, socket_path: str) -> None:
        """Queue ``stream``'s HANDOFF (RelayError when the connection is gone)."""
        self._write(encode_frame(stream, HANDOFF, socket_path.encode()))

    def _write(self, frame: bytes) -> None:
        if self.lost is not None:
            raise RelayError(f"the relay connection to the ingress is gone ({self.lost})")
        if not self._pending:
            # Once per loop pass: every frame queued until then leaves in one write.
            self._loop.call_soon(self._flush)
        self._pending.append(frame)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if self._transport is not None and self.lost is None and pending:
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def open(self, stream: int) -> None:
        self._active.add(stream)

    def forget(self, stream: int) -> None:
        self._active.discard(stream)
        self._handed_off.pop(stream, None)
        self._wake(stream)

    def paused(self, stream: int) -> bool:
        return stream in self._paused

    async def resumed(self, stream: int) -> None:
        """Wait until ``stream`` is not paused (or the connection is gone: the next send
        then raises)."""
        while stream in self._paused and self.lost is None:
            waiter = self._paused[stream]
            if waiter is None:
                waiter = self._paused[stream] = self._loop.create_future()
            await waiter

    def _wake(self, stream: int) -> None:
        waiter = self._paused.pop(stream, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            for stream, kind, payload in self._decoder.feed(data):
                if kind == PAUSE:
                    if stream in self._active:
                        self._paused.setdefault(stream, None)
                elif kind == RESUME:
                    self._wake(stream)
                elif kind == RELEASE:
                    self._released(stream, payload == b"\x01")
                else:
                    raise FrameError(f"relay frame kind {kind} from the ingress")
        except RelayError as e:
            logger.warning("relay: closing the connection to the ingress: %s", e)
            if self._transport is not None:
                self._transport.abort()

    def _released(self, stream: int, finished: bool) -> None:
        released = self._handed_off.pop(stream, None)  # a late one (call cancelled): None
        if released is not None and not released.done():
            released.set_result(finished)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or RelayError("closed by the ingress")
        self._pending = []
        for stream in list(self._paused):
            self._wake(stream)
        for stream in list(self._handed_off):
            self._released(stream, False)
        if self.on_lost is not None:
            self.on_lost()

    def close(self) -> None:
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._flush()
            self._transport.close()
