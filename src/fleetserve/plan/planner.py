"""The planner: a fleet spec in, a :class:`PlanResult` out (pure; no I/O but reading the
model configs the spec names).

Design note. Three steps. (1) Size every model on every pool it may use
(:mod:`fleetserve.plan.sizing`): the slice, cores and engine settings, or why it cannot go
there; a replica with more cards (tensor_parallel x pipeline_parallel) than a node has spans
nodes as vLLM's Ray executor runs it (:func:`node_span`: TP groups within a node, pipeline
stages across; per-card memory of the fullest stage, host RAM and CPUs on every node).
(2) Pack the replicas (:mod:`fleetserve.plan.packer` first, then the exact
:mod:`fleetserve.plan.milp` when the instance is small enough and the heuristic is not
already proven optimal by the bounds). The objective is lexicographic
(:data:`~fleetserve.plan.problem.OBJECTIVES`): most replicas placed, then cost (when pools
have prices), then GPUs, then nodes; the better packing under it wins, and the result
names the levels proven optimal and what (node or time limit, instance size) cut the
search. The answer never depends on the clock unless the safety-net time limit was hit,
and then the result says so. (3) Explain each replica left out, once per model (copies
share the answer): the binding constraint (GPU memory, cores, slices per card,
isolation, host RAM, CPUs, a vLLM refusal), by how much, and fixes computed with the same
memory model. (4) A traffic-planned model that breaks an SLO only beside its card's other
engines is planned again on whole cards (:func:`plan_fleet`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from fleetserve.errors import SpecError
from fleetserve.plan.capacity import Load, PerfModel, violations
from fleetserve.plan.gpus import GPU_CATALOGUE, GpuType, custom_gpu, gpu_type, with_memory
from fleetserve.plan.memory import ModelConfig
from fleetserve.plan.milp import MAX_VARIABLES, NODE_LIMIT, node_bounds, solve_milp, variable_count
from fleetserve.plan.packer import pack_heuristic, respread
from fleetserve.plan.problem import (
    DEVICE_SPLIT_COUNT,
    OBJECTIVES,
    Choice,
    Demand,
    Item,
    Packing,
    PoolShape,
    Problem,
    choice_shortfall,
    gpus_used,
    packing_cost,
    score,
    shortfall,
)
from fleetserve.plan.result import (
    PlanResult,
    PoolUsage,
    ReplicaNode,
    ReplicaPlacement,
    TrafficPlan,
    Unplaced,
)
from fleetserve.plan.sizing import (
    DEFAULT_HOST_RAM_MB,
    Rejection,
    Sizing,
    model_config_for,
    size_replica,
    suggest_fixes,
)
from fleetserve.plan.traffic import Option, TrafficOptions, closest, traffic_options
from fleetserve.spec import FleetSpec, ModelSpec, PoolSpec
from fleetserve.units import gib_to_mib_ceil, gib_to_mib_floor

if TYPE_CHECKING:  # fleetserve.perf imports the plan package's facts
    from fleetserve.perf.calibration import Calibration

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
            gpu = with_memory(gpu, pool.gpu.memory_gb)
    else:
        assert pool.gpu.memory_gb is not None  # GpuSpec's validator guarantees one of them
        gpu = custom_gpu(pool.gpu.memory_gb)
    shape = PoolShape(
        name=pool.name,
        gpu_type=gpu.name,
        card_mb=gpu.memory_mib,
        cards_per_node=pool.gpu.count,
        cpu=pool.cpu,
        ram_mb=gib_to_mib_floor(pool.memory_gb),
        max_nodes=pool.max_nodes,
        min_nodes=pool.min_nodes,
        split_count=split_count,
        cost_per_hour=pool.cost_per_hour or 0.0,
    )
    return PoolCard(pool, gpu, shape)


def host_ram_mb(model: ModelSpec, cards: int) -> int:
    if model.resources.memory_gb is not None:
        return gib_to_mib_ceil(model.resources.memory_gb)
    return DEFAULT_HOST_RAM_MB * cards


@dataclass
class _ModelPlan:
    model: ModelSpec
    config: ModelConfig
    sizing: dict[str, Sizing]
    rejections: dict[str, Rejection]
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Pool -> (nodes, cards per node) of one replica there (:func:`node_span`)."""
    traffic: TrafficOptions | None = None
    """For a model planned from its traffic: its options (sizing per option, not pool)."""
    own_cards: str | None = None
    """Set, its options hold whole cards, and this says why: the SLO that broke beside
    other engines on shared ones (:func:`plan_fleet`)."""


def node_span(
    tensor_parallel: int, pipeline_parallel: int, cards_per_node: int
) -> tuple[int, int] | None:
    """(nodes, cards per node) of one replica on nodes of ``cards_per_node`` cards, as
    vLLM's Ray executor runs it; None when a tensor-parallel group does not fit a node.

    A tensor-parallel group (all-reduce every layer) stays within a node; pipeline stages
    (one activation send per stage) may cross nodes. Each node holds the same number of
    whole stages - the most that fit, a divisor of ``pipeline_parallel`` - so every node of
    the replica has the same shape (one pod template) and vLLM's rank order (workers sorted
    by node, TP ranks contiguous) keeps each TP group on one node.
    """
    tp, pp = tensor_parallel, pipeline_parallel
    if tp * pp <= cards_per_node:
        return 1, tp * pp
    if tp > cards_per_node:
        return None
    stages = max(s for s in range(1, pp + 1) if pp % s == 0 and s * tp <= cards_per_node)
    return pp // stages, stages * tp


def _replica_count(model: ModelSpec, scenario: str) -> int:
    if scenario == "max":
        return model.replicas.max
    if scenario == "local":
        return max(1, model.replicas.min)
    return model.replicas.min


def fit_pool(
    model: ModelSpec, config: ModelConfig, pc: PoolCard, spec: FleetSpec, *, whole: bool = False
) -> tuple[Sizing, tuple[int, int]] | Rejection:
    """One replica of ``model`` on pool ``pc`` (``whole``: on whole cards): its sizing and
    node span, or why not."""
    name = pc.spec.name
    if pc.shape is None or pc.gpu is None:
        return Rejection("pool", 0, f"pool '{name}' has no GPUs")
    shape = pc.shape
    sized = size_replica(
        model, config, pc.gpu, shape.card_mb, split_count=shape.split_count, whole=whole
    )
    if isinstance(sized, Rejection):
        return sized
    span = node_span(model.tensor_parallel, model.pipeline_parallel, shape.cards_per_node)
    if span is None or (shape.max_nodes is not None and span[0] > shape.max_nodes):
        return _span_rejection(model, config, pc, spec, span)
    nodes, per_node = span
    ram = host_ram_mb(model, per_node)
    if model.resources.cpu > shape.cpu or ram > shape.ram_mb:
        short_cpu = model.resources.cpu > shape.cpu
        each = " on each of its nodes" if nodes > 1 else ""
        return Rejection(
            "cpu" if short_cpu else "memory",
            model.resources.cpu - shape.cpu if short_cpu else ram - shape.ram_mb,
            f"a replica needs {model.resources.cpu:g} CPUs / {ram:,} MiB RAM{each}; a "
            f"'{name}' node has {shape.cpu:g} / {shape.ram_mb:,}",
        )
    return sized, span


