"""Property tests: whatever the fleet, a plan never breaks a placement rule.

Hypothesis draws fleets (models from the catalogue with random context, concurrency, TP,
quantization, tenants and pool restrictions; heterogeneous pools with random card counts
and node limits) and checks every plan with :func:`plan_violations` and every raw packing
with :func:`check_packing`: no card over its memory or 100 % cores, at most
deviceSplitCount slices per card, TP replicas on whole cards of one node, dedicated tenants
alone on their cards, node CPU/RAM respected, and every replica placed or reported.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.plan import plan_fleet
from fleetserve.plan.checks import plan_violations
from fleetserve.plan.milp import solve_milp
from fleetserve.plan.packer import pack_heuristic
from fleetserve.plan.planner import build_problem, host_ram_mb, resolve_pool
from fleetserve.plan.problem import check_packing, gpus_used, score
from fleetserve.spec import FleetSpec, parse_spec

MODELS = [
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "gemma-3-1b",
    "llama-3.2-3b",
    "llama-3-8b",
    "qwen2.5-14b",
    "phi-4",
    "llama-3-70b",
]
GPUS = ["T4", "L4", "RTX-A6000", "A100-80GB", "H100", "H200"]
POOL_NAMES = ["p0", "p1", "p2"]


@st.composite
def fleets(draw: st.DrawFn) -> FleetSpec:
    n_pools = draw(st.integers(1, 3))
    pools: list[dict[str, Any]] = []
    for i in range(n_pools):
        pools.append(
            {
                "name": POOL_NAMES[i],
                "gpu": {"type": draw(st.sampled_from(GPUS)), "count": draw(st.integers(1, 8))},
                "cpu": draw(st.sampled_from([4, 16, 64])),
                "memory_gb": draw(st.sampled_from([16, 64, 512])),
                "max_nodes": draw(st.one_of(st.none(), st.integers(1, 3))),
            }
        )
    tenants = [{"name": "a", "isolation": "dedicated"}, {"name": "b", "isolation": "shared"}]
    models: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 6))):
        config = draw(st.sampled_from(MODELS))
        tp = draw(st.sampled_from([1, 1, 1, 2, 4]))
        replicas = draw(st.integers(0, 4))
        model: dict[str, Any] = {
            "name": f"m{i}",
            "source": config,
            "config": config,
            "max_model_len": draw(st.sampled_from([1024, 4096, 8192, 32768])),
            "concurrency": draw(st.sampled_from([1, 4, 16, 64])),
            "tensor_parallel": tp,
            # PP stages may cross nodes: TP x PP above a pool's cards per node spans nodes
            "pipeline_parallel": draw(st.sampled_from([1, 1, 1, 2, 3, 4])),
            "replicas": {"min": replicas, "max": max(1, replicas + draw(st.integers(0, 3)))},
            "tenant": draw(st.sampled_from([None, "a", "b"])),
        }
        quant = draw(st.sampled_from([None, None, "fp8", "awq"]))
        if quant:
            model["quantization"] = quant
        if draw(st.booleans()):
            model["pools"] = draw(
                st.lists(st.sampled_from(POOL_NAMES[:n_pools]), min_size=1, unique=True)
            )
        models.append(model)
    policy = {
        "node": draw(st.sampled_from(["spread", "binpack"])),
        "gpu": draw(st.sampled_from(["spread", "binpack"])),
    }
    return parse_spec({"models": models, "pools": pools, "tenants": tenants, "policy": policy})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=fleets(), scenario=st.sampled_from(["min", "max"]))
def test_plans_never_break_a_rule(spec: FleetSpec, scenario: str) -> None:
    result = plan_fleet(spec, scenario=scenario, time_limit_s=1)  # type: ignore[arg-type]
    assert plan_violations(spec, result) == []
    assert result.feasible == (not result.unplaced)
    assert result.gpus_used == len(
        {(r.pool, n.node, g) for r in result.replicas for n in r.spans for g in n.gpus}
    )
    if result.lower_bound is not None and result.feasible:
        assert result.lower_bound <= result.gpus_used
    for u in result.unplaced:
        assert u.reason
        assert u.resource in {
            "gpu_memory",
            "gpu_count",
            "gpu_capability",
            "engine",
            "cpu",
            "memory",
            "pool",
            "capacity",
            "isolation",
            "gpu_slices",
            "gpu_cores",
        }
        assert u.fixes, u  # never a replica left out with no way forward
    # host RAM and CPUs of every node (plan_violations checks the cards)
    pools = {p.name: resolve_pool(p).shape for p in spec.pools}
    ram: dict[tuple[str, int], int] = {}
    cpu: dict[tuple[str, int], float] = {}
    for r in result.replicas:
        model = spec.model(r.model)
        for share in r.spans:  # a replica over several nodes reserves RAM/CPUs on each
            node = (r.pool, share.node)
            ram[node] = ram.get(node, 0) + host_ram_mb(model, len(share.gpus))
            cpu[node] = cpu.get(node, 0.0) + model.resources.cpu
    for node, used in ram.items():
        shape = pools[node[0]]
        assert shape is not None
        assert used <= shape.ram_mb, (node, used, shape.ram_mb)
        assert cpu[node] <= shape.cpu + 1e-9


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=fleets())
def test_heuristic_and_milp_packings_are_valid_and_milp_is_no_worse(spec: FleetSpec) -> None:
    pools = [resolve_pool(p) for p in spec.pools]
    problem, _ = build_problem(spec, pools, "max")
    heuristic = pack_heuristic(problem)
    assert check_packing(problem, heuristic) == []
    exact = solve_milp(problem, heuristic, time_limit_s=5)
    if exact is not None:
        assert check_packing(problem, exact) == []
        if exact.proven:  # a proven level is never worse than the heuristic's
            level = len(exact.proven) if "cost" in exact.proven else len(exact.proven) + 1
            assert score(problem, exact)[:level] <= score(problem, heuristic)[:level]
        if exact.lower_bound is not None and not exact.unplaced and not heuristic.unplaced:
            assert exact.lower_bound <= gpus_used(heuristic)
