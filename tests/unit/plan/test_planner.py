"""plan_fleet: placements, derived settings, infeasibility reports, the solvers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve.errors import SpecError
from fleetserve.plan import plan_fleet
from fleetserve.plan.checks import expected_replicas, plan_violations
from fleetserve.plan.memory import CUDA_CONTEXT_BYTES, MiB, estimate_replica, load_model_config
from fleetserve.plan.packer import pack_heuristic
from fleetserve.plan.planner import build_problem, resolve_pool, volume_bound
from fleetserve.plan.problem import check_packing, gpus_used
from fleetserve.plan.sizing import CUDA_VISIBLE_FRACTION
from fleetserve.spec import FleetSpec, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plan"


def fleet(models: list[dict[str, Any]], pools: list[dict[str, Any]], **extra: Any) -> FleetSpec:
    for m in models:
        m.setdefault("source", m.get("config", "x"))
    return parse_spec({"models": models, "pools": pools, **extra})


A6000 = {"name": "a6000", "gpu": {"type": "RTX-A6000", "count": 2}, "cpu": 32, "memory_gb": 128}


def test_seed_004_example_is_feasible_and_valid() -> None:
    spec = load_spec(EXAMPLES / "seed-004.yaml")
    result = plan_fleet(spec, time_limit_s=5)
    assert result.feasible
    assert plan_violations(spec, result) == []
    assert {(r.model, r.index) for r in result.replicas} == expected_replicas(spec)
    # one replica per card would take 12 cards (the TP replica takes 2); the plan proves
    # its packing optimal against the volume bound
    assert result.gpus_used * 1.5 <= len(result.replicas)
    assert result.optimality_gap == 0.0


def test_max_scenario_plans_max_replicas() -> None:
    spec = fleet(
        [
            {
                "name": "q",
                "config": "qwen2.5-0.5b",
                "max_model_len": 4096,
                "replicas": {"min": 1, "max": 5},
            }
        ],
        [A6000],
    )
    low = plan_fleet(spec, scenario="min")
    high = plan_fleet(spec, scenario="max")
    assert len(low.replicas) == 1
    assert len(high.replicas) == 5
    assert high.scenario == "max"
    with pytest.raises(ValueError, match="scenario"):
        plan_fleet(spec, scenario="typical")  # type: ignore[arg-type]


def test_slice_settings_follow_from_the_memory_model() -> None:
    spec = fleet(
        [{"name": "l", "config": "llama-3-8b", "max_model_len": 8192, "concurrency": 4}],
        [A6000],
    )
    r = plan_fleet(spec).replicas[0]
    assert r.card_memory_mb == 49140
    assert r.gpu_type == "RTX-A6000"
    # weights 15.3 GiB + KV 4 x 8192 x 128 KiB = 4 GiB + activation (a cold compile's 2 GiB)
    # + runtime
    assert 21_000 < r.need_mb < 23_000
    assert r.memory_mb == r.need_mb + max(256, -(-r.need_mb * 5 // 100))
    # a fraction of the memory CUDA reports (nvidia-smi's minus the driver's share)
    # less what vLLM's budget does not hold: the engine's CUDA context and its CUDA graphs
    visible = 49140 * CUDA_VISIBLE_FRACTION
    graphs = estimate_replica(
        load_model_config("llama-3-8b"),
        max_model_len=8192,
        concurrency=4,
        max_num_seqs=r.engine.max_num_seqs,
        max_num_batched_tokens=r.engine.max_num_batched_tokens,
    ).cuda_graphs
    budget = r.need_mb - (CUDA_CONTEXT_BYTES + graphs) / MiB
    assert r.engine.gpu_memory_utilization == pytest.approx(budget / visible, abs=1e-4)
    assert r.engine.gpu_memory_utilization * visible >= budget
    assert r.engine.gpu_memory_utilization * 49140 <= r.memory_mb
    assert r.engine.slice_memory_utilization == pytest.approx(r.need_mb / r.memory_mb, abs=1e-4)
    assert r.cores_percent == -(-100 * r.memory_mb // 49140)
    assert r.num_gpus == pytest.approx(r.memory_mb / 49140, abs=1e-4)
    assert r.engine.max_num_seqs == 4
    assert r.engine.kv_cache_tokens == 4 * 8192
    assert not r.whole_cards


def test_an_eager_engine_gets_a_smaller_slice_without_graphs_or_compile() -> None:
    """``engine_args.enforce_eager`` reaches the memory model: the slice loses the CUDA
    graphs and the cold compile's peak (2 GiB for Llama 3 8B), nothing else."""
    base = {"name": "l", "config": "llama-3-8b", "max_model_len": 8192, "concurrency": 4}
    compiled = plan_fleet(fleet([dict(base)], [A6000])).replicas[0]
    eager = plan_fleet(fleet([{**base, "engine_args": {"enforce_eager": True}}], [A6000])).replicas[
        0
    ]
    assert 1_500 < compiled.need_mb - eager.need_mb < 3_000
    assert eager.engine.gpu_memory_utilization < compiled.engine.gpu_memory_utilization
    assert eager.engine.kv_cache_tokens == compiled.engine.kv_cache_tokens


