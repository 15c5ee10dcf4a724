"""Length distributions and SLO parsing."""

from __future__ import annotations

import numpy as np
import pytest

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.record import RequestRecord
from fleetserve.bench.slo import Slo, parse_duration
from fleetserve.errors import UsageError


def test_forms() -> None:
    assert LengthDistribution.parse("128").kind == "fixed"
    assert LengthDistribution.parse("fixed:7").low == 7
    u = LengthDistribution.parse("uniform:10-20")
    assert (u.low, u.high) == (10, 20)
    n = LengthDistribution.parse("normal:100,10")
    assert (n.mean, n.std) == (100, 10)
    assert LengthDistribution.parse(u.describe()) == u


@pytest.mark.parametrize("bad", ["", "abc", "uniform:20-10", "uniform:5", "gauss:1,2", "0"])
def test_bad_forms_name_the_flag(bad: str) -> None:
    with pytest.raises(UsageError, match="--input-len"):
        LengthDistribution.parse(bad, flag="--input-len")


def test_samples_respect_bounds_and_seed() -> None:
    u = LengthDistribution.parse("uniform:10-20")
    xs = [u.sample(np.random.default_rng(1)) for _ in range(3)]
    assert len(set(xs)) == 1  # same seed, same value
    rng = np.random.default_rng(0)
    samples = [u.sample(rng) for _ in range(2000)]
    assert min(samples) == 10
    assert max(samples) == 20
    n = LengthDistribution.parse("normal:5,10")
    rng = np.random.default_rng(0)
    assert min(n.sample(rng) for _ in range(500)) >= 1
    big = LengthDistribution.parse("normal:1000,50")
    rng = np.random.default_rng(0)
    mean = np.mean([big.sample(rng) for _ in range(4000)])
    assert abs(mean - 1000) < 5


def test_durations() -> None:
    assert parse_duration("250ms", flag="x") == pytest.approx(0.25)
    assert parse_duration("2m", flag="x") == 120
    assert parse_duration("3", flag="x", default_unit="ms") == pytest.approx(0.003)
    with pytest.raises(UsageError, match="--timeout"):
        parse_duration("soon", flag="--timeout")
    with pytest.raises(UsageError):
        parse_duration("-1s", flag="x")


def test_slo_parse_and_match() -> None:
    slo = Slo.parse("ttft=200ms,tpot=20")
    assert slo.ttft == pytest.approx(0.2)
    assert slo.tpot == pytest.approx(0.02)
    good = RequestRecord(id=0, point="p", ok=True, ttft=0.1, e2e=0.1 + 9 * 0.015, tokens_out=10)
    slow_first = RequestRecord(id=1, point="p", ok=True, ttft=0.3, e2e=0.4, tokens_out=10)
    slow_tokens = RequestRecord(
        id=2, point="p", ok=True, ttft=0.1, e2e=0.1 + 9 * 0.03, tokens_out=10
    )
    failed = RequestRecord(id=3, point="p", ok=False)
    assert slo.met_by(good)
    assert not slo.met_by(slow_first)
    assert not slo.met_by(slow_tokens)
    assert not slo.met_by(failed)
    with pytest.raises(UsageError, match="--slo"):
        Slo.parse("latency=1s")
