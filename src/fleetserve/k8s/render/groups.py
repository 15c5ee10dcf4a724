"""From two plans to KubeRay worker groups: one group per (pool, model), one replica per pod.

Design note - why not "one worker group per pool". A worker group is one pod template, and
a HAMi pod has ONE slice shape: ``nvidia.com/gpumem``/``gpucores`` apply to every card of
the container. Two models sliced differently on the same pool (an 18 GB slice and a 40 GB
slice) therefore cannot share a template, and neither can a TP=4 model and a TP=1 model
(``nvidia.com/gpu`` 4 vs 1). So the unit is the pair (pool, model):

* each pod holds exactly one Serve replica: ``nvidia.com/gpu`` = the replica's cards
  (tensor_parallel x pipeline_parallel; one vGPU for a slice), HAMi memory/cores = the
  plan's slice;
* the group advertises one unit of a Ray custom resource named after the model
  (``fleetserve_model_<name>``) and the model's Serve replicas require one unit, so the
  Ray scheduler puts a replica only into a pod cut for it, and the Ray autoscaler scales
  exactly that group when the Serve autoscaler adds a replica of that model;
* ``minReplicas``/``maxReplicas`` are the replicas the ``min`` / ``max`` plans put on that
  pool, so the Serve autoscaler (min/max replicas from the spec) and the pod autoscaler agree
  by construction (pitfall ``serve-replicas-exceed-workers``).

A replica whose pipeline stages cross nodes (the plan's ``replicas[].nodes``) is one pod per
node, each with that node's whole cards (one or more whole tensor-parallel groups, never a
HAMi slice): the group's replicas count pods (Serve replicas x pods per replica), and each
pod advertises one unit of the model resource per card, which the replica's ``{GPU: 1}``
bundles take (serveconfig).

HAMi then packs several such pods onto one physical card (its scheduler sees their
gpumem/gpucores), which is what the planner planned. A model whose replicas the plans put
on several pools gets a group on each, all advertising the same model resource - allowed
only when the pods are identical in shape and engine settings, because a Serve deployment
has one set of engine arguments; otherwise render refuses with the numbers.

Pod CPU/memory: the replica's ``resources.cpu`` rounded up (KubeRay advertises a whole CPU
anyway, pitfall ``cpu-rounding``) plus one spare CPU when the node has room for it (the
fleet's ingress/router replicas and vLLM's CPU-side processes need somewhere to run: the
head advertises zero CPUs); memory is ``resources.memory_gb`` or 8 GiB per card, capped to
the node's share. Every pod of the busiest node of the ``max`` plan must fit the pool's
allocatable CPU and memory, else render fails naming the node and the sums.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import RenderError
from fleetserve.k8s.render.naming import group_name, model_resource
from fleetserve.plan.result import PlanResult, ReplicaPlacement
from fleetserve.spec import FleetSpec, ModelSpec, PoolSpec
from fleetserve.units import gib_ceil, gib_to_mib_floor

#: Default host memory per card of a replica when the spec does not say (GiB).
DEFAULT_MEMORY_GIB_PER_CARD = 8
#: Smallest pod memory render will give a replica (GiB): Ray + Python + vLLM's process.
MIN_MEMORY_GIB = 4
#: Fraction of a node's allocatable memory pods may take (kubelet/system pods need the rest).
NODE_MEMORY_SHARE = 0.9


@dataclass(frozen=True)
class PodShape:
    """What one replica's pod holds (identical for every replica of a worker group)."""

    gpus: int
    """Cards of one pod (for a replica spanning nodes: of one of its nodes)."""
    memory_mb: int
    cores_percent: int
    card_memory_mb: int
    engine: EngineSettings
    nodes: int = 1
    """Pods (nodes) one replica spans: > 1 when its pipeline stages cross nodes."""

    @property
    def sliced(self) -> bool:
        """True when the replica shares its card (a HAMi slice), False for whole cards/CPU."""
        if self.gpus == 0:
            return False
        if self.cores_percent < 100:
            return True
        return 0 < self.memory_mb < self.card_memory_mb