def test_tensor_parallel_takes_whole_cards_of_one_node() -> None:
    spec = fleet(
        [
            {
                "name": "big",
                "config": "llama-3-70b",
                "quantization": "awq",
                "max_model_len": 8192,
                "tensor_parallel": 2,
                "replicas": {"min": 2, "max": 2},
            }
        ],
        [A6000],
    )
    result = plan_fleet(spec)
    assert result.feasible
    assert plan_violations(spec, result) == []
    for r in result.replicas:
        assert r.whole_cards
        assert r.cores_percent == 100
        assert r.num_gpus == 2
        assert sorted(r.gpus) == [0, 1]
        assert r.engine.gpu_memory_utilization == 0.92
    assert result.nodes == {"a6000": 2}


def test_dedicated_tenant_never_shares_a_card() -> None:
    spec = fleet(
        [
            {
                "name": "a",
                "config": "qwen2.5-0.5b",
                "max_model_len": 2048,
                "tenant": "ext",
                "replicas": {"min": 1, "max": 1},
            },
            {
                "name": "b",
                "config": "qwen2.5-0.5b",
                "max_model_len": 2048,
                "replicas": {"min": 1, "max": 1},
            },
        ],
        [A6000],
        tenants=[{"name": "ext", "isolation": "dedicated"}],
    )
    result = plan_fleet(spec)
    cards = {(r.model, r.pool, r.node, r.gpus[0]) for r in result.replicas}
    assert len({c[1:] for c in cards}) == 2
    assert result.gpus_used == 2
    shared = spec.model_copy(update={"tenants": []})
    shared = fleet(
        [
            {"name": "a", "config": "qwen2.5-0.5b", "max_model_len": 2048, "tenant": "ext"},
            {"name": "b", "config": "qwen2.5-0.5b", "max_model_len": 2048},
        ],
        [A6000],
        tenants=[{"name": "ext", "isolation": "shared"}],
    )
    assert plan_fleet(shared).gpus_used == 1


def test_model_pools_are_honoured() -> None:
    t4 = {"name": "t4", "gpu": {"type": "T4", "count": 4}, "cpu": 16, "memory_gb": 64}
    spec = fleet(
        [
            {
                "name": "q",
                "config": "qwen2.5-0.5b",
                "max_model_len": 2048,
                "pools": ["t4"],
                "replicas": {"min": 3, "max": 3},
            }
        ],
        [A6000, t4],
    )
    assert {r.pool for r in plan_fleet(spec).replicas} == {"t4"}


def test_too_big_for_every_card_says_why_and_how_to_fix() -> None:
    spec = fleet(
        [{"name": "big", "config": "llama-3-70b", "max_model_len": 8192, "concurrency": 8}],
        [A6000],
    )
    result = plan_fleet(spec)
    assert not result.feasible
    (u,) = result.unplaced
    assert u.model == "big"
    assert u.resource == "gpu_memory"
    assert u.shortfall is not None
    assert u.shortfall > 100_000
    assert "RTX-A6000" in u.reason
    assert "short by" in u.reason
    assert any(f.startswith("tensor_parallel: 4") for f in u.fixes), u.fixes
    assert any(f.startswith("a bigger card: H200") for f in u.fixes) is False  # 141 GB > 126 GiB
    assert result.optimality_gap is None or result.replicas == []


