"""CPU per chunk of the gateway's own relay layers, without Ray, on one event loop.

Design note. ``serve_path.py`` measures what a streamed token costs in the ingress process
(~0.3 CPU-ms on the 2-CPU VM); this file measures how much of that is the gateway's own
Python per chunk, so the two can be compared: the same layers a streamed response passes
through in ``gateway.py`` and ``quota_guard.py`` - the usage scan (``scan_stream``), the
per-chunk deadline (``Deadlines.bounded``), the quota tap (``_StreamTap.relay``) and two
plain async-generator hops (the relay and the accounting wrapper) - over a source that
yields vLLM-shaped SSE chunks, on uvloop as in the ingress. Printed: µs of CPU per chunk for
the bare source and for each added layer, median of ``--repeats``.

    .venv/bin/python benchmarks/relay_layers.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import AsyncIterator, Callable

import uvloop

from fleetserve.serve.guard.quota_guard import _StreamTap
from fleetserve.serve.guard.usage import UsageScanner, scan_stream
from fleetserve.serve.ingress.limits import Deadlines

CHUNK = (
    b'data: {"id":"cmpl-0","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}\n\n'
)

Layer = Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]]


async def source(n: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield CHUNK


async def hop(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk


def deadline(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``Gateway._relay``'s loop without its error events (which a Gateway instance needs)."""
    deadlines = Deadlines(600.0)
    wait = deadlines.open("m")

    async def bounded() -> AsyncIterator[bytes]:
        while True:
            async with deadlines.bounded(wait):
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            yield chunk

    return bounded()


LAYERS: list[tuple[str, Layer]] = [
    ("usage scan", lambda c: scan_stream(c, UsageScanner())),
    ("per-chunk deadline", deadline),
    ("relay hop", hop),
    ("quota tap", lambda c: _StreamTap(strip=False).relay(c)),
    ("accounting hop", hop),
]


async def cpu_per_chunk(depth: int, n: int) -> float:
    chunks: AsyncIterator[bytes] = source(n)
    for _, layer in LAYERS[:depth]:
        chunks = layer(chunks)
    t0 = time.process_time()
    async for _ in chunks:
        pass
    return 1e6 * (time.process_time() - t0) / n


async def main(n: int, repeats: int) -> None:
    print("| layers | µs CPU / chunk | added by the last layer |")
    print("|---|---:|---:|")
    previous = None
    for depth in range(len(LAYERS) + 1):
        us = statistics.median([await cpu_per_chunk(depth, n) for _ in range(repeats)])
        name = "bare source" if depth == 0 else "+ " + LAYERS[depth - 1][0]
        added = "" if previous is None else f"{us - previous:.2f}"
        print(f"| {name} | {us:.2f} | {added} |")
        previous = us


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    uvloop.run(main(args.chunks, args.repeats))
