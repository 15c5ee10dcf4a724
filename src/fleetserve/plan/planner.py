"""The planner: a fleet spec in, a :class:`PlanResult` out (pure; no I/O but reading the
model configs the spec names).

Design note. Three steps. (1) Size every model on every pool it may use
(:mod:`fleetserve.plan.sizing`): the slice, cores and engine settings, or why it cannot go
there. (2) Pack the replicas (:mod:`fleetserve.plan.packer` first, then the exact
:mod:`fleetserve.plan.milp` within the time limit when the instance is small enough);
keep whichever places more replicas on fewer cards, and report the gap to the best proven
lower bound (the MILP's dual bound, or the volume bound of :func:`volume_bound`).
(3) Explain each replica left out: which resource, by how much, and the fixes the memory
model says would work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from fleetserve.plan.gpus import GpuType, custom_gpu, gpu_type
from fleetserve.plan.memory import ModelConfig
from fleetserve.plan.milp import solve_milp
from fleetserve.plan.packer import pack_heuristic, respread
from fleetserve.plan.problem import (
    DEVICE_SPLIT_COUNT,
    Demand,
    Item,
    Packing,
    PoolShape,
    Problem,
    gpus_used,
)
from fleetserve.plan.result import PlanResult, PoolUsage, ReplicaPlacement, Unplaced
from fleetserve.plan.sizing import (
    DEFAULT_HOST_RAM_MB,
    Rejection,
    Sizing,
    model_config_for,
    size_replica,
    suggest_fixes,
)
from fleetserve.spec import FleetSpec, ModelSpec, PoolSpec

Scenario = Literal["min", "max"]


@dataclass(frozen=True)
class PoolCard:
    """A pool with its card resolved from the catalogue."""

    spec: PoolSpec
    gpu: GpuType | None
    shape: PoolShape | None


def resolve_pool(pool: PoolSpec, split_count: int = DEVICE_SPLIT_COUNT) -> PoolCard:
    """The pool's card type and packing shape (shape None for CPU-only pools)."""
    if pool.gpu is None or pool.gpu.count == 0:
        return PoolCard(pool, None, None)
    if pool.gpu.type is not None:
        gpu = gpu_type(pool.gpu.type)
        if pool.gpu.memory_gb is not None:
            override = custom_gpu(pool.gpu.memory_gb, gpu.name)
            gpu = GpuType(gpu.name, override.memory_mib, gpu.sm_count, gpu.bf16, gpu.fp8)
    else:
        assert pool.gpu.memory_gb is not None  # GpuSpec's validator guarantees one of them
        gpu = custom_gpu(pool.gpu.memory_gb)
    shape = PoolShape(
        name=pool.name,
        gpu_type=gpu.name,
        card_mb=gpu.memory_mib,
        cards_per_node=pool.gpu.count,
        cpu=pool.cpu,
        ram_mb=int(pool.memory_gb * 1e9 / 2**20),
        max_nodes=pool.max_nodes,
        min_nodes=pool.min_nodes,
        split_count=split_count,
    )
    return PoolCard(pool, gpu, shape)


def host_ram_mb(model: ModelSpec, cards: int) -> int:
    if model.resources.memory_gb is not None:
        return int(model.resources.memory_gb * 1e9 / 2**20)
    return DEFAULT_HOST_RAM_MB * cards


@dataclass
class _ModelPlan:
    model: ModelSpec
    config: ModelConfig
    sizing: dict[str, Sizing]
    rejections: dict[str, Rejection]


def _replica_count(model: ModelSpec, scenario: str) -> int:
    if scenario == "max":
        return model.replicas.max
    if scenario == "local":
        return max(1, model.replicas.min)
    return model.replicas.min