def _demand(model: ModelSpec, sizing: Sizing, span: tuple[int, int]) -> Demand:
    return Demand(
        mem_mb=sizing.slice_mb,
        cores=sizing.cores,
        cards=span[1],
        whole=sizing.whole,
        cpu=model.resources.cpu,
        ram_mb=host_ram_mb(model, span[1]),
        nodes=span[0],
    )


def build_problem(
    spec: FleetSpec,
    pools: list[PoolCard],
    scenario: str,
    perf: PerfModel | None = None,
    own_cards: Mapping[str, str] | None = None,
) -> tuple[Problem, dict[str, _ModelPlan]]:
    """Size every model on every pool it may use, and list the replicas to place: the
    spec's count, or for a model with ``traffic`` its options (:mod:`.traffic`; those of
    the traffic-planned models in ``own_cards`` on whole cards)."""
    dedicated = {t.name for t in spec.tenants if t.isolation == "dedicated"}
    plans: dict[str, _ModelPlan] = {}
    items: list[Item] = []
    choices: list[Choice] = []
    for m_index, model in enumerate(spec.models):
        config = model_config_for(model, index=m_index)
        plan = _ModelPlan(model, config, {}, {}, own_cards=(own_cards or {}).get(model.name))
        plans[model.name] = plan
        allowed = set(model.pools) if model.pools is not None else None
        mine = [pc for pc in pools if allowed is None or pc.spec.name in allowed]
        if model.traffic is not None:
            if perf is None:
                raise SpecError(
                    f"models[{m_index}].traffic: planning from traffic needs a performance "
                    "model, and none was given"
                )
            items.extend(
                _traffic_items(
                    spec, plan, mine, perf, dedicated=model.tenant in dedicated, choices=choices
                )
            )
            continue
        for pc in mine:
            got = fit_pool(model, config, pc, spec)
            if isinstance(got, Rejection):
                plan.rejections[pc.spec.name] = got
                continue
            plan.sizing[pc.spec.name], plan.spans[pc.spec.name] = got
        demands = {name: _demand(model, s, plan.spans[name]) for name, s in plan.sizing.items()}
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
        choices=tuple(choices),
    )
    return problem, plans


def _traffic_items(
    spec: FleetSpec,
    plan: _ModelPlan,
    pools: list[PoolCard],
    perf: PerfModel,
    *,
    dedicated: bool,
    choices: list[Choice],
) -> list[Item]:
    """The optional copies of every option of a traffic-planned model (and its Choice)."""
    model, config = plan.model, plan.config
    assert model.traffic is not None
    by_name = {pc.spec.name: pc for pc in pools}
    gpu_pools = []
    for pc in pools:
        if pc.gpu is None or pc.shape is None:
            plan.rejections[pc.spec.name] = Rejection(
                "pool", 0, f"pool '{pc.spec.name}' has no GPUs"
            )
        else:
            gpu_pools.append((pc.spec.name, pc.gpu, pc.shape))
    found = traffic_options(
        model,
        config,
        gpu_pools,
        perf,
        lambda trial, name: fit_pool(
            trial, config, by_name[name], spec, whole=plan.own_cards is not None
        ),
    )
    plan.traffic = found
    plan.rejections.update(found.rejections)
    items: list[Item] = []
    for option in found.options:
        demands = {p: _demand(option.model, option.sizing, option.span) for p in option.pools}
        for _ in range(option.copies):
            items.append(
                Item(
                    model=model.name,
                    index=len(items),
                    tenant=model.tenant,
                    dedicated=dedicated,
                    demands=demands,
                    option=option.name,
                    capacity=option.capacity.rate,
                )
            )
    if items:
        choices.append(Choice(model.name, model.traffic.rate, model.replicas.min))
    return items


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
            whole = [d.total_cards for d in it.demands.values() if d.whole]
            if whole and len(whole) == len(it.demands):
                mem += min(whole)
                cores += min(whole)
                slots += min(whole)
                continue
            mem += min(
                d.total_cards if d.whole else d.mem_mb / shapes[p].card_mb
                for p, d in it.demands.items()
            )
            cores += min(d.total_cards if d.whole else d.cores / 100 for d in it.demands.values())
            slots += min(
                d.total_cards if d.whole else 1 / shapes[p].split_count
                for p, d in it.demands.items()
            )
        total += math.ceil(max(mem, cores, slots) - 1e-9)
    return total


def node_bound(items: Iterable[Item], pools: tuple[PoolShape, ...], gpu_bound: float) -> int:
    """A proven lower bound on nodes: host RAM, CPUs and the GPU bound over the roomiest
    node of any pool the replicas may use."""
    shapes = {p.name: p for p in pools}
    ram = cpu = 0.0
    span = 0  # a replica over k nodes needs k distinct nodes
    for it in items:
        if not it.demands:
            continue
        ram += min(d.nodes * d.ram_mb / shapes[p].ram_mb for p, d in it.demands.items())
        cpu += min(d.nodes * d.cpu / shapes[p].cpu for p, d in it.demands.items())
        span = max(span, min(d.nodes for d in it.demands.values()))
    most_cards = max((p.cards_per_node for p in pools), default=1)
    return math.ceil(max(ram, cpu, span, gpu_bound / max(1, most_cards)) - 1e-9)


def _proven_prefix(problem: Problem, packing: Packing, reference: Packing) -> tuple[str, ...]:
    """The levels ``reference`` proved optimal on which ``packing`` scores the same."""
    mine, theirs = score(problem, packing), score(problem, reference)
    index = {name: i for i, name in enumerate(OBJECTIVES)}
    out: list[str] = []
    for name in reference.proven:
        if mine[index[name]] != theirs[index[name]]:
            break
        out.append(name)
    return tuple(out)