@dataclass(frozen=True)
class WorkerGroup:
    """One KubeRay worker group: the pods of one model on one pool."""

    name: str
    pool: PoolSpec
    model: ModelSpec
    shape: PodShape
    min_replicas: int
    max_replicas: int
    cpu: int
    memory_gib: int
    ray_resource: str

    @property
    def pods_per_replica(self) -> int:
        """Pods one Serve replica takes (its pipeline stages across nodes, one pod each)."""
        return self.shape.nodes

    @property
    def ray_units(self) -> int:
        """Units of ``ray_resource`` one pod advertises: 1 (one replica per pod), or its
        cards when a replica spans pods - each of the replica's ``{GPU: 1}`` bundles then
        takes one unit, so its bundles land only on pods cut for this model."""
        return self.shape.gpus if self.shape.nodes > 1 else 1


def _check_feasible(plan: PlanResult, label: str) -> None:
    if plan.feasible and not plan.unplaced:
        return
    reasons = "; ".join(f"{u.model}#{u.index}: {u.reason}" for u in plan.unplaced[:5])
    more = f" (and {len(plan.unplaced) - 5} more)" if len(plan.unplaced) > 5 else ""
    raise RenderError(
        f"the {label} plan is not feasible, so no manifests were written: "
        f"{reasons or 'the planner found no placement'}{more}",
        hint="run `fleetserve plan` for the details; add nodes or GPUs, or lower replicas",
    )


def _card_memory_mb(placement: ReplicaPlacement, pool: PoolSpec) -> int:
    if placement.card_memory_mb > 0:
        return placement.card_memory_mb
    if pool.gpu is not None and pool.gpu.memory_gb is not None:
        return gib_to_mib_floor(pool.gpu.memory_gb)
    return 0


def _shape(placement: ReplicaPlacement, pool: PoolSpec) -> PodShape:
    return PodShape(
        gpus=len(placement.gpus),
        memory_mb=placement.memory_mb,
        cores_percent=placement.cores_percent,
        card_memory_mb=_card_memory_mb(placement, pool),
        engine=placement.engine,
        nodes=len(placement.spans),
    )


def _describe(pool: str, shape: PodShape) -> str:
    nodes = f" on each of {shape.nodes} nodes" if shape.nodes > 1 else ""
    return (
        f"pool {pool}: {shape.gpus} card(s){nodes}, {shape.memory_mb} MiB/"
        f"{shape.cores_percent}% per card, gpu_memory_utilization "
        f"{shape.engine.gpu_memory_utilization:g}"
    )


def _model_shape(
    model: ModelSpec, placements: list[ReplicaPlacement], pools: dict[str, PoolSpec]
) -> PodShape:
    """The single pod shape of a model's replicas, or a RenderError naming the difference."""
    shapes: dict[str, PodShape] = {}
    for placement in placements:
        shape = _shape(placement, pools[placement.pool])
        uneven = len({len(n.gpus) for n in placement.spans}) > 1
        if uneven or shape.gpus * shape.nodes not in (0, model.gpus_per_replica):
            raise RenderError(
                f"model '{model.name}' replica {placement.index}: the plan gives it "
                f"{placement.gpus_total} card(s)"
                + (f" on {shape.nodes} nodes" if shape.nodes > 1 else "")
                + f" but tensor_parallel ({model.tensor_parallel}) x pipeline_parallel "
                f"({model.pipeline_parallel}) = {model.gpus_per_replica}",
                hint="re-run the planner with this spec",
            )
        shapes.setdefault(placement.pool, shape)
    distinct = sorted(shapes.items(), key=lambda ps: ps[0])
    first_pool, first = distinct[0]
    for pool, shape in distinct[1:]:
        if shape != first:
            raise RenderError(
                f"model '{model.name}' is placed with two pod shapes "
                f"({_describe(first_pool, first)}; {_describe(pool, shape)}); one Serve "
                "deployment runs one engine configuration",
                hint=f"pin the model to one pool with models[].pools: [{first_pool}]",
            )
    for placement in placements:
        shape = _shape(placement, pools[placement.pool])
        if shape != shapes[placement.pool]:
            raise RenderError(
                f"model '{model.name}' has replicas of different shapes on pool "
                f"{placement.pool} ({_describe(placement.pool, shapes[placement.pool])}; "
                f"{_describe(placement.pool, shape)})",
                hint="re-run the planner with this spec",
            )
    return first