def build_problem(
    spec: FleetSpec, pools: list[PoolCard], scenario: str
) -> tuple[Problem, dict[str, _ModelPlan]]:
    """Size every model on every pool it may use, and list the replicas to place."""
    dedicated = {t.name for t in spec.tenants if t.isolation == "dedicated"}
    plans: dict[str, _ModelPlan] = {}
    items: list[Item] = []
    for model in spec.models:
        config = model_config_for(model)
        plan = _ModelPlan(model, config, {}, {})
        allowed = set(model.pools) if model.pools is not None else None
        for pc in pools:
            name = pc.spec.name
            if allowed is not None and name not in allowed:
                continue
            if pc.shape is None or pc.gpu is None:
                plan.rejections[name] = Rejection("pool", 0, f"pool '{name}' has no GPUs")
                continue
            shape = pc.shape
            sized = size_replica(
                model, config, pc.gpu, shape.card_mb, split_count=shape.split_count
            )
            if isinstance(sized, Rejection):
                plan.rejections[name] = sized
                continue
            if sized.cards > shape.cards_per_node:
                plan.rejections[name] = Rejection(
                    "gpu_count",
                    sized.cards - shape.cards_per_node,
                    f"tensor_parallel x pipeline_parallel = {sized.cards} cards > "
                    f"{shape.cards_per_node} per node in pool '{name}'",
                )
                continue
            ram = host_ram_mb(model, sized.cards)
            if model.resources.cpu > shape.cpu or ram > shape.ram_mb:
                short_cpu = model.resources.cpu > shape.cpu
                plan.rejections[name] = Rejection(
                    "cpu" if short_cpu else "memory",
                    model.resources.cpu - shape.cpu if short_cpu else ram - shape.ram_mb,
                    f"a replica needs {model.resources.cpu:g} CPUs / {ram:,} MiB RAM; a "
                    f"'{name}' node has {shape.cpu:g} / {shape.ram_mb:,}",
                )
                continue
            plan.sizing[name] = sized
        plans[model.name] = plan
        demands = {
            name: Demand(
                mem_mb=s.slice_mb,
                cores=s.cores,
                cards=s.cards,
                whole=s.whole,
                cpu=model.resources.cpu,
                ram_mb=host_ram_mb(model, s.cards),
            )
            for name, s in plan.sizing.items()
        }
        for index in range(_replica_count(model, scenario)):
            items.append(
                Item(
                    model=model.name,
                    index=index,
                    tenant=model.tenant,
                    dedicated=model.tenant in dedicated,
                    demands=demands,
                )
            )
    shapes = tuple(pc.shape for pc in pools if pc.shape is not None)
    problem = Problem(
        items=tuple(items),
        pools=shapes,
        policy_node=spec.policy.node,
        policy_gpu=spec.policy.gpu,
    )
    return problem, plans


def volume_bound(items: Iterable[Item], pools: tuple[PoolShape, ...]) -> int:
    """A proven lower bound on cards: per isolation group, the larger of the memory,
    cores and slice-count volumes (each replica counted on its most favourable pool)."""
    shapes = {p.name: p for p in pools}
    groups: dict[str | None, list[Item]] = {}
    for it in items:
        if it.demands:
            groups.setdefault(it.tenant if it.dedicated else None, []).append(it)
    total = 0
    for members in groups.values():
        mem = cores = slots = 0.0
        for it in members:
            whole = [d.cards for d in it.demands.values() if d.whole]
            if whole and len(whole) == len(it.demands):
                mem += min(whole)
                cores += min(whole)
                slots += min(whole)
                continue
            mem += min(
                d.cards if d.whole else d.mem_mb / shapes[p].card_mb for p, d in it.demands.items()
            )
            cores += min(d.cards if d.whole else d.cores / 100 for d in it.demands.values())
            slots += min(
                d.cards if d.whole else 1 / shapes[p].split_count for p, d in it.demands.items()
            )
        total += math.ceil(max(mem, cores, slots) - 1e-9)
    return total


def _better(a: Packing, b: Packing) -> bool:
    """a strictly better than b: more replicas placed, then fewer cards."""
    if len(a.unplaced) != len(b.unplaced):
        return len(a.unplaced) < len(b.unplaced)
    return gpus_used(a) < gpus_used(b)


