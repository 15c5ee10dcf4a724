"""Hard request limits at the ingress: sizes, slow clients, time, and Serve's control headers.

Design note. Every limit is enforced where it can really bound the cost:

* **Headers** (count, total bytes, one header's bytes, time to send them). Under direct
  ingress the ingress replica runs the HTTP server (uvicorn with httptools, started by Ray
  Serve with no way to configure header limits or a header timeout), so
  :class:`GuardedHttpToolsProtocol` - uvicorn's own protocol plus a byte counter and a timer
  - is installed in that process before Serve starts the server: the connection is refused
  (431 / 408, OpenAI error shape, then closed) while the bytes arrive, before they are all
  buffered. The ASGI :class:`HeaderGuard` checks the same limits again on the parsed
  headers, which is what protects the ingress behind Serve's own proxy (direct ingress
  off), where slow headers cannot be cut by us (documented).
* **Ray Serve control headers** (``x-request-timeout-seconds``, ...) are read by Serve before
  our app sees the request, so they cannot be stripped: :class:`HeaderGuard` refuses them
  (400) before any work starts, so a client can never lift the operator's timeout.
* **Body** is read incrementally up to ``max_body_bytes`` (413 as soon as more arrives or
  ``Content-Length`` says so) within ``body_timeout_s`` (408).
* **Transport**: the body crosses Serve's gRPC hop to the model replica, whose message limit
  (``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``, 4 MiB by default) is raised to the body
  limit plus headroom wherever fleetserve starts Ray (:func:`transport_env`); on a cluster
  that keeps 4 MiB, the gRPC refusal is mapped to 413 by the model client.
* **Time**: :class:`Deadlines` gives every request one ``asyncio.Timeout`` per wait, ending
  at ``request_timeout_s``; drain and replica loss reschedule those timeouts to *now*, so
  the waiting request ends at once with the reason attached (504 / SSE error event).
  Serve's own request timeout is set later (``plan.deployment.SERVE_TIMEOUT_MARGIN_S``), as
  a backstop that never fires first (it would cut a stream silently).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fleetserve.spec import ServerSpec

MIB = 2**20
#: Room for the pickled request envelope and headers on top of the body, on the gRPC hop.
TRANSPORT_HEADROOM_BYTES = MIB


@dataclass(frozen=True)
class RequestLimits:
    """The ingress's limits on one request (from ``server`` in the fleet spec)."""

    max_body_bytes: int = 32 * MIB
    max_header_count: int = 100
    max_header_bytes: int = 32_768
    max_header_value_bytes: int = 8192
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    request_timeout_s: float = 600.0

    @classmethod
    def from_spec(cls, server: ServerSpec) -> RequestLimits:
        return cls(
            max_body_bytes=int(server.max_body_mb * MIB),
            max_header_count=server.max_header_count,
            max_header_bytes=server.max_header_bytes,
            max_header_value_bytes=server.max_header_value_bytes,
            header_timeout_s=server.header_timeout_s,
            body_timeout_s=server.body_timeout_s,
            request_timeout_s=server.request_timeout_s,
        )

    def to_args(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> RequestLimits:
        return cls(**(args or {}))

    @property
    def transport_bytes(self) -> int:
        """The gRPC message size the ingress -> replica hop must allow."""
        return self.max_body_bytes + TRANSPORT_HEADROOM_BYTES


def transport_env(limits: RequestLimits) -> dict[str, str]:
    """Ray Serve environment for replicas so that a body within limits crosses gRPC."""
    return {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(limits.transport_bytes)}


# --------------------------------------------------------------------------- refusals


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused before it reaches a model."""

    status: int
    message: str
    err_type: str
    param: str | None = None

    def body(self) -> bytes:
        error = {
            "message": self.message,
            "type": self.err_type,
            "param": self.param,
            "code": self.status,
        }
        return json.dumps({"error": error}).encode()


def _norm(name: str) -> str:
    # Serve matches some of its headers with '-' and '_' as equals (proxies rewrite them).
    return name.lower().replace("_", "-")


@functools.cache
def serve_control_headers() -> tuple[frozenset[str], tuple[str, ...]]:
    """Request headers Ray Serve reads from clients (exact names, prefixes), normalised.

    From Ray's own constants (ray/serve/_private/constants.py, read by the proxy and by
    the direct-ingress replica in ray/serve/_private/replica.py): the request timeout, the
    disconnect switch, multiplexed-model routing, session affinity, and the ingress request
    router's header prefix.
    """
    from ray.serve._private import constants as c  # noqa: PLC0415 - Ray's source of truth

    names = {
        c.SERVE_HTTP_REQUEST_TIMEOUT_S_HEADER,
        c.SERVE_HTTP_REQUEST_DISCONNECT_DISABLED_HEADER,
        c.SERVE_MULTIPLEXED_MODEL_ID,
        c.SERVE_SESSION_ID,
    }
    return frozenset(_norm(n) for n in names), (_norm(c.SERVE_INGRESS_ROUTER_HEADER_PREFIX),)


def is_serve_control_header(name: str) -> bool:
    # Ray's constants are read on first use: `fleetserve render` imports this module
    # for RequestLimits and must not pay for importing Ray.
    names, prefixes = serve_control_headers()
    n = _norm(name)
    return n in names or n.startswith(prefixes)


def check_headers(headers: Iterable[tuple[bytes, bytes]], limits: RequestLimits) -> Refusal | None:
    """Refusal for headers over the limits (431) or carrying Serve control headers (400)."""
    count = 0
    total = 0
    for raw_name, raw_value in headers:
        count += 1
        size = len(raw_name) + len(raw_value)
        total += size + 4  # ": " and CRLF, as on the wire
        name = raw_name.decode("latin-1")
        if size > limits.max_header_value_bytes:
            return Refusal(
                431,
                f"request header '{name[:64]}' is {size} bytes; this server accepts at most "
                f"{limits.max_header_value_bytes} bytes per header",
                "RequestHeaderFieldsTooLargeError",
                name[:64],
            )
        if is_serve_control_header(name):
            return Refusal(
                400,
                f"request header '{name[:64]}' is reserved for the server's own use; remove it",
                "BadRequestError",
                name[:64],
            )
    if count > limits.max_header_count:
        return Refusal(
            431,
            f"the request has {count} headers; this server accepts at most "
            f"{limits.max_header_count}",
            "RequestHeaderFieldsTooLargeError",
        )
    if total > limits.max_header_bytes:
        return Refusal(
            431,
            f"the request headers are {total} bytes; this server accepts at most "
            f"{limits.max_header_bytes}",
            "RequestHeaderFieldsTooLargeError",
        )
    return None


def body_too_large(limits: RequestLimits, size: int | None = None) -> Refusal:
    got = f" ({size} bytes)" if size is not None else ""
    return Refusal(
        413,
        f"the request body is larger than this server's limit of "
        f"{limits.max_body_bytes} bytes ({limits.max_body_bytes / MIB:g} MiB){got}",
        "RequestEntityTooLargeError",
    )


def body_timeout(limits: RequestLimits) -> Refusal:
    return Refusal(
        408,
        f"the request body was not received within {limits.body_timeout_s:g} s",
        "RequestTimeoutError",
    )


def header_timeout(limits: RequestLimits) -> Refusal:
    return Refusal(
        408,
        f"the request headers were not received within {limits.header_timeout_s:g} s",
        "RequestTimeoutError",
    )


class RefusedError(Exception):
    """A request refused while reading it (carries the :class:`Refusal`)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