def solve(problem: Problem, *, time_limit_s: float, node_limit: int = NODE_LIMIT) -> Packing:
    """Heuristic, then the lexicographic MILP unless the bounds already prove the
    heuristic optimal; the better packing, with its proven levels, gap and limit."""
    heuristic = pack_heuristic(problem)
    placeable = {it.key for it in problem.items if it.demands}
    if problem.choices:
        short = shortfall(problem, heuristic) > 0
    else:
        short = any(k in placeable for k in heuristic.unplaced)
    proven: list[str] = []
    gpu_bound: float | None = None
    # with traffic-planned models the heuristic's replicas are one choice of options:
    # the volume bounds of what it placed prove nothing about the others
    if not short:
        proven.append("replicas")
    if not short and not problem.choices:
        placed = [it for it in problem.items if it.key in heuristic.assigned]
        gpu_bound = float(volume_bound(placed, problem.pools))
        _, _, gpus, nodes = score(problem, heuristic)
        if not problem.priced and gpus == gpu_bound:
            proven.append("gpus")
            if nodes == node_bound(placed, problem.pools, gpu_bound):
                proven.append("nodes")
    heuristic.proven = tuple(proven)
    levels = tuple(n for n in OBJECTIVES if n != "cost" or problem.priced)
    best = heuristic
    if problem.items and heuristic.proven != levels:
        if time_limit_s <= 0:
            best.limit = "the exact solver was off (time limit 0): heuristic packing"
        elif variable_count(problem, node_bounds(problem, heuristic)) > MAX_VARIABLES:
            best.limit = (
                f"the instance is too large for the exact solver (over {MAX_VARIABLES:,} "
                "assignment variables): heuristic packing"
            )
        else:
            exact = solve_milp(
                problem,
                heuristic,
                time_limit_s=time_limit_s,
                node_limit=node_limit,
                proven=tuple(n for n in heuristic.proven if n == "replicas"),
            )
            if exact is None:
                best.limit = "the exact solver found no packing within its limits"
            else:
                if score(problem, exact) < score(problem, heuristic):
                    if problem.policy_gpu == "spread":
                        exact = respread(problem, exact)
                    best = exact
                else:
                    best.proven = max(
                        heuristic.proven, _proven_prefix(problem, heuristic, exact), key=len
                    )
                    best.limit = exact.limit
                if exact.lower_bound is not None and "replicas" in exact.proven:
                    gpu_bound = max(gpu_bound or 0.0, exact.lower_bound)
    used = gpus_used(best)
    if "replicas" in best.proven and gpu_bound is not None:
        best.lower_bound = gpu_bound
        best.gap = 0.0 if used == 0 else max(0.0, (used - gpu_bound) / used)
        above = ("replicas", "cost") if problem.priced else ("replicas",)
        if best.gap == 0.0 and best.proven == above and not problem.choices:
            # the bound proves the GPU level
            best.proven = (*above, "gpus")
            placed = [it for it in problem.items if it.key in best.assigned]
            if score(problem, best)[3] == node_bound(placed, problem.pools, gpu_bound):
                best.proven = (*best.proven, "nodes")
    else:
        best.lower_bound, best.gap = gpu_bound, None
    return best


def _unplaced_reason(
    key: tuple[str, int],
    *,
    plan: _ModelPlan,
    pools: list[PoolCard],
    packing: Packing,
    problem: Problem,
    spec: FleetSpec,
) -> Unplaced:
    model, config = plan.model, plan.config
    if plan.sizing:
        item = next(it for it in problem.items if it.key == key)
        return _diagnose(
            key, item=item, plan=plan, pools=pools, packing=packing, problem=problem, spec=spec
        )
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
            within = _fallback_fixes(model, config, biggest, within_node=True)
            fixes = [
                *within,
                f"a pool with {worst.shortfall + biggest.shape.cards_per_node:g} cards per node",
            ]
        elif worst.resource in ("memory", "cpu"):
            fixes = _node_size_fixes(model, worst, biggest, spec)
        reason = f"fits no allowed pool; on '{biggest.spec.name}': {worst.reason}"
        given: tuple[str, ...] = tuple(getattr(worst, "fixes", ()) or ())
        if given:
            fixes = list(given)
        if not fixes:  # never leave a model with no way forward
            fixes = _fallback_fixes(model, config, biggest)
    else:
        reason = "; ".join(r.reason for r in plan.rejections.values())
    field = getattr(worst, "field", None)
    if field:
        m_index = next(i for i, m in enumerate(spec.models) if m.name == model.name)
        reason = f"models[{m_index}].{field}: " + (
            worst.reason if worst.resource == "engine" else reason
        )
    return Unplaced(
        model=key[0],
        index=key[1],
        reason=reason,
        resource=worst.resource,
        shortfall=worst.shortfall,
        fixes=fixes,
    )


def _span_rejection(
    model: ModelSpec,
    config: ModelConfig,
    pool: PoolCard,
    spec: FleetSpec,
    span: tuple[int, int] | None,
) -> Rejection:
    """Why a replica larger than a node cannot span this pool's nodes, with fixes."""
    assert pool.shape is not None
    shape = pool.shape
    name = shape.name
    p_index = next(i for i, p in enumerate(spec.pools) if p.name == name)
    tp, pp = model.tensor_parallel, model.pipeline_parallel
    within = _fallback_fixes(model, config, pool, within_node=True)
    if span is None:
        across = [
            f for f in _fallback_fixes(model, config, pool) if not f.startswith("the weights")
        ]
        return Rejection(
            "gpu_count",
            tp - shape.cards_per_node,
            f"tensor_parallel {tp} > {shape.cards_per_node} cards per node in pool '{name}': "
            "vLLM keeps a tensor-parallel group on one node (its all-reduce runs every "
            "layer); only pipeline stages may cross nodes",
            fixes=tuple(
                dict.fromkeys(
                    [
                        *across,
                        *within,
                        f"a pool with {tp} or more cards per node",
                    ]
                )
            ),
            field="tensor_parallel",
        )
    nodes, per_node = span
    return Rejection(
        "gpu_count",
        tp * pp - shape.cards_per_node,
        f"tensor_parallel x pipeline_parallel = {tp * pp} cards > {shape.cards_per_node} "
        f"per node in pool '{name}', and spanning {nodes} nodes ({per_node} cards each) "
        f"exceeds its max_nodes {shape.max_nodes}",
        fixes=(
            f"raise pools[{p_index}].max_nodes of '{name}' to {nodes} "
            f"(now {shape.max_nodes}): pipeline stages across nodes",
            *within,
            f"a pool with {tp * pp} cards per node",
        ),
    )


def _node_size_fixes(
    model: ModelSpec, worst: Rejection, pool: PoolCard, spec: FleetSpec
) -> list[str]:
    """Fixes for a replica (or, spanning nodes, its share of one node) that needs more host
    RAM or CPUs than a node of ``pool`` has at all."""
    assert pool.shape is not None
    shape = pool.shape
    p_i = next(i for i, p in enumerate(spec.pools) if p.name == shape.name)
    m_i = next(i for i, m in enumerate(spec.models) if m.name == model.name)
    if worst.resource == "memory":
        need_gib = math.ceil((shape.ram_mb + worst.shortfall) / 1024)
        fixes = [
            f"raise pools[{p_i}].memory_gb of '{shape.name}' to {need_gib} "
            f"(now {pool.spec.memory_gb:g})"
        ]
        if model.resources.memory_gb is not None:
            fixes.append(
                f"lower models[{m_i}].resources.memory_gb of '{model.name}' to at most "
                f"{math.floor(shape.ram_mb / 1024)} (now {model.resources.memory_gb:g})"
            )
        return fixes
    return [
        f"raise pools[{p_i}].cpu of '{shape.name}' to {math.ceil(model.resources.cpu)} "
        f"(now {shape.cpu:g})",
        f"lower models[{m_i}].resources.cpu of '{model.name}' to at most {shape.cpu:g} "
        f"(now {model.resources.cpu:g})",
    ]


