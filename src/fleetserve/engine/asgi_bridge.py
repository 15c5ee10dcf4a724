"""Drive an in-process ASGI app (vLLM's OpenAI server) without a socket.

Design note. A model replica hosts vLLM's own FastAPI app and calls it directly with a
synthetic ASGI scope, so every protocol detail (validation errors, chat templates, SSE
framing, ``stream_options``) is exactly what ``vllm serve`` does. The app runs as a task
that pushes response messages into a queue; :meth:`AsgiBridge.handle` turns the queue into
``ResponseHead`` + ``bytes`` items.

Hot-path choices:

* Coalescing: after one chunk arrives, every chunk already queued is joined into the same
  item. At low load that is one SSE event per item (no added latency); under load the
  per-item cost of the Ray streaming hop (one object per item) is paid once per batch
  instead of once per token.
* Disconnect: closing the iterator early answers the app's next ``receive()`` with
  ``http.disconnect`` (Starlette's StreamingResponse and vLLM's ``with_cancellation`` both
  listen for it), gives the app up to :data:`DISCONNECT_GRACE_S` to finish on its own, and
  then cancels the app task. The wait is what makes non-streamed requests abort: vLLM's
  ``with_cancellation`` runs the handler in a task of its own and cancels it when its
  watcher sees ``http.disconnect``; cancelling the app task first only cancels the
  ``asyncio.wait`` over the two, which leaves the handler task - and the generation -
  running for nobody. Streams end either way (Starlette's task group is cancelled with the
  app task, and cancelling vLLM's generator aborts the request inside AsyncLLM).
* Back-pressure: the app's ``send`` of a body chunk waits while more than
  :data:`BUFFER_BYTES` of the body are queued and not taken, as uvicorn's ``send`` waits on
  a full socket for ``vllm serve``. A caller that stops pulling items (the stream relay
  pauses a stream whose HTTP client reads slowly) so stops vLLM's streaming response, and
  vLLM merges that request's outputs until it is read again, instead of this queue
  growing by an SSE event per token for as long as the request runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fleetserve.engine.protocol import EngineRequest, ResponseHead

logger = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

#: Sentinel closing the stream of response items.
_END = object()
#: After a disconnect, how long the app may take to see it and end by itself.
DISCONNECT_GRACE_S = 2.0
#: Body bytes queued and not taken above which the app's ``send`` waits (about a thousand
#: SSE events; a caller that keeps up never holds more than a few).
BUFFER_BYTES = 256 * 1024


class AsgiBridge:
    """Runs HTTP requests through an ASGI app in this process and counts them."""

    def __init__(self, app: AsgiApp, *, server: tuple[str, int] = ("fleetserve", 0)) -> None:
        self._app = app
        self._server = server
        self.in_flight = 0
        self.aborted = 0
        self.completed = 0

    def _scope(self, request: EngineRequest) -> dict[str, Any]:
        return {
            "type": "http",
            # 2.3, not 2.4: below 2.4 Starlette's StreamingResponse watches receive() for
            # http.disconnect, which is how a closed client stream reaches vLLM.
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.path.encode(),
            "root_path": "",
            "query_string": request.query_string.encode(),
            "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers],
            "client": ("127.0.0.1", 0),
            "server": self._server,
            "state": {},
        }

    async def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Yield the response head, then body chunks (coalesced), of one request."""
        queue: asyncio.Queue[object] = asyncio.Queue()
        disconnected = asyncio.Event()
        body_sent = False
        queued = 0  # body bytes in the queue
        taken = asyncio.Event()  # set when the caller takes body bytes

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal queued
            kind = message["type"]
            if kind == "http.response.start":
                queue.put_nowait(message)
            elif kind == "http.response.body":
                chunk = message.get("body", b"")
                if chunk:
                    while queued > BUFFER_BYTES:  # back-pressure (see the module note)
                        taken.clear()
                        await taken.wait()
                    queued += len(chunk)
                    queue.put_nowait(bytes(chunk))
                if not message.get("more_body", False):
                    queue.put_nowait(_END)

        async def run() -> None:
            try:
                await self._app(self._scope(request), receive, send)
            finally:
                queue.put_nowait(_END)

        self.in_flight += 1
        task = asyncio.create_task(run())
        finished = False
        try:
            first = await queue.get()
            if first is _END:
                # The app ended without a response (it raised): surface its error.
                await task
                raise RuntimeError("the engine app returned no response")
            assert isinstance(first, MutableMapping)
            yield _head(first)
            while True:
                item = await queue.get()
                if item is _END:
                    break
                assert isinstance(item, bytes)
                done = False
                if not queue.empty():
                    parts = [item]
                    while not queue.empty():
                        nxt = queue.get_nowait()
                        if nxt is _END:
                            done = True
                            break
                        assert isinstance(nxt, bytes)
                        parts.append(nxt)
                    item = b"".join(parts)
                queued -= len(item)
                taken.set()
                yield item
                if done:
                    break
            finished = True
            self.completed += 1
        finally:
            self.in_flight -= 1
            if not finished:
                self.aborted += 1
                disconnected.set()
            try:
                if not task.done() and not finished:
                    # Let the app's own disconnect watchers end it (see the module note).
                    await asyncio.wait({task}, timeout=DISCONNECT_GRACE_S)
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                elif not task.cancelled() and task.exception() is not None:
                    # The app raised after answering (Starlette re-raises after its 500).
                    logger.warning("engine app error: %r", task.exception())


def _head(message: Message) -> ResponseHead:
    headers: list[tuple[str, str]] = []
    media_type = "application/octet-stream"
    for raw_key, raw_value in message.get("headers", []):
        key = raw_key.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if key == "content-type":
            media_type = value
        elif key != "content-length":  # the ingress re-frames the body
            headers.append((key, value))
    return ResponseHead(
        status=int(message["status"]), headers=tuple(headers), media_type=media_type
    )
