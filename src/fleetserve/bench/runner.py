"""Drives one load point: takes requests from a workload, sends them on the load shape's
schedule through a :class:`RequestSender`, and returns one record per request sent.

Design notes / what must stay true:

* Every request that was sent gets a record, appended *before* it is sent, so failures and
  interrupted requests never vanish from the totals.
* The first ``warmup`` requests of a point are flagged and excluded from statistics.
* A run stops issuing when ``num_requests`` measured requests were sent or ``duration_s``
  elapsed since the first measured one, then waits for those in flight.
* Open-loop shapes dispatch every request whose time has come in one pass (no sleep
  between overdue ones), so a late event loop shows up as send lag (``start - scheduled``)
  instead of silently lowering the offered rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol

from fleetserve.bench.load import LoadPoint
from fleetserve.bench.record import RequestRecord
from fleetserve.bench.workload.base import BenchRequest, Workload


class RequestSender(Protocol):
    """Sends one request and fills its record (see ``StreamingClient``)."""

    @property
    def origin(self) -> float:
        """``perf_counter()`` reading that record times are relative to."""
        ...

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        """Send and fill ``record``; must not raise for request failures."""
        ...


@dataclass(slots=True)
class RunCounters:
    """Live counters read by the progress display (cheap int updates only)."""

    sent: int = 0
    done: int = 0
    failed: int = 0
    chunks: int = 0
    in_flight: int = 0
    point: str = ""
    target: int | None = None
    duration_s: float | None = None
    measure_start: float | None = None


class BenchRunner:
    """Runs load points against one sender and workload."""

    def __init__(
        self,
        sender: RequestSender,
        workload: Workload,
        *,
        seed: int = 0,
        warmup: int = 0,
        num_requests: int | None = None,
        duration_s: float | None = None,
        counters: RunCounters | None = None,
    ) -> None:
        if (num_requests is None) == (duration_s is None):
            raise ValueError("give exactly one of num_requests and duration_s")
        self.sender = sender
        self.workload = workload
        self.seed = seed
        self.warmup = warmup
        self.num_requests = num_requests
        self.duration_s = duration_s
        self.counters = counters or RunCounters()
        self.records: list[RequestRecord] = []
        """Records of the point running now (what an interrupted run still reports)."""
        self._next_id = 0

    async def run(self, point: LoadPoint) -> list[RequestRecord]:
        """Run ``point`` to completion and return its records (warm-up included, flagged)."""
        c = self.counters
        c.sent = c.done = c.failed = c.chunks = c.in_flight = 0
        c.point, c.target, c.duration_s, c.measure_start = (
            point.label,
            self.num_requests,
            self.duration_s,
            None,
        )
        records: list[RequestRecord] = []
        self.records = records
        requests = self.workload.requests(point.prompt_seed(self.seed))
        if self.num_requests is not None:
            # Build every prompt before the clock starts: prompt synthesis (tokenizer calls)
            # inside the event loop would delay sends and timestamps.
            total = self.warmup + self.num_requests
            requests = iter(list(itertools.islice(requests, total)))
        if point.kind == "concurrency":
            assert point.concurrency is not None
            await self._closed_loop(point, point.concurrency, requests, records)
        else:
            await self._open_loop(point, requests, records)
        return records

    # ------------------------------------------------------------------ helpers

    def _more(self, measured_sent: int, now: float) -> bool:
        c = self.counters
        if self.num_requests is not None:
            return measured_sent < self.num_requests
        assert self.duration_s is not None
        return c.measure_start is None or now - c.measure_start < self.duration_s

    def _new_record(
        self, point: LoadPoint, request: BenchRequest, scheduled: float
    ) -> RequestRecord:
        warm = self.counters.sent < self.warmup
        record = RequestRecord(
            id=self._next_id,
            point=point.label,
            warmup=warm,
            group=request.group,
            scheduled=scheduled - self.sender.origin,
            request=request,
        )
        self._next_id += 1
        self.counters.sent += 1
        if not warm and self.counters.measure_start is None:
            self.counters.measure_start = scheduled
        return record

    async def _send(self, request: BenchRequest, record: RequestRecord) -> None:
        c = self.counters
        c.in_flight += 1
        try:
            await self.sender.send(request, record)
        finally:
            c.in_flight -= 1
            c.done += 1
            c.chunks += record.chunks
            if not record.ok:
                c.failed += 1

    # ------------------------------------------------------------------ shapes

    async def _closed_loop(
        self,
        point: LoadPoint,
        concurrency: int,
        requests: Iterator[BenchRequest],
        records: list[RequestRecord],
    ) -> None:
        measured_sent = 0
        stopping = False

        async def worker() -> None:
            nonlocal measured_sent
            while not stopping:
                now = perf_counter()
                warm = self.counters.sent < self.warmup
                if not warm and not self._more(measured_sent, now):
                    return
                if not warm:
                    measured_sent += 1
                request = next(requests)
                record = self._new_record(point, request, now)
                records.append(record)
                await self._send(request, record)

        workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        try:
            # asyncio.wait, not gather: a cancelled gather waits for every child to finish, so
            # one worker whose cancellation got lost inside the HTTP client would keep the
            # point (and Ctrl-C) going until num_requests were sent.
            await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            # All done, one worker failed (a bug), or Ctrl-C (CancelledError, re-raised after
            # this): no worker starts another request, even one that missed its cancel.
            stopping = True
            for w in workers:
                w.cancel()
            await asyncio.wait(workers)
        for w in workers:
            if not w.cancelled() and w.exception() is not None:
                w.result()  # the worker's error surfaces, as it did with gather

    async def _open_loop(
        self, point: LoadPoint, requests: Iterator[BenchRequest], records: list[RequestRecord]
    ) -> None:
        cap = asyncio.Semaphore(point.concurrency) if point.concurrency else None
        tasks: set[asyncio.Task[None]] = set()
        arrivals = point.arrivals(self.seed)
        measured_sent = 0
        t0 = perf_counter()

        async def limited(request: BenchRequest, record: RequestRecord) -> None:
            assert cap is not None
            async with cap:
                await self._send(request, record)

        for offset in arrivals:
            target = t0 + offset
            delay = target - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            warm = self.counters.sent < self.warmup
            if not warm and not self._more(measured_sent, perf_counter()):
                break
            if not warm:
                measured_sent += 1
            request = next(requests)
            record = self._new_record(point, request, target)
            records.append(record)
            coro = limited(request, record) if cap else self._send(request, record)
            task = asyncio.create_task(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        try:
            if tasks:
                await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
            raise