def _fallback_fixes(
    model: ModelSpec, config: ModelConfig, pool: PoolCard, *, within_node: bool = False
) -> list[str]:
    """The smallest TP x PP (with quantization where the card supports it) that holds one
    replica on this pool's card, or on the largest card of the catalogue (``within_node``:
    only on this pool, at most its cards per node; [] if none)."""
    assert pool.gpu is not None
    assert pool.shape is not None
    cards_per_node = pool.shape.cards_per_node
    for gpu, card_mb in ((pool.gpu, pool.shape.card_mb), (_largest_card(), 0)):
        mb = card_mb or gpu.memory_mib
        if within_node and not card_mb:
            return []
        # the model's own quantization on more cards first, then fp8, then AWQ
        for quant in dict.fromkeys((model.quantization, "fp8", "awq")):
            for total in (1, 2, 4, 8, 16, 32, 64):
                if within_node and total > cards_per_node:
                    break
                for tp in (8, 4, 2, 1):  # TP within a node before PP stages
                    if total % tp or (card_mb and tp > cards_per_node):
                        continue
                    pp = total // tp
                    span = node_span(tp, pp, cards_per_node) if card_mb else (1, total)
                    max_nodes = pool.shape.max_nodes
                    if span is None or (max_nodes is not None and span[0] > max_nodes):
                        continue
                    trial = model.model_copy(
                        update={
                            "tensor_parallel": tp,
                            "pipeline_parallel": pp,
                            "quantization": quant,
                        }
                    )
                    if not isinstance(size_replica(trial, config, gpu, mb), Sizing):
                        continue
                    parts = [f"tensor_parallel: {tp}"]
                    if pp != model.pipeline_parallel:
                        parts.append(f"pipeline_parallel: {pp}")
                    if quant != model.quantization:
                        parts.append(f"quantization: {quant}")
                    where = f"on '{pool.spec.name}'" if card_mb else f"on {gpu.name} cards"
                    note = (
                        f" (one replica over {span[0]} nodes of '{pool.spec.name}', "
                        f"{span[1]} cards each)"
                        if card_mb and span[0] > 1
                        else ""
                    )
                    return [f"{', '.join(parts)} {where}{note}"]
    return [
        f"the weights alone do not fit 64 {_largest_card().name} cards: serve a smaller "
        "or more quantized model"
    ]


def _largest_card() -> GpuType:
    return max(GPU_CATALOGUE, key=lambda g: (g.memory_mib, g.name))


@dataclass
class _Blocked:
    """Where one replica could have gone on one card (or node), and what stopped it."""

    pool: str
    node: int
    blockers: frozenset[str]
    ram_left: int = 0
    cpu_left: float = 0.0
    owners: frozenset[str | None] = frozenset()


#: Which constraint to name when several bind alone: the ones a user can change and does
#: not expect first (a card 6 % used that isolation keeps empty), GPU memory last.
_BINDING_ORDER = ("isolation", "memory", "cpu", "gpu_slices", "gpu_cores", "capacity")
_BLOCKING_ORDER = ("capacity", "memory", "cpu", "gpu_slices", "gpu_cores", "isolation")


def _slots(item: Item, packing: Packing, problem: Problem) -> list[_Blocked]:
    """Every card (slice) or node (whole cards) the replica could use in ``packing``,
    with the constraints that keep it out."""
    items = {it.key: it for it in problem.items}
    cards: dict[tuple[str, int, int], list[Item]] = {}
    nodes: dict[tuple[str, int], list[Item]] = {}
    for k, a in packing.assigned.items():
        for n, node_cards in a.parts:
            nodes.setdefault((a.pool, n), []).append(items[k])
            for c in node_cards:
                cards.setdefault((a.pool, n, c), []).append(items[k])
    out: list[_Blocked] = []
    for pool_name, d in item.demands.items():
        pool = problem.pool(pool_name)
        count = (
            pool.max_nodes
            if pool.max_nodes is not None
            else len({n for (p, n) in nodes if p == pool_name}) + 1
        )
        for n in range(count):
            here = nodes.get((pool_name, n), [])
            ram_left = pool.ram_mb - sum(o.demands[pool_name].ram_mb for o in here)
            cpu_left = pool.cpu - sum(o.demands[pool_name].cpu for o in here)
            node_blockers = set()
            if ram_left < d.ram_mb:
                node_blockers.add("memory")
            if cpu_left < d.cpu - 1e-9:
                node_blockers.add("cpu")
            per_card = []
            for c in range(pool.cards_per_node):
                on = cards.get((pool_name, n, c), [])
                blockers = set(node_blockers)
                if on and (d.whole or any(o.demands[pool_name].whole for o in on)):
                    blockers.add("capacity")
                elif not d.whole:
                    if sum(o.demands[pool_name].mem_mb for o in on) + d.mem_mb > pool.card_mb:
                        blockers.add("capacity")
                    if sum(o.demands[pool_name].cores for o in on) + d.cores > 100:
                        blockers.add("gpu_cores")
                    if len(on) + 1 > pool.split_count:
                        blockers.add("gpu_slices")
                    owners = {o.tenant for o in on}
                    if on and (
                        (item.dedicated and owners != {item.tenant})
                        or any(o.dedicated and o.tenant != item.tenant for o in on)
                    ):
                        blockers.add("isolation")
                per_card.append((frozenset(blockers), frozenset(o.tenant for o in on)))
            if d.whole:
                free = sum(1 for held, _ in per_card if "capacity" not in held)
                whole_blockers = set(node_blockers)
                if free < d.cards:
                    whole_blockers.add("capacity")
                out.append(_Blocked(pool_name, n, frozenset(whole_blockers), ram_left, cpu_left))
            else:
                for held, tenants in per_card:
                    out.append(_Blocked(pool_name, n, held, ram_left, cpu_left, tenants))
        if d.nodes > 1:  # a replica over k nodes: fewer than k open nodes do not hold it
            open_nodes = [b for b in out if b.pool == pool_name and not b.blockers]
            if len(open_nodes) < d.nodes:
                for b in open_nodes:
                    b.blockers = frozenset({"capacity"})
    return out