def solve(problem: Problem, *, time_limit_s: float) -> Packing:
    """Heuristic, then the MILP if it is small enough; the better packing with its gap."""
    best = pack_heuristic(problem)
    bound = float(
        volume_bound((it for it in problem.items if it.key not in best.unplaced), problem.pools)
    )
    if problem.items and time_limit_s > 0 and gpus_used(best) > bound:
        exact = solve_milp(problem, best, time_limit_s=time_limit_s)
        if exact is not None:
            if _better(exact, best):
                if problem.policy_gpu == "spread":
                    exact = respread(problem, exact)
                best, exact_bound = exact, exact.lower_bound
            else:
                exact_bound = (
                    exact.lower_bound if len(exact.unplaced) == len(best.unplaced) else None
                )
            if exact_bound is not None:
                bound = max(bound, exact_bound)
    used = gpus_used(best)
    if best.unplaced and any(problem_item_placeable(problem, k) for k in best.unplaced):
        best.gap, best.lower_bound = None, bound
    else:
        best.lower_bound = bound
        best.gap = 0.0 if used == 0 else max(0.0, (used - bound) / used)
    return best


def problem_item_placeable(problem: Problem, key: tuple[str, int]) -> bool:
    return any(it.key == key and it.demands for it in problem.items)


def _unplaced_reason(
    key: tuple[str, int], plan: _ModelPlan, pools: list[PoolCard], packing: Packing
) -> Unplaced:
    model, config = plan.model, plan.config
    if not plan.sizing:
        if not plan.rejections:
            names = ", ".join(model.pools or []) or "none"
            return Unplaced(
                model=key[0],
                index=key[1],
                reason=f"no pool to run on (pools defined: {len(pools)}; allowed: {names})",
                resource="pool",
                fixes=["add a pool with GPUs to the spec"],
            )
        # the rejection that came closest: the largest card it was refused on
        gpu_pools = [pc for pc in pools if pc.gpu is not None and pc.spec.name in plan.rejections]
        worst = next(iter(plan.rejections.values()))
        fixes: list[str] = []
        if gpu_pools:
            biggest = max(gpu_pools, key=lambda pc: pc.gpu.memory_mib if pc.gpu else 0)
            worst = plan.rejections[biggest.spec.name]
            assert biggest.gpu is not None
            assert biggest.shape is not None
            max_cards = max(pc.shape.cards_per_node for pc in gpu_pools if pc.shape)
            if worst.resource == "gpu_memory":
                fixes = suggest_fixes(model, config, biggest.shape.card_mb, biggest.gpu, max_cards)
            elif worst.resource == "gpu_count":
                fixes = [
                    f"a pool with {worst.shortfall + biggest.shape.cards_per_node:g} "
                    "cards per node, or a lower tensor_parallel with quantization"
                ]
            reason = f"fits no allowed pool; on '{biggest.spec.name}': {worst.reason}"
        else:
            reason = "; ".join(r.reason for r in plan.rejections.values())
        return Unplaced(
            model=key[0],
            index=key[1],
            reason=reason,
            resource=worst.resource,
            shortfall=worst.shortfall,
            fixes=fixes,
        )
    # it fits a card but the pools ran out of room
    full = [pc for pc in pools if pc.spec.name in plan.sizing and pc.shape is not None]
    details = ", ".join(
        f"'{pc.spec.name}' ({pc.spec.max_nodes} nodes x {pc.spec.gpu.count if pc.spec.gpu else 0} "
        f"{pc.shape.gpu_type if pc.shape else ''})"
        for pc in full
    )
    sizing = next(iter(plan.sizing.values()))
    fixes = [
        f"raise max_nodes of '{pc.spec.name}' (each node adds "
        f"{pc.spec.gpu.count if pc.spec.gpu else 0} cards)"
        for pc in full
        if pc.spec.max_nodes is not None
    ]
    fixes.append("allow the model more pools, or lower replicas")
    return Unplaced(
        model=key[0],
        index=key[1],
        reason=f"no room left: needs {sizing.cards} x {sizing.slice_mb:,} MiB and its pools "
        f"are full: {details}",
        resource="capacity",
        shortfall=float(sizing.slice_mb * sizing.cards),
        fixes=fixes,
    )