def plan_worker_groups(
    spec: FleetSpec, plan_min: PlanResult, plan_max: PlanResult
) -> list[WorkerGroup]:
    """The worker groups of a fleet, sorted by name (see the module note for the mapping)."""
    _check_feasible(plan_min, "min")
    _check_feasible(plan_max, "max")
    pools = {p.name: p for p in spec.pools}
    known = {m.name for m in spec.models}
    for plan in (plan_min, plan_max):
        for placement in plan.replicas:
            if placement.model not in known:
                raise RenderError(
                    f"the plan places model '{placement.model}', which is not in the spec "
                    f"({', '.join(sorted(known))})",
                    hint="the plan must be made from this spec",
                )
            if placement.pool not in pools:
                raise RenderError(
                    f"the plan places '{placement.model}' on pool '{placement.pool}', which "
                    f"is not in the spec's pools ({', '.join(sorted(pools)) or 'none'})",
                    hint="Kubernetes rendering needs the pools in the spec",
                )
    min_count = Counter((p.model, p.pool) for p in plan_min.replicas)
    max_count = Counter((p.model, p.pool) for p in plan_max.replicas)

    # Pods per node of the max plan: the node sizes every pod must fit (a replica over
    # several nodes has a pod on each).
    pods_on_node: dict[tuple[str, int], list[ReplicaPlacement]] = defaultdict(list)
    for placement in plan_max.replicas:
        for share in placement.spans:
            pods_on_node[(placement.pool, share.node)].append(placement)
    busiest = Counter[str]()
    for (pool, _node), items in pods_on_node.items():
        busiest[pool] = max(busiest[pool], len(items))

    sizes: dict[str, tuple[int, int]] = {}
    groups: list[WorkerGroup] = []
    for model in spec.models:
        placements = [p for p in plan_max.replicas if p.model == model.name]
        placements += [p for p in plan_min.replicas if p.model == model.name]
        if not placements:
            continue
        shape = _model_shape(model, placements, pools)
        for pool_name in sorted({p.pool for p in placements}):
            pool_spec = pools[pool_name]
            cpu, memory = _pod_size(model, shape, pool_spec, busiest[pool_name] or 1)
            sizes[model.name + "@" + pool_name] = (cpu, memory)
            # KubeRay counts pods: a replica over k nodes is k pods of the group
            low = min_count[(model.name, pool_name)] * shape.nodes
            high = max_count[(model.name, pool_name)] * shape.nodes
            groups.append(
                WorkerGroup(
                    name=group_name(pool_name, model.name),
                    pool=pool_spec,
                    model=model,
                    shape=shape,
                    min_replicas=low,
                    max_replicas=max(low, high, shape.nodes),
                    cpu=cpu,
                    memory_gib=memory,
                    ray_resource=model_resource(model.name),
                )
            )
    _check_nodes_fit(spec, pods_on_node, sizes)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):  # pragma: no cover - group_name hashes sanitised names
        raise RenderError(f"worker group names collide: {sorted(names)}")
    return sorted(groups, key=lambda g: g.name)


def _pod_size(model: ModelSpec, shape: PodShape, pool: PoolSpec, pods: int) -> tuple[int, int]:
    """(CPUs, GiB) of one replica's pod on ``pool`` whose busiest node holds ``pods`` pods."""
    base_cpu = max(1, math.ceil(model.resources.cpu))
    cpu = base_cpu + 1 if (base_cpu + 1) * pods <= pool.cpu else base_cpu
    if model.resources.memory_gb is not None:
        memory = gib_ceil(model.resources.memory_gb)
    else:
        share = math.floor(pool.memory_gb * NODE_MEMORY_SHARE / pods)
        memory = max(MIN_MEMORY_GIB, min(DEFAULT_MEMORY_GIB_PER_CARD * max(1, shape.gpus), share))
    return cpu, memory