def _diagnose(
    key: tuple[str, int],
    *,
    item: Item,
    plan: _ModelPlan,
    pools: list[PoolCard],
    packing: Packing,
    problem: Problem,
    spec: FleetSpec,
) -> Unplaced:
    """Why a replica that fits a card was left out: the constraint that binds."""
    model = plan.model
    slots = _slots(item, packing, problem)
    free = [b for b in slots if not b.blockers]
    if free:  # room was left: only a cut search explains it
        return Unplaced(
            model=key[0],
            index=key[1],
            reason=f"not placed although pool '{free[0].pool}' has room: {packing.limit}",
            resource="search",
            fixes=["raise --time-limit, or plan fewer replicas at once"],
        )
    alone = {b.blockers for b in slots if len(b.blockers) == 1}
    # one constraint alone keeps it off some card: name it; else the one that keeps it
    # off every card (GPU memory first), else the commonest
    everywhere = [r for r in _BLOCKING_ORDER if all(r in b.blockers for b in slots)]
    commonest = max(_BLOCKING_ORDER, key=lambda r: sum(r in b.blockers for b in slots))
    binding = next(
        (r for r in _BINDING_ORDER if frozenset({r}) in alone),
        everywhere[0] if everywhere else commonest,
    )
    index = {p.name: i for i, p in enumerate(spec.pools)}
    m_index = next(i for i, m in enumerate(spec.models) if m.name == model.name)
    full = sorted({b.pool for b in slots})
    node_fixes = [
        f"raise pools[{index[p]}].max_nodes of '{p}' (now {problem.pool(p).max_nodes})"
        for p in full
        if problem.pool(p).max_nodes is not None
    ]
    sizing = plan.sizing[full[0]] if full else next(iter(plan.sizing.values()))
    demand = item.demands[full[0]] if full else next(iter(item.demands.values()))
    used_cards = packing.cards_used()
    fixes: list[str] = []
    shortfall: float | None = None
    if binding == "isolation":
        touched = [b for b in slots if b.blockers == frozenset({"isolation"})]
        holders = sorted({str(t) for b in touched for t in b.owners})
        pct = _card_use(problem, packing, {(b.pool, b.node) for b in touched})
        mode = (
            f"its tenant '{item.tenant}' is dedicated"
            if item.dedicated
            else f"they hold dedicated tenant {', '.join(repr(h) for h in holders)}"
        )
        reason = (
            f"isolation: {len(touched)} card(s) have room for it ({pct:.0%} of their memory "
            f"used) but {mode}, and no more nodes may be added"
        )
        dedicated = sorted(
            {str(item.tenant)} if item.dedicated else {t for t in holders if t != item.tenant}
        )
        t_index = {t.name: i for i, t in enumerate(spec.tenants)}
        fixes = [
            f"set tenants[{t_index[t]}].isolation of '{t}' to shared"
            for t in dedicated
            if t in t_index
        ]
    elif binding == "memory":
        nodes_seen = {(b.pool, b.node): b for b in slots}
        best = max(nodes_seen.values(), key=lambda b: b.ram_left)
        shortfall = float(demand.ram_mb - best.ram_left)
        pool_spec = spec.pools[index[best.pool]]
        need_gib = (problem.pool(best.pool).ram_mb + shortfall) / 1024
        reason = (
            f"host RAM: a replica reserves {demand.ram_mb:,} MiB; the roomiest node "
            f"('{best.pool}' node {best.node}) has {best.ram_left:,} MiB left of "
            f"{problem.pool(best.pool).ram_mb:,} (short {shortfall:,.0f} MiB) while "
            f"GPU cards still have room"
        )
        fixes = [
            f"raise pools[{index[best.pool]}].memory_gb of '{best.pool}' to "
            f"{math.ceil(need_gib)} (now {pool_spec.memory_gb:g})",
        ]
        # one more fits on that node if this model's copies there each reserve less
        items = {it.key: it for it in problem.items}
        mine = [
            k
            for k, a in packing.assigned.items()
            if a.pool == best.pool and best.node in {n for n, _ in a.parts} and k[0] == model.name
        ]
        others = problem.pool(best.pool).ram_mb - best.ram_left
        others -= sum(items[k].demands[best.pool].ram_mb for k in mine)
        floor_gib = (problem.pool(best.pool).ram_mb - others) / (len(mine) + 1) / 1024
        if floor_gib >= 1:
            now = (
                f"now {model.resources.memory_gb:g}"
                if model.resources.memory_gb is not None
                else f"default {demand.ram_mb / 1024:g} per replica"
            )
            fixes.append(
                f"set models[{m_index}].resources.memory_gb of '{model.name}' to "
                f"{math.floor(floor_gib * 10) / 10:g} ({now})"
            )
    elif binding == "cpu":
        best_cpu = max(slots, key=lambda b: b.cpu_left)
        shortfall = float(demand.cpu - best_cpu.cpu_left)
        reason = (
            f"CPUs: a replica reserves {demand.cpu:g} CPUs; the roomiest node "
            f"('{best_cpu.pool}' node {best_cpu.node}) has {max(0.0, best_cpu.cpu_left):g} left"
        )
        fixes = [
            f"raise pools[{index[best_cpu.pool]}].cpu of '{best_cpu.pool}' to "
            f"{math.ceil(problem.pool(best_cpu.pool).cpu + shortfall):g}",
            f"lower models[{m_index}].resources.cpu of '{model.name}' "
            f"(now {model.resources.cpu:g})",
        ]
    elif binding == "gpu_slices":
        reason = (
            f"slices per card: every card with memory left already holds "
            f"{problem.pools[0].split_count} slices (HAMi deviceSplitCount)"
        )
        fixes = [f"raise models[{m_index}].concurrency of '{model.name}' and lower its replicas"]
    elif binding == "gpu_cores":
        reason = (
            f"GPU cores: every card with memory left has less than the {demand.cores} % "
            "gpucores a replica takes"
        )
    else:
        details = ", ".join(
            f"'{p}' ({problem.pool(p).max_nodes} nodes x {problem.pool(p).cards_per_node} "
            f"{problem.pool(p).gpu_type}, {sum(1 for c in used_cards if c[0] == p)} cards used)"
            for p in full
        )
        reason = (
            f"no room left: needs {sizing.cards} x {sizing.slice_mb:,} MiB and its pools "
            f"are full: {details}"
        )
        shortfall = float(sizing.slice_mb * sizing.cards)
    fixes.extend(node_fixes)
    fixes.append("allow the model more pools, or lower replicas")
    return Unplaced(
        model=key[0],
        index=key[1],
        reason=reason,
        resource=binding,
        shortfall=shortfall,
        fixes=fixes,
    )