def compose_result(
    spec: FleetSpec,
    *,
    pools: list[PoolCard],
    plans: dict[str, _ModelPlan],
    problem: Problem,
    packing: Packing,
    scenario: str,
) -> PlanResult:
    """The :class:`PlanResult` of a packing (replicas in spec order)."""
    replicas: list[ReplicaPlacement] = []
    per_pool_mem: dict[str, int] = {}
    per_pool_replicas: dict[str, int] = {}
    order = {m.name: i for i, m in enumerate(spec.models)}
    for key in sorted(packing.assigned, key=lambda k: (order[k[0]], k[1])):
        a = packing.assigned[key]
        plan = plans[key[0]]
        sizing = plan.sizing[a.pool]
        shape = problem.pool(a.pool)
        replicas.append(
            ReplicaPlacement(
                model=key[0],
                index=key[1],
                pool=a.pool,
                node=a.node,
                gpus=sorted(a.cards),
                memory_mb=sizing.slice_mb,
                cores_percent=sizing.cores,
                engine=sizing.engine,
                tenant=plan.model.tenant,
                gpu_type=shape.gpu_type,
                card_memory_mb=shape.card_mb,
                num_gpus=sizing.num_gpus,
                tensor_parallel=plan.model.tensor_parallel,
                pipeline_parallel=plan.model.pipeline_parallel,
                whole_cards=sizing.whole,
                need_mb=sizing.need_mb,
            )
        )
        per_pool_mem[a.pool] = per_pool_mem.get(a.pool, 0) + sizing.slice_mb * len(a.cards)
        per_pool_replicas[a.pool] = per_pool_replicas.get(a.pool, 0) + 1
    unplaced = [
        _unplaced_reason(key, plans[key[0]], pools, packing)
        for key in sorted(packing.unplaced, key=lambda k: (order[k[0]], k[1]))
    ]
    used_nodes = packing.nodes_used()
    cards = packing.cards_used()
    usage: list[PoolUsage] = []
    nodes: dict[str, int] = {}
    for pc in pools:
        name = pc.spec.name
        count = max(used_nodes.get(name, 0), pc.spec.min_nodes)
        nodes[name] = count
        usage.append(
            PoolUsage(
                name=name,
                gpu_type=pc.gpu.name if pc.gpu else None,
                card_memory_mb=pc.gpu.memory_mib if pc.gpu else 0,
                gpus_per_node=pc.spec.gpu.count if pc.spec.gpu else 0,
                nodes=count,
                gpus_used=sum(1 for c in cards if c[0] == name),
                memory_used_mb=per_pool_mem.get(name, 0),
                replicas=per_pool_replicas.get(name, 0),
            )
        )
    return PlanResult(
        feasible=not unplaced,
        gpus_used=len(cards),
        nodes=nodes,
        optimality_gap=None if packing.gap is None else round(packing.gap, 4),
        replicas=replicas,
        unplaced=unplaced,
        scenario=scenario,
        solver=packing.solver,
        lower_bound=packing.lower_bound,
        pools=usage,
    )


def plan_fleet(
    spec: FleetSpec, *, scenario: Scenario = "min", time_limit_s: float = 10.0
) -> PlanResult:
    """Place every replica of ``spec`` (``min`` or ``max`` replicas) on its pools.

    Raises SpecError for an unknown GPU type or model config; an infeasible fleet is a
    result (``feasible: false`` with the reasons), not an error.
    """
    if scenario not in ("min", "max"):
        raise ValueError(f"scenario must be 'min' or 'max', not {scenario!r}")
    pools = [resolve_pool(p) for p in spec.pools]
    problem, plans = build_problem(spec, pools, scenario)
    packing = solve(problem, time_limit_s=time_limit_s)
    return compose_result(
        spec, pools=pools, plans=plans, problem=problem, packing=packing, scenario=scenario
    )