def _check_nodes_fit(
    spec: FleetSpec,
    pods_on_node: dict[tuple[str, int], list[ReplicaPlacement]],
    sizes: dict[str, tuple[int, int]],
) -> None:
    pools = {p.name: p for p in spec.pools}
    for (pool_name, node), items in sorted(pods_on_node.items()):
        pool = pools[pool_name]
        cpu = sum(sizes[p.model + "@" + pool_name][0] for p in items)
        memory = sum(sizes[p.model + "@" + pool_name][1] for p in items)
        if cpu > pool.cpu or memory > pool.memory_gb:
            models = ", ".join(sorted(Counter(p.model for p in items).elements()))
            raise RenderError(
                f"pool {pool_name} node {node}: its {len(items)} replica pods ({models}) need "
                f"{cpu} CPUs and {memory} GiB, the node has {pool.cpu:g} CPUs and "
                f"{pool.memory_gb:g} GiB",
                hint="lower models[].resources.cpu/memory_gb or use a larger pool "
                "(pools[].cpu/memory_gb must be the node's allocatable resources)",
            )


def shared_cards(plan: PlanResult) -> list[str]:
    """Cards the plan gives to more than one replica, described (``pool a6000 node 0 card 1:
    llama-3-8b#0, qwen2.5-7b#1``), sorted."""
    holders: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for placement in plan.replicas:
        for card in placement.gpus:
            holders[(placement.pool, placement.node, card)].append(
                f"{placement.model}#{placement.index}"
            )
    return [
        f"pool {pool} node {node} card {card}: {', '.join(sorted(names))}"
        for (pool, node, card), names in sorted(holders.items())
        if len(names) > 1
    ]


def check_pool_selectors(spec: FleetSpec, groups: list[WorkerGroup]) -> None:
    """A group's nodeSelector (its pool's labels) must not also match another pool's nodes.

    Otherwise Kubernetes may start a replica planned for one card type on another (a slice
    cut for a 48 GB card on a 16 GB one), and the plan's arithmetic no longer holds.
    """
    for group in groups:
        own = group.pool.labels.items()
        for other in spec.pools:
            if other.name == group.pool.name:
                continue
            if own <= other.labels.items():
                shown = ", ".join(f"{k}={v}" for k, v in sorted(group.pool.labels.items()))
                raise RenderError(
                    f"pool '{group.pool.name}' is selected by its labels ({shown or 'none'}), "
                    f"which pool '{other.name}' also carries: replicas of '{group.model.name}' "
                    f"planned on {group.pool.name} could start on {other.name} nodes",
                    hint=f"give pool '{group.pool.name}' a label no other pool has "
                    "(e.g. its NodePool name: karpenter.sh/nodepool)",
                )


def tenant_warnings(spec: FleetSpec, groups: list[WorkerGroup], *, hami: bool) -> list[str]:
    """Dedicated tenants whose HAMi slices share a pool with another tenant's slices.

    The plan keeps them on different cards, but the manifests cannot: HAMi's scheduler may
    put both on one physical card (vGPU slicing is not a trust boundary). The fix is a pool
    of their own (distinct labels/taints), which the planner and render then honour.
    """
    if not hami:
        return []
    dedicated = {t.name for t in spec.tenants if t.isolation == "dedicated"}
    out = []
    for group in groups:
        tenant = group.model.tenant
        if tenant not in dedicated or not group.shape.sliced:
            continue
        others = sorted(
            {
                f"{g.model.name} (tenant {g.model.tenant or 'none'})"
                for g in groups
                if g.pool.name == group.pool.name and g.model.tenant != tenant and g.shape.sliced
            }
        )
        if others:
            out.append(
                f"dedicated tenant '{tenant}' ({group.model.name}) shares pool "
                f"'{group.pool.name}' with {', '.join(others)}: HAMi may put their slices on "
                f"one card; give tenant '{tenant}' a pool of its own"
            )
    return out