def test_fix_suggestions_are_real_fits() -> None:
    spec = fleet(
        [{"name": "l", "config": "llama-3.1-8b", "max_model_len": 32768, "concurrency": 8}],
        [{"name": "l4", "gpu": {"type": "L4", "count": 1}, "cpu": 8, "memory_gb": 32}],
    )
    (u,) = plan_fleet(spec).unplaced
    fixes = " | ".join(u.fixes)
    assert "a bigger card" in fixes
    assert "quantization" in fixes or "tensor_parallel" in fixes
    assert "max_model_len:" in fixes
    longest = int(next(f for f in u.fixes if f.startswith("max_model_len")).split()[1])
    shorter = fleet(
        [
            {
                "name": "l",
                "config": "llama-3.1-8b",
                "max_model_len": longest,
                "concurrency": 8,
                "quantization": None,
            }
        ],
        [{"name": "l4", "gpu": {"type": "L4", "count": 1}, "cpu": 8, "memory_gb": 32}],
    )
    assert plan_fleet(shorter).feasible


def test_tp_larger_than_a_node_is_reported() -> None:
    spec = fleet(
        [{"name": "big", "config": "llama-3-70b", "tensor_parallel": 4, "max_model_len": 4096}],
        [A6000],
    )
    (u,) = plan_fleet(spec).unplaced
    assert u.resource == "gpu_count"
    assert "tensor_parallel 4 > 2 cards per node" in u.reason  # TP stays within a node
    assert u.reason.startswith("models[0].tensor_parallel: ")


def test_full_pools_report_capacity() -> None:
    pool = {**A6000, "max_nodes": 1}
    spec = fleet(
        [
            {
                "name": "l",
                "config": "llama-3-8b",
                "max_model_len": 8192,
                "concurrency": 16,
                "replicas": {"min": 5, "max": 5},
            }
        ],
        [pool],
    )
    result = plan_fleet(spec)
    assert not result.feasible
    assert len(result.replicas) + len(result.unplaced) == 5
    assert all(u.resource == "capacity" for u in result.unplaced)
    assert "raise pools[0].max_nodes of 'a6000' (now 1)" in result.unplaced[0].fixes[0]
    assert plan_violations(spec, result) == []


def test_fp8_is_refused_on_cards_without_support() -> None:
    spec = fleet(
        [{"name": "l", "config": "llama-3.2-1b", "quantization": "fp8", "max_model_len": 2048}],
        [{"name": "v100", "gpu": {"type": "V100-16GB", "count": 1}, "cpu": 8, "memory_gb": 32}],
    )
    (u,) = plan_fleet(spec).unplaced
    assert u.resource == "gpu_capability"


def test_cpu_only_pool_hosts_no_gpu_replicas() -> None:
    spec = fleet(
        [{"name": "q", "config": "qwen2.5-0.5b", "max_model_len": 2048}],
        [{"name": "cpu", "cpu": 8, "memory_gb": 32}],
    )
    (u,) = plan_fleet(spec).unplaced
    assert u.resource == "pool"
    assert "has no GPUs" in u.reason


def test_no_pools_at_all() -> None:
    spec = fleet([{"name": "q", "config": "qwen2.5-0.5b"}], [])
    result = plan_fleet(spec)
    assert not result.feasible
    assert result.unplaced[0].resource == "pool"


def test_unknown_gpu_type_and_model_config_are_spec_errors() -> None:
    bad_gpu = fleet(
        [{"name": "q", "config": "qwen2.5-0.5b"}],
        [{"name": "p", "gpu": {"type": "Z9000", "count": 1}}],
    )
    with pytest.raises(SpecError, match="unknown GPU type 'Z9000'"):
        plan_fleet(bad_gpu)
    bad_model = fleet([{"name": "q", "config": "nonesuch-7b"}], [A6000])
    with pytest.raises(SpecError, match="model 'q': config 'nonesuch-7b'"):
        plan_fleet(bad_model)


def test_custom_card_memory() -> None:
    spec = fleet(
        [{"name": "q", "config": "qwen2.5-0.5b", "max_model_len": 2048}],
        [{"name": "p", "gpu": {"memory_gb": 24, "count": 1}}],
    )
    r = plan_fleet(spec).replicas[0]
    assert r.card_memory_mb == 24 * 1024  # memory_gb is GiB


def test_milp_proves_optimality_on_a_small_fleet() -> None:
    spec = fleet(
        [
            {
                "name": "a",
                "config": "llama-3-8b",
                "max_model_len": 8192,
                "concurrency": 8,
                "replicas": {"min": 3, "max": 3},
            },
            {
                "name": "b",
                "config": "qwen2.5-1.5b",
                "max_model_len": 8192,
                "concurrency": 16,
                "replicas": {"min": 4, "max": 4},
            },
        ],
        [A6000],
    )
    result = plan_fleet(spec, time_limit_s=20)
    assert result.optimality_gap == 0.0
    assert result.lower_bound == result.gpus_used
    assert plan_violations(spec, result) == []