async def read_body(receive: Receive, headers: Mapping[str, str], limits: RequestLimits) -> bytes:
    """The whole body, never buffering more than the limit (raises :class:`RefusedError`)."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise RefusedError(body_too_large(limits, int(declared)))
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise asyncio.CancelledError("client disconnected while sending the body")
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limits.max_body_bytes:
                        raise RefusedError(body_too_large(limits))
                    parts.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RefusedError(body_timeout(limits)) from None
    return b"".join(parts)


class HeaderGuard:
    """ASGI middleware: header limits and Serve control headers, before any route runs."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = check_headers(scope.get("headers", ()), self.limits)
            if refusal is not None:
                await send_refusal(send, refusal)
                return
        await self.app(scope, receive, send)


async def send_refusal(send: Send, refusal: Refusal) -> None:
    body = refusal.body()
    start: Message = {
        "type": "http.response.start",
        "status": refusal.status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- deadlines


@dataclass(eq=False)
class Wait:
    """One request's pending wait: a model, its ``asyncio.Timeout``, and why it may end."""

    model: str
    deadline: float  # loop time
    reason: str = "timeout"
    waiting_for_head: bool = True
    timeout: asyncio.Timeout | None = field(default=None, repr=False)

    def end_now(self, reason: str) -> None:
        """End the current wait at once (the waiter sees TimeoutError, then ``reason``)."""
        self.reason = reason
        self.deadline = asyncio.get_running_loop().time()
        if self.timeout is not None and not self.timeout.expired():
            self.timeout.reschedule(self.deadline)


class Deadlines:
    """The open requests' waits, so drain and replica loss can end them with a reason."""

    def __init__(self, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s
        self._open: set[Wait] = set()
        self.cutting: str | None = None

    def open(self, model: str) -> Wait:
        loop_now = asyncio.get_running_loop().time()
        wait = Wait(model, loop_now + self.request_timeout_s)
        if self.cutting is not None:
            wait.reason, wait.deadline = self.cutting, loop_now
        self._open.add(wait)
        return wait

    def close(self, wait: Wait) -> None:
        self._open.discard(wait)

    def bounded(self, wait: Wait) -> Bounded:
        """``async with``: a block that ends with TimeoutError at the wait's deadline."""
        return Bounded(wait)

    def cut_all(self, reason: str) -> int:
        """End every open wait now (drain timeout); returns how many."""
        self.cutting = reason
        waits = list(self._open)
        for w in waits:
            w.end_now(reason)
        return len(waits)

    def model_down(self, model: str) -> int:
        """End the waits for a first response from ``model`` (no replica left)."""
        waits = [w for w in self._open if w.model == model and w.waiting_for_head]
        for w in waits:
            w.end_now("unavailable")
        return len(waits)

    def __len__(self) -> int:
        return len(self._open)


class Bounded:
    """``asyncio.timeout_at(wait.deadline)`` that drain / replica loss can reschedule.

    A small class, not ``asynccontextmanager``: it wraps every streamed chunk.
    """

    __slots__ = ("_timeout", "_wait")

    def __init__(self, wait: Wait) -> None:
        self._wait = wait
        self._timeout = asyncio.timeout_at(wait.deadline)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()
        self._wait.timeout = self._timeout

    async def __aexit__(self, *exc: Any) -> None:
        self._wait.timeout = None
        await self._timeout.__aexit__(*exc)


# --------------------------------------------------------------------------- HTTP server


def _raw_response(refusal: Refusal) -> bytes:
    body = refusal.body()
    reason = {408: "Request Timeout", 431: "Request Header Fields Too Large"}.get(
        refusal.status, "Bad Request"
    )
    head = (
        f"HTTP/1.1 {refusal.status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header limits and a header timeout.

    What must stay true: the timer runs from connection start and from each request's
    first byte until its headers are complete (so an idle or trickling connection is
    closed after ``header_timeout_s``), and header bytes buffered before completion never
    exceed ``max_header_bytes`` plus one socket read. Limits are class attributes because
    uvicorn instantiates the protocol itself (:func:`install_http_guard` sets them).
    """

    limits: ClassVar[RequestLimits] = RequestLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._fs_refusal: Refusal | None = None
        self._fs_timer: asyncio.TimerHandle | None = None
        self._fs_start_headers()

    def _fs_start_headers(self) -> None:
        self._fs_in_headers = True
        self._fs_bytes = 0
        self._fs_count = 0
        if self._fs_timer is not None:
            self._fs_timer.cancel()
        self._fs_timer = self.loop.call_later(self.limits.header_timeout_s, self._fs_timed_out)

    def _fs_stop_timer(self) -> None:
        if self._fs_timer is not None:
            self._fs_timer.cancel()
            self._fs_timer = None

    def _fs_timed_out(self) -> None:
        self._fs_timer = None
        if self._fs_in_headers:
            self._fs_refuse(header_timeout(self.limits))

    def _fs_refuse(self, refusal: Refusal) -> None:
        self._fs_stop_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_raw_response(refusal))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._fs_in_headers:
            self._fs_bytes += len(data)
        super().data_received(data)
        # Still inside the headers after this read: what httptools holds is bounded here.
        if self._fs_in_headers and self._fs_bytes > self.limits.max_header_bytes:
            self._fs_refuse(
                Refusal(
                    431,
                    "the request line and headers are larger than this server's limit of "
                    f"{self.limits.max_header_bytes} bytes",
                    "RequestHeaderFieldsTooLargeError",
                )
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._fs_in_headers:
            self._fs_start_headers()

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._fs_count += 1
        # Count and per-header size here; total size and control headers in HeaderGuard.
        if self._fs_count > self.limits.max_header_count:
            self._fs_refusal = Refusal(
                431,
                f"the request has more than {self.limits.max_header_count} headers",
                "RequestHeaderFieldsTooLargeError",
            )
        elif len(name) + len(value) > self.limits.max_header_value_bytes:
            n = name.decode("latin-1")[:64]
            self._fs_refusal = Refusal(
                431,
                f"request header '{n}' is larger than this server's limit of "
                f"{self.limits.max_header_value_bytes} bytes per header",
                "RequestHeaderFieldsTooLargeError",
                n,
            )
        if self._fs_refusal is not None:
            raise ValueError(self._fs_refusal.message)  # stops the parser (see below)

    def send_400_response(self, msg: str) -> None:
        # httptools reports a callback's exception as a parser error, which uvicorn answers
        # with a plain-text 400: answer our refusal instead.
        if self._fs_refusal is not None:
            self._fs_refuse(self._fs_refusal)
            return
        self._fs_stop_timer()
        super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._fs_in_headers = False
        self._fs_stop_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fs_stop_timer()
        super().connection_lost(exc)


def install_http_guard(limits: RequestLimits) -> bool:
    """Make uvicorn servers started later in this process use the guarded protocol.

    Ray Serve starts the direct-ingress server with ``uvicorn.Config(http="auto")`` after
    the ingress replica's constructor ran, so the constructor calls this. Returns False
    (and changes nothing) when uvicorn's "auto" protocol is not httptools.
    """
    from uvicorn import config  # noqa: PLC0415
    from uvicorn.protocols.http.auto import AutoHTTPProtocol  # noqa: PLC0415

    if AutoHTTPProtocol is not HttpToolsProtocol:
        return False
    GuardedHttpToolsProtocol.limits = limits
    config.HTTP_PROTOCOLS["auto"] = f"{__name__}:GuardedHttpToolsProtocol"
    return True
