"""AsgiBridge: head first, coalesced chunks, and a closed stream aborts the app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fleetserve.engine.asgi_bridge import BUFFER_BYTES, AsgiBridge, Message, Receive, Send
from fleetserve.engine.protocol import EngineRequest, ResponseHead


class Probe:
    """A tiny app whose stream records whether it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    def app(self) -> Starlette:
        async def echo(request: Request) -> Response:
            body = await request.json()
            return JSONResponse(
                {"got": body, "h": request.headers.get("x-request-id")}, status_code=201
            )

        async def slow(_request: Request) -> Response:
            async def gen() -> AsyncIterator[bytes]:
                try:
                    for i in range(1000):
                        self.started.set()
                        yield f"data: {i}\n\n".encode()
                        await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise

            return StreamingResponse(gen(), media_type="text/event-stream")

        async def burst(_request: Request) -> Response:
            async def gen() -> AsyncIterator[bytes]:
                await self.release.wait()
                for i in range(5):
                    yield f"data: {i}\n\n".encode()

            return StreamingResponse(gen(), media_type="text/event-stream")

        return Starlette(
            routes=[
                Route("/echo", echo, methods=["POST"]),
                Route("/slow", slow, methods=["POST"]),
                Route("/burst", burst, methods=["POST"]),
            ]
        )


async def collect(bridge: AsgiBridge, req: EngineRequest) -> list[ResponseHead | bytes]:
    return [item async for item in bridge.handle(req)]


async def test_head_then_body_with_status_headers_and_media_type() -> None:
    bridge = AsgiBridge(Probe().app())
    items = await collect(
        bridge,
        EngineRequest(
            "POST",
            "/echo",
            b'{"a": 1}',
            (("content-type", "application/json"), ("X-Request-Id", "r1")),
        ),
    )
    head = items[0]
    assert isinstance(head, ResponseHead)
    assert head.status == 201
    assert head.media_type == "application/json"
    assert all(k != "content-length" for k, _ in head.headers)
    assert b"".join(i for i in items[1:] if isinstance(i, bytes)) == (b'{"got":{"a":1},"h":"r1"}')
    assert (bridge.completed, bridge.aborted, bridge.in_flight) == (1, 0, 0)


async def test_chunks_already_queued_are_coalesced_into_one_item() -> None:
    probe = Probe()
    bridge = AsgiBridge(probe.app())
    stream = bridge.handle(EngineRequest("POST", "/burst"))
    head = await anext(stream)
    assert isinstance(head, ResponseHead)
    probe.release.set()
    await asyncio.sleep(0.05)  # let the app queue all five events
    rest = [item async for item in stream]
    assert rest == [b"".join(f"data: {i}\n\n".encode() for i in range(5))]


async def test_closing_the_stream_cancels_the_app_and_counts_an_abort() -> None:
    probe = Probe()
    bridge = AsgiBridge(probe.app())
    stream = bridge.handle(EngineRequest("POST", "/slow"))
    assert isinstance(await anext(stream), ResponseHead)
    await anext(stream)
    await stream.aclose()  # what a client disconnect does to the replica's generator
    await asyncio.wait_for(probe.cancelled.wait(), 5)
    assert (bridge.aborted, bridge.in_flight, bridge.completed) == (1, 0, 0)


async def test_app_that_raises_before_responding_surfaces_an_error() -> None:
    async def broken(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("boom")

    bridge = AsgiBridge(broken)
    with pytest.raises(RuntimeError, match="boom"):
        await collect(bridge, EngineRequest("POST", "/x"))
    assert bridge.in_flight == 0


async def test_a_caller_that_stops_pulling_stops_the_app_and_then_gets_everything() -> None:
    produced = 0
    chunk = b"x" * 1024

    async def flood(scope: Message, receive: Receive, send: Send) -> None:
        nonlocal produced
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(2000):  # ~2 MiB, eight times the bridge's buffer
            produced += 1
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    bridge = AsgiBridge(flood)
    stream = bridge.handle(EngineRequest("POST", "/flood"))
    assert isinstance(await anext(stream), ResponseHead)
    for _ in range(50):  # the caller is paused: the app gets many loop passes to run ahead
        await asyncio.sleep(0)
    held = produced
    assert held * len(chunk) <= BUFFER_BYTES + 2 * len(chunk)  # the app waits on a full buffer
    got = b"".join([item async for item in stream if isinstance(item, bytes)])
    assert got == chunk * 2000  # nothing lost, in order
    assert (bridge.completed, bridge.aborted, bridge.in_flight) == (1, 0, 0)