def test_heuristic_only_reports_a_bound() -> None:
    spec = load_spec(EXAMPLES / "seed-004.yaml")
    result = plan_fleet(spec, time_limit_s=0)
    assert result.solver == "heuristic"
    assert result.lower_bound is not None
    assert result.lower_bound <= result.gpus_used
    assert result.optimality_gap is not None
    assert result.optimality_gap == pytest.approx(
        (result.gpus_used - result.lower_bound) / result.gpus_used, abs=1e-4
    )


def test_heuristic_never_beats_the_volume_bound() -> None:
    spec = load_spec(EXAMPLES / "seed-004.yaml")
    pools = [resolve_pool(p) for p in spec.pools]
    problem, _ = build_problem(spec, pools, "max")
    packing = pack_heuristic(problem)
    assert check_packing(problem, packing) == []
    placed = [it for it in problem.items if it.key not in packing.unplaced]
    assert gpus_used(packing) >= volume_bound(placed, problem.pools)


def test_gpu_spread_uses_more_cards_on_the_same_nodes() -> None:
    models = [
        {
            "name": "q",
            "config": "qwen2.5-0.5b",
            "max_model_len": 2048,
            "replicas": {"min": 2, "max": 2},
        }
    ]
    packed = plan_fleet(fleet(models, [A6000], policy={"gpu": "binpack"}))
    spread = plan_fleet(fleet(models, [A6000], policy={"gpu": "spread"}))
    assert packed.gpus_used == 1
    assert spread.gpus_used == 2
    assert packed.nodes == spread.nodes == {"a6000": 1}


def test_json_contract_keys() -> None:
    spec = load_spec(EXAMPLES / "seed-004.yaml")
    data = plan_fleet(spec, time_limit_s=1).model_dump(mode="json")
    for key in ("feasible", "gpus_used", "nodes", "optimality_gap", "replicas", "unplaced"):
        assert key in data
    replica = data["replicas"][0]
    for key in ("model", "index", "pool", "node", "gpus", "memory_mb", "cores_percent", "engine"):
        assert key in replica
    assert set(replica["engine"]) >= {
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_model_len",
        "max_num_batched_tokens",
    }


@pytest.mark.parametrize("scenario", ["min", "max"])
def test_heterogeneous_example_is_valid(scenario: str) -> None:
    spec = load_spec(EXAMPLES / "heterogeneous.yaml")
    result = plan_fleet(spec, scenario=scenario, time_limit_s=1)  # type: ignore[arg-type]
    assert plan_violations(spec, result) == []
    if scenario == "min":
        assert result.feasible
        assert len(result.replicas) >= 3 * result.gpus_used


def test_pool_memory_overrides_the_catalogue_but_keeps_the_type() -> None:
    spec = fleet(
        [{"name": "q", "config": "qwen2.5-0.5b", "max_model_len": 2048}],
        [{"name": "p", "gpu": {"type": "A100-80GB", "memory_gb": 40, "count": 1}}],
    )
    r = plan_fleet(spec).replicas[0]
    assert r.gpu_type == "A100-80GB"
    assert r.card_memory_mb == 40 * 1024


def test_pipeline_parallel_spans_whole_cards() -> None:
    spec = fleet(
        [{"name": "big", "config": "qwen2.5-32b", "max_model_len": 8192, "pipeline_parallel": 2}],
        [{"name": "a100", "gpu": {"type": "A100-80GB", "count": 4}, "cpu": 64, "memory_gb": 512}],
    )
    (r,) = plan_fleet(spec).replicas
    assert len(r.gpus) == 2
    assert r.whole_cards
    assert r.pipeline_parallel == 2
    assert r.num_gpus == 2


def test_fp8_kv_cache_shrinks_the_slice() -> None:
    base = {"name": "l", "config": "llama-3.1-8b", "max_model_len": 16384, "concurrency": 8}
    auto = plan_fleet(fleet([dict(base)], [A6000])).replicas[0]
    fp8 = plan_fleet(fleet([{**base, "kv_cache_dtype": "fp8"}], [A6000])).replicas[0]
    kv_auto = 8 * 16384 * 128 * 1024 // 2**20  # MiB
    assert auto.need_mb - fp8.need_mb == pytest.approx(kv_auto / 2, abs=2)