def _card_use(problem: Problem, packing: Packing, nodes: set[tuple[str, int]]) -> float:
    """Share of the card memory in use on the used cards of ``nodes``."""
    items = {it.key: it for it in problem.items}
    used = total = 0
    seen: set[tuple[str, int, int]] = set()
    for k, a in packing.assigned.items():
        pool = problem.pool(a.pool)
        for n, node_cards in a.parts:
            if (a.pool, n) not in nodes:
                continue
            for c in node_cards:
                used += items[k].demands[a.pool].mem_mb
                if (a.pool, n, c) not in seen:
                    seen.add((a.pool, n, c))
                    total += pool.card_mb
    return used / total if total else 0.0


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
    items = {it.key: it for it in problem.items}
    numbered: dict[str, int] = {}
    for key in sorted(packing.assigned, key=lambda k: (order[k[0]], k[1])):
        a = packing.assigned[key]
        plan = plans[key[0]]
        option = _option_of(plan, items[key])
        # a traffic-planned model's replicas: its option's settings, numbered from 0
        sizing = option.sizing if option else plan.sizing[a.pool]
        model = option.model if option else plan.model
        index = numbered.get(key[0], 0) if option else key[1]
        numbered[key[0]] = index + 1
        shape = problem.pool(a.pool)
        stages_per_node = model.pipeline_parallel // len(a.parts)
        replicas.append(
            ReplicaPlacement(
                model=key[0],
                index=index,
                pool=a.pool,
                node=a.node,
                gpus=sorted(a.cards),
                nodes=[
                    ReplicaNode(
                        node=n,
                        gpus=sorted(cards),
                        stages=list(range(i * stages_per_node, (i + 1) * stages_per_node)),
                    )
                    for i, (n, cards) in enumerate(a.parts)
                ],
                memory_mb=sizing.slice_mb,
                cores_percent=sizing.cores,
                engine=sizing.engine,
                tenant=plan.model.tenant,
                gpu_type=shape.gpu_type,
                card_memory_mb=shape.card_mb,
                num_gpus=sizing.num_gpus,
                tensor_parallel=model.tensor_parallel,
                pipeline_parallel=model.pipeline_parallel,
                whole_cards=sizing.whole,
                need_mb=sizing.need_mb,
            )
        )
        per_pool_mem[a.pool] = per_pool_mem.get(a.pool, 0) + sizing.slice_mb * sum(
            len(cards) for _, cards in a.parts
        )
        per_pool_replicas[a.pool] = per_pool_replicas.get(a.pool, 0) + 1
    # copies of a model share their explanation: computed once per model (1,000 copies of
    # an unplaceable model must not cost 1,000 diagnoses)
    explained: dict[str, Unplaced] = {}
    unplaced: list[Unplaced] = []
    for key in sorted(packing.unplaced, key=lambda k: (order[k[0]], k[1])):
        if items[key].option is not None or plans[key[0]].traffic is not None:
            continue  # an option's copies not chosen: the traffic report explains
        first = explained.get(key[0])
        if first is None:
            first = _unplaced_reason(
                key, plan=plans[key[0]], pools=pools, packing=packing, problem=problem, spec=spec
            )
            explained[key[0]] = first
        same = first.index == key[1]
        unplaced.append(first if same else first.model_copy(update={"index": key[1]}))
    used_nodes = packing.nodes_used()
    cards = packing.cards_used()
    usage: list[PoolUsage] = []
    nodes: dict[str, int] = {}
    priced = problem.priced
    for pc in pools:
        name = pc.spec.name
        count = max(used_nodes.get(name, 0), pc.spec.min_nodes)
        nodes[name] = count
        price = pc.spec.cost_per_hour
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
                cost_per_hour=round(count * (price or 0.0), 6) if priced else None,
            )
        )
    traffic: list[TrafficPlan] = []
    beside = card_neighbours(packing)
    turns = _steady_turns(plans, problem, packing)
    for model_spec in spec.models:
        plan = plans[model_spec.name]
        if plan.traffic is not None:
            report, short = _traffic_report(
                plan,
                pools=pools,
                packing=packing,
                problem=problem,
                spec=spec,
                beside=beside,
                turns=turns,
            )
            traffic.append(report)
            unplaced.extend(short)
    levels = [n for n in OBJECTIVES if n != "cost" or priced]
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
        cost_per_hour=round(packing_cost(problem, packing), 6) if priced else None,
        optimal=[n for n in levels if n in packing.proven],
        search_limit=packing.limit,
        traffic=traffic,
    )


Key = tuple[str, int]


def card_neighbours(packing: Packing) -> dict[Key, list[list[Key]]]:
    """Per placed replica: for each of its cards, the other replicas on it (none: its cards
    hold it alone; a CPU replica holds no card). Engines sharing a card take turns on it
    (:meth:`fleetserve.perf.EnginePerf.time_sliced`), which a replica's capacity, sized
    before the cards are known, does not count: the traffic report does."""
    on_card: dict[tuple[str, int, int], list[Key]] = {}
    for key, a in packing.assigned.items():
        for n, cards in a.parts:
            for c in cards:
                on_card.setdefault((a.pool, n, c), []).append(key)
    return {
        key: [
            [k for k in on_card[(a.pool, n, c)] if k != key] for n, cards in a.parts for c in cards
        ]
        for key, a in packing.assigned.items()
    }


def _steady_turns(
    plans: dict[str, _ModelPlan], problem: Problem, packing: Packing
) -> dict[str, float]:
    """The turn one replica of each traffic-planned model holds on a shared card in its
    steady state at the planned rate: its mean step's whole-card work, at most one full
    turn. A model without traffic has no rate to know it by, so it is absent: its replicas
    are taken to hold full turns."""
    out: dict[str, float] = {}
    for name, plan in plans.items():
        if plan.traffic is None or plan.model.traffic is None or not plan.traffic.options:
            continue
        option, placed = _placed_option(plan.traffic, name, problem, packing)
        if not placed:
            continue
        work, rate = plan.traffic.work, plan.model.traffic.rate / len(placed)
        load = option.at(work, rate, 1)
        if not load.stable:
            continue  # an overloaded replica steps without pause: full turns
        prefill = rate * work.prompt.mean * load.step_s
        out[name] = option.step.turn(prefill, load.batch, load.batch * work.mean_context)
    return out


def _placed_option(
    found: TrafficOptions, name: str, problem: Problem, packing: Packing
) -> tuple[Option, list[Item]]:
    """The option a traffic-planned model's placed replicas run (its cheapest when none is
    placed) and those replicas."""
    placed = [
        it
        for it in problem.items
        if it.model == name and it.option is not None and it.key in packing.assigned
    ]
    used = {it.option for it in placed}
    return next((o for o in found.options if o.name in used), found.options[0]), placed


def _option_of(plan: _ModelPlan, item: Item) -> Option | None:
    if item.option is None or plan.traffic is None:
        return None
    return next(o for o in plan.traffic.options if o.name == item.option)


def _ms(load: Load, which: Literal["ttft", "tpot"]) -> dict[str, float]:
    got = load.ttft_s if which == "ttft" else load.tpot_s
    return {f"p{round(q * 100)}": round(v * 1000, 1) for q, v in sorted(got.items())}


