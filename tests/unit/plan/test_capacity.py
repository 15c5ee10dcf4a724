"""The queueing capacity model (plan/capacity.py) on a step-time model of stated constants."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fleetserve.plan.capacity import (
    BatchLimits,
    Lengths,
    StepCost,
    Workload,
    predict,
    replica_capacity,
)
from fleetserve.spec import LengthSpec, SloSpec, TrafficSpec


@dataclass(frozen=True)
class LinearSteps:
    """A roofline of stated constants: a fixed cost plus the slower of reading the
    weights and KV, and computing the step's tokens."""

    fixed: float = 0.004
    weights_s: float = 0.020
    per_token_s: float = 1e-4
    per_context_s: float = 1e-7

    turn_s: float = 0.0  # a card of its own: capacity is sized before cards are shared

    def step(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> StepCost:
        memory = self.weights_s + self.per_context_s * context_tokens
        compute = self.per_token_s * (prefill_tokens + decode_seqs)
        return StepCost(self.fixed + max(memory, compute), f"weights {self.weights_s * 1e3:g} ms")

    def turn(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        raise AssertionError("capacity is sized for a replica alone on its card")

    def beside(self, others_s: float) -> LinearSteps:
        raise AssertionError("capacity is sized for a replica alone on its card")


def work(ttft: dict[str, float] | None = None, tpot: dict[str, float] | None = None) -> Workload:
    traffic = TrafficSpec(
        rate=1,
        prompt_tokens=LengthSpec(mean=1000, p99=4000),
        output_tokens=LengthSpec(mean=200, p99=800),
    )
    slo = SloSpec.model_validate({"ttft_ms": ttft, "tpot_ms": tpot})
    return Workload.of(traffic, slo)


BATCH = BatchLimits(max_num_seqs=64, max_num_batched_tokens=8192, kv_seqs=500)


def test_lengths_keep_the_mean_and_the_p99() -> None:
    lengths = Lengths.of(LengthSpec(mean=1000, p99=4000))
    assert lengths.quantile(0.99) == pytest.approx(4000, rel=1e-9)
    assert lengths.quantile(0.5) < 1000 < lengths.quantile(0.99)
    fixed = Lengths.of(LengthSpec(mean=300))
    assert fixed.quantile(0.99) == 300
    assert fixed.second_moment == 300 * 300


def test_latencies_rise_with_the_rate() -> None:
    w = work(ttft={"p99": 1000}, tpot={"p50": 50})
    low, high = predict(LinearSteps(), BATCH, w, 1.0), predict(LinearSteps(), BATCH, w, 4.0)
    assert low.stable
    assert high.stable
    assert high.step_s > low.step_s
    assert high.ttft_s[0.99] > low.ttft_s[0.99]
    assert high.tpot_s[0.5] >= low.tpot_s[0.5]
    assert low.ttft_s[0.5] < low.ttft_s[0.99]


def test_capacity_meets_the_targets_and_the_binding_one_fails_just_above() -> None:
    w = work(ttft={"p99": 1000}, tpot={"p50": 50, "p99": 60})
    cap = replica_capacity(LinearSteps(), BATCH, w)
    assert cap.rate > 0
    at = cap.load
    assert at.ttft_s[0.99] <= 1.0
    assert at.tpot_s[0.5] <= 0.050
    above = predict(LinearSteps(), BATCH, w, cap.rate * 1.01)
    if cap.binding == "ttft":
        assert above.ttft_s[0.99] > 1.0
    assert cap.binding in ("ttft", "tpot", "throughput")
    assert f"{cap.rate:,.2f} req/s" in cap.reason


def test_a_looser_target_never_lowers_the_capacity() -> None:
    tight = replica_capacity(LinearSteps(), BATCH, work(ttft={"p99": 500}))
    loose = replica_capacity(LinearSteps(), BATCH, work(ttft={"p99": 2000}))
    assert 0 < tight.rate < loose.rate


def test_tpot_binds_when_the_decode_step_nears_its_target() -> None:
    cap = replica_capacity(LinearSteps(), BATCH, work(tpot={"p50": 30}))
    assert cap.binding == "tpot"
    assert cap.load.tpot_s[0.5] <= 0.030


def test_a_small_kv_cache_binds_before_max_num_seqs() -> None:
    small = BatchLimits(max_num_seqs=256, max_num_batched_tokens=8192, kv_seqs=4)
    cap = replica_capacity(LinearSteps(), small, work())
    assert cap.binding == "kv_capacity"
    assert "KV cache holds 4.0 sequences" in cap.reason
    roomy = replica_capacity(LinearSteps(), BATCH, work())
    assert roomy.rate > cap.rate


def test_a_target_below_the_idle_step_is_unreachable_in_numbers() -> None:
    cap = replica_capacity(LinearSteps(weights_s=0.070), BATCH, work(tpot={"p50": 50}))
    assert cap.rate == 0
    assert cap.binding == "tpot"
    assert cap.reason == (
        "TPOT p50 50 ms unreachable: one decode step at batch 1 takes 74.1 ms (weights 70 ms)"
    )
    slow_prefill = LinearSteps(per_token_s=1e-3)
    cap = replica_capacity(slow_prefill, BATCH, work(ttft={"p99": 1000}))
    assert cap.binding == "ttft"
    assert cap.reason.startswith("TTFT p99 1,000 ms unreachable: prefilling the p99 prompt (4,000")
