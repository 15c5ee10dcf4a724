"""CPU per streamed chunk of the model replica's response path, in one process.

Design note. On the GPU the 270M's c = 256 cell is bound by the model replica's CPU per token
(0.148 ms against `vllm serve`'s API process at 0.119, docs/benchmarks.md). Of the path that
the replica adds to vLLM's own OpenAI layer, this times the per-chunk part: an ASGI app
sending one ~250-byte SSE event per engine step to each of ``--streams`` streams (as vLLM's
StreamingResponse does, awaiting each send), through :class:`AsgiBridge` and
:func:`relay_stream` into a :class:`RelayConnection` whose transport discards the bytes.
``bridge`` drops the relay (the items are only iterated), ``relay`` is the whole path. CPU
is process time over the chunks sent, the app's own sends and the step ticker included, so
it is an upper bound of what the path costs per token. What it leaves out - each request's
Serve call, its hashing into the routing ledger, the ASGI scope - is per request, not per
token: ``benchmarks/serve_path.py --max-tokens 2`` measures that through a real fleet.

    .venv/bin/python benchmarks/replica_chunk.py --streams 64 --chunks 200 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvloop

from fleetserve.engine.asgi_bridge import AsgiBridge
from fleetserve.engine.protocol import EngineRequest
from fleetserve.serve.replica.relay import (
    RelayConnection,
    RelayEndpoint,
    RelayTicket,
    relay_stream,
)

#: One SSE event of a streamed completion (vLLM's are 200-300 bytes).
CHUNK = b"data: " + b"x" * 240 + b"\n\n"
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _NullTransport:
    """A transport that takes every write and keeps nothing."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


class _Sender:
    """The one connection every stream of the run writes to."""

    def __init__(self, conn: RelayConnection) -> None:
        self.conn = conn

    async def connection(self, endpoint: RelayEndpoint) -> RelayConnection:
        return self.conn


class Steps:
    """Engine steps: each wakes every stream waiting for the next one exactly once (as
    vLLM's output handler hands each request one output per step)."""

    def __init__(self) -> None:
        self._next: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wait(self) -> asyncio.Future[None]:
        return self._next

    def step(self) -> None:
        done, self._next = self._next, asyncio.get_running_loop().create_future()
        done.set_result(None)


def streaming_app(chunks: int, steps: Steps) -> Any:
    """An ASGI app that streams ``chunks`` events, one per engine step."""

    async def app(scope: Any, receive: Any, send: Send) -> None:
        await receive()
        head = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        for _ in range(chunks):
            await steps.wait()
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def run(streams: int, chunks: int, relay: bool) -> float:
    """CPU microseconds per chunk of ``streams`` streams of ``chunks`` events."""
    steps = Steps()
    bridge = AsgiBridge(streaming_app(chunks, steps))
    conn = RelayConnection()
    conn.connection_made(_NullTransport())  # type: ignore[arg-type]
    sender = _Sender(conn)
    endpoint = RelayEndpoint(node_id="n", secret=b"")
    request = EngineRequest("POST", "/v1/completions", b"{}")

    async def one(i: int) -> None:
        if relay:
            ticket = RelayTicket(endpoint=endpoint, stream=i + 1)
            await relay_stream(sender, ticket, bridge.handle(request))  # type: ignore[arg-type]
        else:
            async for _ in bridge.handle(request):
                pass

    tasks = [asyncio.create_task(one(i)) for i in range(streams)]
    await asyncio.sleep(0)
    start = time.process_time()
    while not all(t.done() for t in tasks):
        # one engine step: every stream sends its event, and the loop passes that carry
        # them to the relay run before the next step (the bridge coalesces nothing)
        steps.step()
        for _ in range(4):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return (time.process_time() - start) / (streams * chunks) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=200, help="events per stream")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"bridge": [], "relay": []}
    for _ in range(args.rounds):
        for mode, values in results.items():  # alternating: both share the host's noise
            values.append(uvloop.run(run(args.streams, args.chunks, mode == "relay")))
    for mode, values in results.items():
        rounds = ", ".join(f"{v:.2f}" for v in values)
        print(f"{mode:<7} {statistics.median(values):.2f} CPU-us/chunk (rounds {rounds})")


if __name__ == "__main__":
    main()
