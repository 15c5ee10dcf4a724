"""Summaries: percentiles, throughput window, goodput, error accounting, warm-up."""

from __future__ import annotations

import numpy as np
import pytest

from fleetserve.bench.metrics import LatencyStats, mean_in_flight, summarize
from fleetserve.bench.record import RequestRecord
from fleetserve.bench.slo import Slo


def test_percentiles_of_a_known_distribution() -> None:
    # 1..100 ms: linear-interpolation percentiles are 50.5, 90.1, 95.05, 99.01.
    s = LatencyStats.of([i / 1000 for i in range(1, 101)])
    assert s.count == 100
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p95 == pytest.approx(95.05)
    assert s.p99 == pytest.approx(99.01)
    assert s.mean == pytest.approx(50.5)
    assert (s.min, s.max) == (pytest.approx(1.0), pytest.approx(100.0))


def test_percentiles_of_a_sampled_exponential() -> None:
    rng = np.random.default_rng(0)
    s = LatencyStats.of(rng.exponential(0.1, 200_000))  # mean 100 ms
    assert s.p50 == pytest.approx(100 * np.log(2), rel=0.02)
    assert s.p99 == pytest.approx(100 * np.log(100), rel=0.03)


def test_empty() -> None:
    assert LatencyStats.of([]).p50 is None


def rec(i: int, start: float, ttft: float, e2e: float, out: int, **kw: object) -> RequestRecord:
    r = RequestRecord(id=i, point="c=2", start=start, scheduled=start, ttft=ttft, e2e=e2e)
    r.tokens_out, r.tokens_in, r.ok = out, 10, True
    r.itl = [(e2e - ttft) / (out - 1)] * (out - 1)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_throughput_goodput_errors_and_warmup() -> None:
    records = [
        rec(0, 0.0, 5.0, 50.0, 11, warmup=True),  # excluded everywhere
        rec(1, 1.0, 0.1, 1.1, 11),  # ends at 2.1, tpot 0.1
        rec(2, 1.5, 0.5, 1.5, 11),  # ends at 3.0, ttft too slow for the SLO
        rec(3, 2.0, 0.1, 0.6, 6),  # ends at 2.6, tpot 0.1
        RequestRecord(
            id=4,
            point="c=2",
            start=2.5,
            e2e=0.5,
            status=500,
            error_type="http_error",
            error="HTTP 500: boom",
        ),
        RequestRecord(
            id=5,
            point="c=2",
            start=2.6,
            e2e=0.1,
            status=None,
            error_type="connection_refused",
            error="refused",
        ),
    ]
    s = summarize("c=2", 2, records, Slo(ttft=0.2))
    assert (s.requests, s.succeeded, s.failed, s.warmup) == (5, 3, 2, 1)
    assert s.duration_s == pytest.approx(2.0)  # 1.0 -> 3.0
    assert s.request_throughput == pytest.approx(1.5)
    assert s.output_throughput == pytest.approx(28 / 2)
    assert s.total_throughput == pytest.approx((28 + 30) / 2)
    assert s.goodput == pytest.approx(1.0)  # records 1 and 3
    assert s.slo_attainment == pytest.approx(2 / 5)
    assert s.ttft.p50 == pytest.approx(100.0)
    assert s.tpot.mean == pytest.approx(100.0)
    assert s.errors_by_status == {"500": 1, "none": 1}
    assert s.errors_by_type == {"http_500": 1, "connection_refused": 1}
    assert s.error_examples["http_500"] == "HTTP 500: boom"
    assert s.max_in_flight == 3


def test_rate_limited_and_overloaded_are_named_apart() -> None:
    def failed(status: int) -> RequestRecord:
        return RequestRecord(
            id=status,
            point="x",
            start=0.0,
            e2e=1.0,
            error=f"HTTP {status}",
            error_type="http_error",
            status=status,
        )

    s = summarize("x", 1.0, [failed(429), failed(429), failed(503)], None)
    assert s.errors_by_status == {"429": 2, "503": 1}
    assert s.errors_by_type == {"http_429_rate_limited": 2, "http_503_overloaded": 1}


def test_mean_in_flight_is_the_concurrency_the_server_saw() -> None:
    # two requests side by side over [0, 2], then one alone over [2, 3]: 5 s of requests
    # over a 3 s window; the warm-up request is not part of it
    records = [
        rec(0, 0.0, 0.1, 2.0, 4),
        rec(1, 0.0, 0.1, 2.0, 4),
        rec(2, 2.0, 0.1, 1.0, 4),
        rec(3, 5.0, 0.1, 9.0, 4, warmup=True),
    ]
    assert mean_in_flight(records) == pytest.approx(5 / 3)
    assert mean_in_flight([rec(0, 0.0, 0.1, 1.0, 4), rec(1, 1.0, 0.1, 1.0, 4)]) == 1.0
    assert mean_in_flight([]) == 0.0
    assert mean_in_flight([rec(0, 1.0, 0.0, 0.0, 0)]) == 0.0  # no window