def _traffic_report(
    plan: _ModelPlan,
    *,
    pools: list[PoolCard],
    packing: Packing,
    problem: Problem,
    spec: FleetSpec,
    beside: dict[Key, list[list[Key]]],
    turns: dict[str, float],
) -> tuple[TrafficPlan, list[Unplaced]]:
    """A traffic-planned model's report, and an Unplaced entry per replica it is short.

    Its latencies are predicted where its replicas landed: a replica sharing a card waits
    on the turns of the engines beside it - a traffic-planned neighbour's steady turn at
    its own rate (:func:`_steady_turns`), a full turn for one whose load is not known -
    on its busiest card. An SLO that breaks only there is reported as ``card_sharing``."""
    model, found = plan.model, plan.traffic
    assert found is not None
    assert model.traffic is not None
    rate = model.traffic.rate
    m_index = next(i for i, m in enumerate(spec.models) if m.name == model.name)
    if not found.options:
        return _traffic_infeasible(
            plan, m_index, pools=pools, packing=packing, problem=problem, spec=spec
        )
    mine = [it for it in problem.items if it.model == model.name and it.option is not None]
    option, placed = _placed_option(found, model.name, problem, packing)
    choice = next(c for c in problem.choices if c.model == model.name)
    short = choice_shortfall(problem, packing, choice)
    unplaced: list[Unplaced] = []
    if short:
        item = next(it for it in mine if it.option == option.name and it.key in packing.unplaced)
        as_placed = dataclasses.replace(
            plan,
            model=option.model,
            sizing=dict.fromkeys(option.pools, option.sizing),
            spans=dict.fromkeys(option.pools, option.span),
        )
        why = _diagnose(
            item.key,
            item=item,
            plan=as_placed,
            pools=pools,
            packing=packing,
            problem=problem,
            spec=spec,
        )
        head = (
            f"{rate:g} req/s needs {option.copies} replicas of {option.name} "
            f"({option.capacity.rate:,.2f} req/s each within the SLOs); {len(placed)} placed: "
        )
        # reported in replicas of the option chosen (the objective counts the largest's)
        for j in range(max(1, option.copies - len(placed))):
            unplaced.append(
                why.model_copy(update={"index": len(placed) + j, "reason": head + why.reason})
            )
    by_rate = math.ceil(rate / option.capacity.rate - 1e-9)
    if model.replicas.min > by_rate:
        binding = "replicas_min"
        reason = (
            f"replicas.min {model.replicas.min} > the {by_rate} replicas the rate needs "
            f"({option.capacity.rate:,.2f} req/s each)"
        )
    else:
        binding, reason = option.capacity.binding, option.capacity.reason
    full = option.step.turn_s
    neighbours, others_s = 0, 0.0
    for it in placed:
        for on_card in beside.get(it.key, []):
            neighbours = max(neighbours, len(on_card))
            others_s = max(others_s, sum(turns.get(k[0], full) for k in on_card))
    load = option.at(found.work, rate, len(placed) or option.copies, others_s)
    shared_miss = violations(load, found.work) if others_s > 0 else []
    if shared_miss:
        binding = "card_sharing"
        reason = (
            f"{shared_miss[0][1]} beside {neighbours} other replica(s) on one card: without "
            f"MPS its steps wait on their turns, {others_s * 1000:,.1f} ms a round (its "
            f"{option.capacity.rate:,.2f} req/s per replica were sized without them)"
        )
    elif plan.own_cards is not None:
        reason = f"{reason}; on whole cards because on shared ones {plan.own_cards}"
    cost: float | None = None
    if problem.priced:
        cost = 0.0
        for it in placed:
            pool = problem.pool(packing.assigned[it.key].pool)
            d = it.demands[pool.name]
            share = (
                1.0
                if d.whole
                else max(d.mem_mb / pool.card_mb, d.cores / 100, 1 / pool.split_count)
            )
            cost += share * d.total_cards * pool.cost_per_hour / pool.cards_per_node
        cost = round(cost, 4)
    report = TrafficPlan(
        model=model.name,
        rate=rate,
        met=short == 0 and not shared_miss,
        replicas=len(placed),
        needed=option.copies,
        gpu_type=option.gpu.name,
        pools=sorted({packing.assigned[it.key].pool for it in placed}),
        tensor_parallel=option.model.tensor_parallel,
        max_num_seqs=option.model.max_num_seqs or option.sizing.engine.max_num_seqs,
        memory_mb=option.sizing.slice_mb,
        cores_percent=option.sizing.cores,
        goodput_per_replica=round(option.capacity.rate, 4),
        binding=binding,
        reason=reason,
        beside=neighbours,
        own_cards=plan.own_cards is not None,
        ttft_ms=_ms(load, "ttft") if load.stable else {},
        tpot_ms=_ms(load, "tpot") if load.stable else {},
        cost_per_hour=cost,
    )
    return report, unplaced


def _traffic_infeasible(
    plan: _ModelPlan,
    m_index: int,
    *,
    pools: list[PoolCard],
    packing: Packing,
    problem: Problem,
    spec: FleetSpec,
) -> tuple[TrafficPlan, list[Unplaced]]:
    """A traffic-planned model no option serves: fits no card, or meets its SLOs at no
    rate anywhere (the closest option's numbers, and the targets it could meet)."""
    model, found = plan.model, plan.traffic
    assert found is not None
    assert model.traffic is not None
    if not found.unreachable:
        why = _unplaced_reason(
            (model.name, 0), plan=plan, pools=pools, packing=packing, problem=problem, spec=spec
        )
        report = TrafficPlan(
            model=model.name,
            rate=model.traffic.rate,
            met=False,
            replicas=0,
            needed=0,
            binding="memory" if why.resource in ("gpu_memory", None) else str(why.resource),
            reason=why.reason,
        )
        return report, [why]
    best = closest(found.unreachable)
    cap = best.capacity
    where = (
        f"{model.name} on {best.gpu.name} (tensor_parallel {best.model.tensor_parallel}, "
        f"{best.sizing.cores}% cores)"
    )
    reason = cap.reason.replace(" unreachable", f" unreachable for {where}", 1)
    idle = cap.load
    fixes: list[str] = []
    for name, targets, got in (
        ("ttft_ms", found.work.ttft, idle.ttft_s),
        ("tpot_ms", found.work.tpot, idle.tpot_s),
    ):
        for q, limit in targets:
            if got[q] > limit:
                fixes.append(
                    f"loosen models[{m_index}].slo.{name}.p{round(q * 100)} to at least "
                    f"{math.ceil(got[q] * 1000 * 1.1)} ms (the idle replica takes "
                    f"{got[q] * 1000:,.0f} ms; now {limit * 1000:g})"
                )
    if model.quantization is None:
        fixes.append(f"quantization: fp8 on models[{m_index}] (fewer bytes per step)")
    fixes.append("a pool of faster cards (more memory bandwidth or compute)")
    report = TrafficPlan(
        model=model.name,
        rate=model.traffic.rate,
        met=False,
        replicas=0,
        needed=0,
        gpu_type=best.gpu.name,
        tensor_parallel=best.model.tensor_parallel,
        max_num_seqs=best.model.max_num_seqs or 0,
        binding=cap.binding,
        reason=reason,
    )
    return report, [
        Unplaced(model=model.name, index=0, reason=reason, resource=cap.binding, fixes=fixes)
    ]


