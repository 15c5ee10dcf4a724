"""SLO- and cost-driven planning: models with traffic and SLOs (plan/traffic.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.plan import plan_fleet, planner
from fleetserve.plan.capacity import ReplicaShape, StepCost
from fleetserve.plan.checks import plan_violations
from fleetserve.plan.result import PlanResult
from fleetserve.spec import FleetSpec, parse_spec


@dataclass(frozen=True)
class Steps:
    """Steps of stated constants over the catalogue's facts: the weights (and KV) read at
    the card's bandwidth share, the tokens computed at its FLOP/s share."""

    read_s: float
    per_token_s: float
    per_context_s: float
    share: float = 1.0
    """The replica's gpucores share: the constants above are at that share of the card."""
    others_s: float = 0.0
    """Other engines' turns a round on its card. As fleetserve.perf's time_sliced has it,
    the whole-card work waits a round before it starts and after each of its own turns,
    and the step takes the longer of that and its capped time."""
    turn_s: float = 0.002

    def step(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> StepCost:
        memory = self.read_s + self.per_context_s * context_tokens
        compute = self.per_token_s * (prefill_tokens + decode_seqs)
        capped = max(memory, compute)
        whole = capped * self.share
        shared = whole + (whole / self.turn_s + 1) * self.others_s
        return StepCost(0.003 + max(capped, shared), f"reads {self.read_s * 1e3:.1f} ms")

    def turn(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        memory = self.read_s + self.per_context_s * context_tokens
        compute = self.per_token_s * (prefill_tokens + decode_seqs)
        return min(self.turn_s, max(memory, compute) * self.share)

    def beside(self, others_s: float) -> Steps:
        return replace(self, others_s=others_s)


class FakePerf:
    """A :class:`PerfModel` of stated efficiencies (the real one is fleetserve.perf's)."""

    def step_model(self, shape: ReplicaShape) -> Steps:
        share = shape.cores_percent / 100
        bandwidth = shape.gpu.bandwidth * 0.75 * share
        flops = shape.gpu.peak_flops("bfloat16") * 0.5 * share
        weights = shape.memory.weights
        return Steps(
            read_s=weights / bandwidth,
            per_token_s=weights / flops,  # 2 FLOPs per parameter, 2 bytes per parameter
            per_context_s=shape.memory.kv_per_token / bandwidth,
            share=share,
        )


def pools(a6000_nodes: int | None = 4, h100_nodes: int | None = 2) -> list[dict[str, Any]]:
    return [
        {
            "name": "a6000",
            "gpu": {"type": "RTX-A6000", "count": 2},
            "cpu": 32,
            "memory_gb": 256,
            "max_nodes": a6000_nodes,
            "cost_per_hour": 1.5,
        },
        {
            "name": "h100",
            "gpu": {"type": "H100-80GB", "count": 8},
            "cpu": 192,
            "memory_gb": 1536,
            "max_nodes": h100_nodes,
            "cost_per_hour": 80.0,
        },
    ]


def fleet(
    rate: float = 20,
    ttft_ms: float = 1000,
    tpot_ms: float = 50,
    pool_list: list[dict[str, Any]] | None = None,
    **model: Any,
) -> FleetSpec:
    return parse_spec(
        {
            "models": [
                {
                    "name": "chat",
                    "config": "qwen2.5-7b",
                    "max_model_len": 8192,
                    "traffic": {
                        "rate": rate,
                        "prompt_tokens": {"mean": 800, "p99": 3000},
                        "output_tokens": {"mean": 200, "p99": 600},
                    },
                    "slo": {"ttft_ms": {"p99": ttft_ms}, "tpot_ms": {"p50": tpot_ms}},
                    **model,
                }
            ],
            "pools": pool_list if pool_list is not None else pools(),
        }
    )


def plan(spec: FleetSpec) -> PlanResult:
    return plan_fleet(spec, perf=FakePerf(), time_limit_s=30)


def test_the_plan_serves_the_rate_with_one_option_at_a_cost() -> None:
    spec = fleet()
    result = plan(spec)
    assert result.feasible, result.unplaced
    assert plan_violations(spec, result) == []
    [t] = result.traffic
    assert t.met
    assert t.replicas == len(result.replicas) >= 1
    assert t.replicas * t.goodput_per_replica >= 20
    assert t.binding in ("ttft", "tpot", "throughput", "kv_capacity")
    assert t.ttft_ms["p99"] <= 1000
    assert t.tpot_ms["p50"] <= 50
    # one Serve deployment: every replica the same engine settings and shape
    shapes = {(r.tensor_parallel, r.engine.max_num_seqs, r.memory_mb) for r in result.replicas}
    assert len(shapes) == 1
    assert sorted(r.index for r in result.replicas) == list(range(t.replicas))
    assert result.cost_per_hour is not None
    assert t.cost_per_hour is not None
    assert 0 < t.cost_per_hour <= result.cost_per_hour
    assert "cost" in result.optimal


def test_a_higher_rate_needs_more_replicas() -> None:
    low, high = plan(fleet(rate=5)), plan(fleet(rate=40))
    assert high.traffic[0].replicas > low.traffic[0].replicas
    assert high.cost_per_hour is not None
    assert low.cost_per_hour is not None
    assert high.cost_per_hour >= low.cost_per_hour


def test_replicas_min_is_a_floor() -> None:
    result = plan(fleet(rate=0.5, replicas={"min": 3, "max": 3}))
    [t] = result.traffic
    assert t.replicas == 3
    assert t.binding == "replicas_min"


def test_tensor_parallel_and_max_num_seqs_set_in_the_spec_are_kept() -> None:
    result = plan(fleet(tensor_parallel=2, max_num_seqs=16, concurrency=1))
    assert result.feasible
    assert {(r.tensor_parallel, r.engine.max_num_seqs) for r in result.replicas} == {(2, 16)}


def test_an_unreachable_slo_is_explained_in_numbers() -> None:
    result = plan(fleet(tpot_ms=1))
    assert not result.feasible
    [u] = result.unplaced
    assert u.resource == "tpot"
    assert u.reason.startswith("TPOT p50 1 ms unreachable for chat on H100-80GB")
    assert "one decode step at batch 1 takes" in u.reason
    assert any(f.startswith("loosen models[0].slo.tpot_ms.p50 to at least") for f in u.fixes)
    [t] = result.traffic
    assert not t.met
    assert t.binding == "tpot"


def test_full_pools_leave_the_model_short_with_the_reason() -> None:
    result = plan(fleet(rate=3000, pool_list=pools(a6000_nodes=1, h100_nodes=1)))
    assert not result.feasible
    [t] = result.traffic
    assert not t.met
    assert t.replicas < t.needed
    assert len(result.unplaced) == t.needed - t.replicas
    assert "req/s needs" in result.unplaced[0].reason


def big_on_l4(
    config: str, max_model_len: int = 4096, tpot_ms: float = 200, **model: Any
) -> FleetSpec:
    """One model ``big`` at 1 req/s on a pool of 4-L4 nodes."""
    return parse_spec(
        {
            "models": [
                {
                    "name": "big",
                    "config": config,
                    "max_model_len": max_model_len,
                    "traffic": {"rate": 1, "prompt_tokens": 500, "output_tokens": 200},
                    "slo": {"tpot_ms": {"p50": tpot_ms}},
                    **model,
                }
            ],
            "pools": [
                {
                    "name": "l4",
                    "gpu": {"type": "L4", "count": 4},
                    "cpu": 48,
                    "memory_gb": 192,
                    "cost_per_hour": 4,
                }
            ],
        }
    )


def test_the_roofline_explains_a_tpot_a_card_cannot_reach() -> None:
    """fleetserve.perf's roofline: a 27B model's decode step on L4s, as issue #29 asks."""
    spec = big_on_l4("gemma-3-27b", max_model_len=8192, tpot_ms=30)
    result = plan_fleet(spec, time_limit_s=10)
    [u] = result.unplaced
    assert u.resource == "tpot"
    assert u.reason.startswith("TPOT p50 30 ms unreachable for big on L4 (tensor_parallel 4")
    assert "one decode step at batch 1 takes" in u.reason
    assert "GB/s" in u.reason


def test_a_model_without_traffic_is_planned_as_before() -> None:
    spec = parse_spec(
        {
            "models": [{"name": "q", "config": "qwen2.5-0.5b", "max_model_len": 4096}],
            "pools": pools(),
        }
    )
    result = plan_fleet(spec)
    assert result.traffic == []
    assert len(result.replicas) == 1


PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _meets(result: PlanResult) -> bool:
    """Every replica placed and every SLO met: a plan that breaks one beside its card's
    neighbours may cost less than the plan that moves it to cards of its own."""
    return result.feasible and all(t.met for t in result.traffic)


def _cost(result: PlanResult) -> float:
    assert result.cost_per_hour is not None
    return result.cost_per_hour


@PROPERTY
@given(
    rate=st.sampled_from([2.0, 8.0, 25.0]),
    ttft=st.sampled_from([400.0, 800.0, 2000.0]),
    looser=st.sampled_from([1.5, 3.0]),
)
def test_a_looser_slo_never_raises_the_cost(rate: float, ttft: float, looser: float) -> None:
    tight = plan(fleet(rate=rate, ttft_ms=ttft))
    loose = plan(fleet(rate=rate, ttft_ms=ttft * looser, tpot_ms=50 * looser))
    if _meets(tight):  # a tighter SLO never costs less; a looser one stays met
        assert _meets(loose)
        assert _cost(loose) <= _cost(tight) + 1e-6


@PROPERTY
@given(
    rate=st.sampled_from([2.0, 8.0, 25.0]),
    a6000=st.integers(min_value=1, max_value=3),
    h100=st.integers(min_value=0, max_value=1),
    more=st.integers(min_value=1, max_value=3),
)
def test_more_gpus_never_raise_the_cost(rate: float, a6000: int, h100: int, more: int) -> None:
    few_pools = pools(a6000_nodes=a6000, h100_nodes=h100 or None)
    many_pools = pools(a6000_nodes=a6000 + more, h100_nodes=(h100 + more) if h100 else None)
    few = plan(fleet(rate=rate, pool_list=few_pools))
    many = plan(fleet(rate=rate, pool_list=many_pools))
    if _meets(few):
        assert _meets(many)
        assert _cost(many) <= _cost(few) + 1e-6


@pytest.mark.parametrize("field", ["ttft_ms", "tpot_ms"])
def test_a_tighter_slo_never_lowers_the_cost(field: str) -> None:
    costs = []
    for target in (2000.0, 800.0, 300.0):
        kwargs = {"ttft_ms": target} if field == "ttft_ms" else {"tpot_ms": target / 20}
        result = plan(fleet(rate=10, **kwargs))
        costs.append(_cost(result) if _meets(result) else float("inf"))
    assert costs == sorted(costs)


def test_a_running_gemma_sequence_holds_its_window_not_its_length() -> None:
    """The KV cache's sequences for a long-context Gemma 3 workload: the global layers
    (1 in 6) hold the whole context, the sliding ones their 1,024 tokens, plus the steps'
    chunks in flight once - more than twice what vLLM's admission figure (every token in
    every layer up to the chunks in flight) gives, here on a quarter of an H100; a model
    without windows is unchanged."""
    from fleetserve.plan.architecture import load_model_config  # noqa: PLC0415
    from fleetserve.plan.gpus import gpu_type  # noqa: PLC0415
    from fleetserve.plan.memory import kv_bytes_per_sequence  # noqa: PLC0415
    from fleetserve.plan.sizing import Sizing, size_replica  # noqa: PLC0415
    from fleetserve.plan.traffic import kv_sequences  # noqa: PLC0415

    def seqs(config_name: str) -> tuple[float, float]:
        spec = parse_spec(
            {
                "models": [
                    {
                        "name": "summarise",
                        "config": config_name,
                        "max_model_len": 16384,
                        "concurrency": 4,
                        "max_num_seqs": 16,
                        "traffic": {
                            "rate": 1,
                            "prompt_tokens": {"mean": 8000, "p99": 12000},
                            "output_tokens": {"mean": 300, "p99": 600},
                        },
                    }
                ],
                "pools": pools(),
            }
        )
        model = spec.models[0]
        config = load_model_config(config_name)
        sizing = size_replica(model, config, gpu_type("H100-80GB"), 81559 // 4)
        assert isinstance(sizing, Sizing)
        admission = sizing.memory.kv_cache / kv_bytes_per_sequence(
            config, 8150, in_flight_tokens=sizing.engine.max_num_batched_tokens * 2
        )
        return kv_sequences(sizing, 81559, config, model), admission

    held, admitted = seqs("gemma-3-4b")
    assert 2.0 < held / admitted < 3.0
    held, admitted = seqs("qwen2.5-0.5b")
    assert held == pytest.approx(admitted, rel=0.01)


def test_a_model_whose_replica_runs_its_own_server_is_planned_on_one_gpu() -> None:
    """``frontend: process`` runs one GPU per replica (spec.py): the plan must not choose
    tensor parallelism for it, where for the same model it would."""

    spread = plan_fleet(big_on_l4("gemma-3-12b"), time_limit_s=10)
    assert spread.feasible, spread.unplaced
    assert {r.tensor_parallel for r in spread.replicas} != {1}
    alone = plan_fleet(big_on_l4("gemma-3-12b", frontend="process"), time_limit_s=10)
    assert {r.tensor_parallel for r in alone.replicas} <= {1}
    assert not alone.feasible
    [why] = alone.unplaced
    assert why.resource == "gpu_memory"
    assert "needs 27,674 MiB per card" in why.reason  # the whole 12B on one L4


def one_card(models: int, tpot_ms: float, cards: int = 1) -> FleetSpec:
    """``models`` 7B chats at 1 req/s on one node of ``cards`` A6000s: two fit one's memory."""
    return parse_spec(
        {
            "models": [
                {
                    "name": f"chat-{i}",
                    "config": "qwen2.5-7b",
                    "max_model_len": 4096,
                    "traffic": {
                        "rate": 1,
                        "prompt_tokens": {"mean": 300, "p99": 1000},
                        "output_tokens": {"mean": 100, "p99": 300},
                    },
                    "slo": {"ttft_ms": {"p99": 3000}, "tpot_ms": {"p50": tpot_ms}},
                }
                for i in range(models)
            ],
            "pools": [
                {
                    "name": "one",
                    "gpu": {"type": "RTX-A6000", "count": cards},
                    "cpu": 32,
                    "memory_gb": 256,
                    "max_nodes": 1,
                }
            ],
        }
    )


def test_replicas_sharing_a_card_are_predicted_waiting_on_each_others_turns() -> None:
    """A replica's capacity is sized alone; once two land on one card, the report counts
    the turns each step waits (a full one per neighbour, fleetserve.perf's time_sliced) -
    and says so when a target breaks only there."""
    alone = plan(one_card(1, tpot_ms=57))
    [solo] = alone.traffic
    assert solo.met
    assert solo.beside == 0
    assert solo.cores_percent == 50  # half the card: two such replicas fill it
    shared = plan(one_card(2, tpot_ms=57))
    assert shared.feasible  # both placed, on the one card
    assert {tuple(r.gpus) for r in shared.replicas} == {(0,)}
    for t in shared.traffic:
        assert t.beside == 1
        assert t.tpot_ms["p50"] > solo.tpot_ms["p50"] > 0
        assert not t.met
        assert t.binding == "card_sharing"
        assert "TPOT p50" in t.reason
        assert "beside 1 other replica(s) on one card" in t.reason
    # whole cards were tried for the first: the one card then holds it alone
    first = shared.traffic[0]
    assert "whole cards for it leave 1 more replica(s) unplaced (chat-1: " in first.reason
    assert "give it whole cards" not in first.reason
    assert "give it whole cards" in shared.traffic[1].reason  # not tried for the second
    # a target that holds with the wait is met beside the other one too
    loose = plan(one_card(2, tpot_ms=80))
    assert all(t.met and t.beside == 1 and t.binding != "card_sharing" for t in loose.traffic)


def test_a_model_breaking_an_slo_beside_neighbours_is_planned_again_on_whole_cards() -> None:
    """Two 7Bs on one card break TPOT there; with a second card the first is planned again
    on a whole card (re-sized for it: the card's KV cache, all its cores) and the second,
    alone on its slice, meets the target too. Only a miss beside neighbours moves a model."""
    result = plan(one_card(2, tpot_ms=57, cards=2))
    assert result.feasible
    first, second = result.traffic
    assert first.met
    assert second.met
    assert first.own_cards
    assert not second.own_cards
    assert first.cores_percent == 100
    assert first.memory_mb == 49_140
    assert second.cores_percent == 50
    assert first.beside == second.beside == 0
    assert "on whole cards because on shared ones TPOT p50" in first.reason
    assert "beside 1 other replica(s) on one card" in first.reason
    assert {tuple(r.gpus) for r in result.replicas} == {(0,), (1,)}
    whole = {r.model: r.whole_cards for r in result.replicas}
    assert whole == {"chat-0": True, "chat-1": False}
    # a target met on shared cards keeps the slices (and the cheaper single card)
    loose = plan(one_card(2, tpot_ms=80, cards=2))
    assert not any(t.own_cards for t in loose.traffic)
    assert loose.gpus_used == 1


def beside_small(small_traffic: bool) -> FleetSpec:
    """A 7B chat on one A6000 with two Gemma 3 270Ms: planned from their traffic (a known
    load) or as fixed replicas (none)."""
    traffic = {
        "rate": 1,
        "prompt_tokens": {"mean": 300, "p99": 1000},
        "output_tokens": {"mean": 100, "p99": 300},
    }
    slo = {"ttft_ms": {"p99": 3000}, "tpot_ms": {"p50": 80}}
    models: list[dict[str, Any]] = [
        {"name": "big", "config": "qwen2.5-7b", "max_model_len": 4096, "traffic": traffic}
    ]
    models[0]["slo"] = slo
    for i in range(2):
        small: dict[str, Any] = {"name": f"small-{i}", "config": "gemma-3-270m"}
        small["max_model_len"] = 4096
        if small_traffic:
            small.update(traffic=traffic, slo=slo)
        models.append(small)
    one = {"name": "one", "gpu": {"type": "RTX-A6000", "count": 1}, "cpu": 32, "memory_gb": 256}
    return parse_spec({"models": models, "pools": [{**one, "max_nodes": 1}]})


def test_a_neighbour_of_known_load_holds_its_steady_turn_and_one_of_unknown_load_a_full_one() -> (
    None
):
    """The 270Ms' decode steps are shorter than a turn: planned from their traffic, the 7B
    waits only that long for each; as fixed replicas their load is unknown, so the 7B is
    predicted beside two full turns, and its TPOT target breaks there."""
    known = plan(beside_small(small_traffic=True))
    unknown = plan(beside_small(small_traffic=False))
    for p in (known, unknown):
        assert {tuple(r.gpus) for r in p.replicas} == {(0,)}
    big_known = next(t for t in known.traffic if t.model == "big")
    [big_unknown] = unknown.traffic
    assert big_known.beside == big_unknown.beside == 2
    assert big_known.met
    assert big_known.tpot_ms["p50"] < big_unknown.tpot_ms["p50"]
    assert not big_unknown.met
    assert big_unknown.binding == "card_sharing"
    assert "4.0 ms a round" in big_unknown.reason  # two full turns of 2 ms


def test_crowded_models_on_different_cards_move_together_and_a_batch_that_cannot_fit_moves_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five 7Bs on three A6000s: two crowded pairs and one alone. One of each pair moves in
    the same round (a re-plan for the batch); that needs four cards, so the first alone is
    tried and kept. The next round's batch and its first alone both leave a replica out,
    so the shared plan stands with the reason. (The batch is what keeps a fleet of many
    crowded pairs to a few rounds: 24 7Bs on 24 A6000s plan in 21 s, 111 s one a round.)"""
    calls = []
    real = planner._plan_once

    def counting(*args: Any, **kwargs: Any) -> PlanResult:
        calls.append(dict(args[4]))
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "_plan_once", counting)
    result = plan(one_card(5, tpot_ms=57, cards=3))
    assert result.feasible
    by_model = {t.model: t for t in result.traffic}
    assert by_model["chat-0"].own_cards
    assert by_model["chat-0"].met
    crowded = [t for t in result.traffic if t.binding == "card_sharing"]
    assert len(crowded) == 4
    assert "whole cards for it leave 1 more replica(s) unplaced" in crowded[0].reason
    # the first plan; both of chat-0 and chat-2 (one round's batch), then chat-0 alone;
    # then chat-0 with the next batch, and with its first alone
    assert [sorted(c) for c in calls[:3]] == [[], ["chat-0", "chat-2"], ["chat-0"]]
    assert len(calls) == 5
