"""Replicas whose pipeline stages cross nodes (issue #10 point 7: TP 8 x PP 2 on two 8-GPU
nodes was refused).

vLLM runs such a replica with its Ray executor: each tensor-parallel group on one node, the
pipeline stages across nodes. The planner places it as one replica over several nodes of one
pool, whole cards, each stage's memory checked per card and host RAM/CPUs per node; both
packers (heuristic and MILP) treat it the same way.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve.plan import plan_fleet
from fleetserve.plan.checks import plan_violations
from fleetserve.plan.memory import (
    estimate_replica,
    rope_cache_bytes,
    weight_bytes,
    weight_bytes_per_card,
)
from fleetserve.plan.milp import solve_milp
from fleetserve.plan.packer import pack_heuristic
from fleetserve.plan.planner import build_problem, node_span, resolve_pool
from fleetserve.plan.problem import check_packing, score
from fleetserve.plan.result import PlanResult
from fleetserve.plan.sizing import model_config_for
from fleetserve.spec import FleetSpec, parse_spec
from fleetserve.units import MiB

H100 = {"name": "h100", "gpu": {"type": "H100-80GB", "count": 8}, "max_nodes": 4}
BIG = {
    "name": "big",
    "source": "llama-3.1-405b",
    "config": "llama-3.1-405b",
    "max_model_len": 8192,
    "tensor_parallel": 8,
    "pipeline_parallel": 2,
}


def fleet(models: list[dict[str, Any]], pools: list[dict[str, Any]], **extra: Any) -> FleetSpec:
    return parse_spec({"models": models, "pools": pools, **extra})


@pytest.mark.parametrize(
    ("tp", "pp", "cards", "span"),
    [
        (8, 2, 8, (2, 8)),  # the case: one stage per 8-GPU node
        (4, 4, 8, (2, 8)),  # two stages per node
        (2, 3, 4, (3, 2)),  # 3 stages do not pair up: one per node, 2 cards each
        (4, 2, 8, (1, 8)),  # fits one node: not spread
        (16, 1, 8, None),  # a TP group never crosses nodes
        (8, 2, 4, None),
    ],
)
def test_node_span(tp: int, pp: int, cards: int, span: tuple[int, int] | None) -> None:
    assert node_span(tp, pp, cards) == span


def test_tp8_pp2_is_placed_over_two_8_gpu_nodes() -> None:
    spec = fleet([dict(BIG)], [H100])
    result = plan_fleet(spec)
    assert result.feasible, result.unplaced
    (r,) = result.replicas
    assert [(n.node, n.gpus, n.stages) for n in r.spans] == [
        (0, list(range(8)), [0]),
        (1, list(range(8)), [1]),
    ]
    assert (r.node, r.gpus) == (0, list(range(8)))  # the existing fields: the first node
    assert r.whole_cards
    assert r.num_gpus == 16
    assert result.gpus_used == 16
    assert result.nodes == {"h100": 2}
    assert result.optimal == ["replicas", "gpus", "nodes"]
    assert plan_violations(spec, result) == []
    # the JSON contract shows the nodes, and reads back the same
    data = result.model_dump(mode="json")
    assert [n["node"] for n in data["replicas"][0]["nodes"]] == [0, 1]
    assert PlanResult.model_validate(data) == result


def test_without_a_second_node_it_is_refused_with_fixes_that_plan() -> None:
    one = {**H100, "max_nodes": 1}
    (u,) = plan_fleet(fleet([dict(BIG)], [one])).unplaced
    assert u.resource == "gpu_count"
    assert "spanning 2 nodes (8 cards each) exceeds its max_nodes 1" in u.reason
    assert u.fixes[0].startswith("raise pools[0].max_nodes of 'h100' to 2 (now 1)")
    assert plan_fleet(fleet([dict(BIG)], [{**one, "max_nodes": 2}])).feasible
    # a fix within one node: 405B in fp8 on 8 H100s, planned as suggested
    assert u.fixes[1] == "tensor_parallel: 8, pipeline_parallel: 1, quantization: fp8 on 'h100'"
    fixed = {**BIG, "pipeline_parallel": 1, "quantization": "fp8"}
    assert plan_fleet(fleet([fixed], [one])).feasible


def test_tp_wider_than_a_node_is_refused_with_a_pipeline_fix() -> None:
    wide = {**BIG, "tensor_parallel": 16, "pipeline_parallel": 1}
    (u,) = plan_fleet(fleet([wide], [H100])).unplaced
    assert u.resource == "gpu_count"
    assert u.reason.startswith("models[0].tensor_parallel: ")
    assert "tensor_parallel 16 > 8 cards per node" in u.reason
    assert u.fixes[0].startswith("tensor_parallel: 8, pipeline_parallel: 2 on 'h100'")
    assert plan_fleet(fleet([dict(BIG)], [H100])).feasible  # that fix, planned


def test_each_stage_memory_is_checked_per_card() -> None:
    spec = fleet([dict(BIG)], [H100])
    config = model_config_for(spec.models[0])
    (r,) = plan_fleet(spec).replicas
    expected = estimate_replica(
        config,
        max_model_len=8192,
        concurrency=spec.models[0].concurrency,
        max_num_seqs=r.engine.max_num_seqs,
        max_num_batched_tokens=r.engine.max_num_batched_tokens,
        tensor_parallel=8,
        pipeline_parallel=2,
    )
    assert r.need_mb == expected.total_mb
    # the fuller stage's weights (63 of the 126 layers and the embedding table, or the
    # LM head) split 8 ways: 1/16 of the model here, as the two stages weigh the same
    stage = weight_bytes_per_card(config, tensor_parallel=8, pipeline_parallel=2)
    table = config.vocab_size * config.hidden_size * 2
    assert weight_bytes(config) / 16 <= stage < weight_bytes(config) / 16 + table / 8
    # odd layer counts: the remainder goes to a stage (vLLM's get_pp_indices), and the
    # plan holds the fuller one
    assert weight_bytes_per_card(config, tensor_parallel=8, pipeline_parallel=4) > (
        weight_bytes(config) / 32
    )
    assert expected.weights == stage + rope_cache_bytes(config)  # RoPE cache: every card
    # one 8-card node does not hold the bf16 weights at all: PP across nodes is what fits
    single = {**BIG, "pipeline_parallel": 1}
    (u,) = plan_fleet(fleet([single], [H100])).unplaced
    assert u.resource == "gpu_memory"
    assert stage / MiB < r.card_memory_mb


def test_a_stage_that_does_not_fit_its_card_is_refused() -> None:
    # TP 2 x PP 2 of the 405B: each card would hold a quarter of the model
    small = {**BIG, "tensor_parallel": 2, "pipeline_parallel": 2}
    (u,) = plan_fleet(fleet([small], [{**H100, "gpu": {"type": "H100-80GB", "count": 2}}])).unplaced
    assert u.resource == "gpu_memory"


def _three_stage_fleet(memory_gb: float) -> FleetSpec:
    # TP 4 x PP 3 on 8-card nodes: 3 nodes x 4 cards per replica; two replicas share the
    # three nodes only when each node's host RAM holds both replicas' shares
    model = {
        "name": "m",
        "source": "llama-3-8b",
        "config": "llama-3-8b",
        "max_model_len": 4096,
        "tensor_parallel": 4,
        "pipeline_parallel": 3,
        "resources": {"cpu": 4, "memory_gb": memory_gb},
        "replicas": {"min": 2, "max": 2},
    }
    pool = {**H100, "max_nodes": 6, "cpu": 64, "memory_gb": 100}
    return fleet([model], [pool])


@pytest.mark.parametrize(("memory_gb", "nodes"), [(40, 3), (60, 6)])
def test_host_ram_is_reserved_on_every_node(memory_gb: float, nodes: int) -> None:
    spec = _three_stage_fleet(memory_gb)
    result = plan_fleet(spec)
    assert result.feasible
    assert result.nodes == {"h100": nodes}
    assert all(len(r.spans) == 3 for r in result.replicas)
    assert plan_violations(spec, result) == []
    assert "nodes" in result.optimal


def test_a_node_too_small_for_one_share_is_refused_per_node() -> None:
    spec = _three_stage_fleet(120)
    (u, _) = plan_fleet(spec).unplaced
    assert u.resource == "memory"
    assert "on each of its nodes" in u.reason
    assert u.fixes == [
        "raise pools[0].memory_gb of 'h100' to 120 (now 100)",
        "lower models[0].resources.memory_gb of 'm' to at most 100 (now 120)",
    ]


def test_a_second_spanning_replica_without_two_free_nodes_is_a_capacity_limit() -> None:
    # three nodes: the first replica takes two, the second needs two more
    spec = fleet([{**BIG, "replicas": {"min": 2, "max": 2}}], [{**H100, "max_nodes": 3}])
    result = plan_fleet(spec)
    (u,) = result.unplaced
    assert u.resource == "capacity"
    assert "raise pools[0].max_nodes of 'h100' (now 3)" in u.fixes
    assert result.optimal == ["replicas", "gpus", "nodes"]  # one replica is the most


def test_heuristic_and_milp_agree_on_spanning_replicas() -> None:
    # prices make cost a level the heuristic cannot prove: the MILP runs
    models = [
        {**BIG, "replicas": {"min": 1, "max": 1}},
        {
            "name": "small",
            "source": "llama-3-8b",
            "config": "llama-3-8b",
            "max_model_len": 8192,
            "tensor_parallel": 2,
            "pipeline_parallel": 3,
            "replicas": {"min": 2, "max": 2},
        },
    ]
    pools = [
        {**H100, "cost_per_hour": 30},
        {"name": "l4", "gpu": {"type": "L4", "count": 4}, "max_nodes": 6, "cost_per_hour": 4},
    ]
    spec = fleet(models, pools)
    cards = [resolve_pool(p) for p in spec.pools]
    problem, _ = build_problem(spec, cards, "min")
    heuristic = pack_heuristic(problem)
    assert check_packing(problem, heuristic) == []
    exact = solve_milp(problem, heuristic, time_limit_s=30)
    assert exact is not None
    assert check_packing(problem, exact) == []
    assert exact.proven == ("replicas", "cost", "gpus", "nodes")
    assert score(problem, exact) <= score(problem, heuristic)
    assert all(len(a.parts) == 2 for k, a in exact.assigned.items() if k[0] == "big")
    result = plan_fleet(spec)
    assert result.feasible
    assert plan_violations(spec, result) == []
    assert result.optimal == ["replicas", "cost", "gpus", "nodes"]
    spans = {r.model: len(r.spans) for r in result.replicas}
    # 2 x 3 stages on 4-card L4 nodes: one stage per node fits (2 cards), two do not divide 3
    assert spans == {"big": 2, "small": 3}
    assert result.cost_per_hour == 2 * 30 + 3 * 4  # the small replicas share 3 L4 nodes