#: Seconds the exact solver may run before the safety net stops it (the node limit, not
#: this, decides the answer on any machine that is not starved).
DEFAULT_TIME_LIMIT_S = 60.0


def plan_fleet(
    spec: FleetSpec,
    *,
    scenario: Scenario = "min",
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    node_limit: int = NODE_LIMIT,
    perf: PerfModel | None = None,
    calibration: Calibration | None = None,
) -> PlanResult:
    """Place every replica of ``spec`` (``min`` or ``max`` replicas) on its pools.

    A model with ``traffic`` is sized by ``perf`` (default: the roofline of
    :mod:`fleetserve.perf` with ``calibration``'s constants, else the backend's defaults);
    one whose SLO breaks only beside the engines on its shared cards is planned again on
    whole cards (the design note below).

    The answer is decided by ``node_limit`` (branch-and-bound nodes per objective level),
    so it is the same on any machine; ``time_limit_s`` is a safety net whose hit the
    result states (``search_limit``). Raises SpecError for an unknown GPU type or model
    config, or prices on some GPU pools only; an infeasible fleet is a result
    (``feasible: false`` with the reasons), not an error.
    """
    if scenario not in ("min", "max"):
        raise ValueError(f"scenario must be 'min' or 'max', not {scenario!r}")
    _check_prices(spec)
    pools = [resolve_pool(p) for p in spec.pools]
    if perf is None and any(m.traffic is not None for m in spec.models):
        # fleetserve.perf imports the plan package's facts: imported when first needed
        from fleetserve.plan.roofline import Roofline  # noqa: PLC0415

        perf = Roofline(calibration)
    moved: dict[str, str] = {}  # model -> the shared-card miss that moved it to whole cards

    # Design note. A traffic option's capacity is sized alone on its slice; the packing then
    # decides its neighbours, and the report predicts it beside them (card_sharing when an
    # SLO breaks only there). Such models are planned again on whole cards - their options
    # re-sized for them, the fleet re-packed around them - and the new plan is kept unless
    # it leaves more replicas unplaced (then only the first of them is tried, and if that
    # fails too the shared plan stands, saying what whole cards would cost). Of the models
    # crowded on one card only one moves a round (:func:`_movers`), because its move may be
    # all the others there needed (two crowded 7Bs on one card: one on a card of its own
    # leaves the other alone on its slice); models on different cards move in the same
    # round, so a fleet of many crowded pairs takes a few rounds, not one per model. A
    # whole-card replica has no neighbours, so each round moves models for good and the
    # rounds end.
    def moving(batch: list[TrafficPlan]) -> dict[str, str]:
        return moved | {t.model: t.reason for t in batch}  # the miss that moves each

    def attempt(batch: list[TrafficPlan]) -> PlanResult:
        return _plan_once(
            spec,
            pools,
            scenario,
            perf,
            moving(batch),
            time_limit_s=time_limit_s,
            node_limit=node_limit,
        )

    result = attempt([])
    while True:
        movers = _movers(result)
        if not movers:
            return result
        trial = attempt(movers)
        if len(trial.unplaced) > len(result.unplaced) and len(movers) > 1:
            movers = movers[:1]
            trial = attempt(movers)
        if len(trial.unplaced) > len(result.unplaced):
            return _whole_cards_short(result, trial, movers[0].model)
        moved = moving(movers)
        result = trial


def _movers(result: PlanResult) -> list[TrafficPlan]:
    """The ``card_sharing`` models to move to whole cards this round: in spec order, each
    one whose cards hold none of the models already chosen (the design note above)."""
    cards: dict[str, set[tuple[str, int, int]]] = {}
    for r in result.replicas:
        cards.setdefault(r.model, set()).update((r.pool, r.node, g) for g in r.gpus)
    taken: set[tuple[str, int, int]] = set()
    out = []
    for t in result.traffic:
        mine = cards.get(t.model, set())
        if t.binding == "card_sharing" and not mine & taken:
            out.append(t)
            taken |= mine
    return out


def _plan_once(
    spec: FleetSpec,
    pools: list[PoolCard],
    scenario: str,
    perf: PerfModel | None,
    own_cards: Mapping[str, str],
    *,
    time_limit_s: float,
    node_limit: int,
) -> PlanResult:
    problem, plans = build_problem(spec, pools, scenario, perf, own_cards)
    packing = solve(problem, time_limit_s=time_limit_s, node_limit=node_limit)
    return compose_result(
        spec, pools=pools, plans=plans, problem=problem, packing=packing, scenario=scenario
    )


def _whole_cards_short(result: PlanResult, trial: PlanResult, crowded: str) -> PlanResult:
    """``result``, whose ``card_sharing`` models stay where they are, with each report's
    way out: for ``crowded`` what whole cards would leave out (``trial``: the plan with
    them), for the others - not tried - whole cards or fewer models per card."""
    short = [u for u in trial.unplaced if u.model == crowded] or trial.unplaced
    lost = len(trial.unplaced) - len(result.unplaced)
    tried = (
        f"; whole cards for it leave {lost} more replica(s) unplaced "
        f"({short[0].model}: {short[0].reason})"
    )
    untried = "; give it whole cards, or fewer models per card"
    traffic = [
        t.model_copy(update={"reason": t.reason + (tried if t.model == crowded else untried)})
        if t.binding == "card_sharing"
        else t
        for t in result.traffic
    ]
    return result.model_copy(update={"traffic": traffic})


def _check_prices(spec: FleetSpec) -> None:
    """Prices on every GPU pool or on none: a pool left without one would look free."""
    gpu_pools = [(i, p) for i, p in enumerate(spec.pools) if p.gpu is not None and p.gpu.count]
    priced = [p.name for _, p in gpu_pools if p.cost_per_hour is not None]
    if priced and len(priced) < len(gpu_pools):
        missing = [(i, p.name) for i, p in gpu_pools if p.cost_per_hour is None]
        i, name = missing[0]
        raise SpecError(
            f"pools[{i}].cost_per_hour: pool '{name}' has no price while "
            f"{', '.join(repr(n) for n in priced)} have one",
            hint="set cost_per_hour on every GPU pool (0 for nodes already paid for) or on none",
        )
