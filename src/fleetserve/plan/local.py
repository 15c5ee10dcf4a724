"""Planning for ``fleetserve serve`` on this machine.

Design note. The local machine is one node. With GPUs it is a pool of that node's cards
and the fleet planner places the replicas on it (fractional Ray ``num_gpus`` and the
engine's ``gpu_memory_utilization`` as a fraction of the whole card; no HAMi locally, so
engines see whole cards and the fractions must sum to at most 1 per card). Without GPUs,
vLLM CPU runs each replica in host RAM: its ``gpu_memory_utilization`` is the fraction of
host RAM the worker may hold (vllm/v1/worker/cpu_worker.py: KV cache = fraction x total
RAM - the worker's resident memory), so the fraction must cover the weights, the runtime
and a KV cache of ``concurrency`` x ``max_model_len`` (at least one full sequence), and the
fractions of all replicas together must fit what the host can spare.

When nothing can be sized - the fake engine (no weights), a cluster fleetserve only joins
(this machine's memory says nothing about its nodes), engine settings handed in by a
hand-written Serve config - :func:`plan_unsized` plans from the spec alone: the same
limits (:func:`fleetserve.engine.settings.engine_limits`), a conservative memory fraction
(:data:`GPU_MEMORY_FRACTION` of a card, :data:`CPU_REPLICA_MEMORY_GIB` of host RAM), and
- with no slice sized - Ray's share of a card is the engine's fraction of it.
"""

from __future__ import annotations

import math

from fleetserve.engine.settings import (
    CPU_MAX_MEMORY_FRACTION,
    EngineSettings,
    engine_limits,
    vllm_default_batched_tokens,
)
from fleetserve.errors import SpecError
from fleetserve.host import HostFacts, engine_visible_memory
from fleetserve.plan.deployment import FleetDeployment, node_deployment
from fleetserve.plan.gpus import GpuType
from fleetserve.plan.memory import estimate_replica
from fleetserve.plan.planner import PoolCard, build_problem, compose_result, resolve_pool, solve
from fleetserve.plan.problem import DEVICE_SPLIT_COUNT, PoolShape
from fleetserve.plan.result import PlanResult, PoolUsage, ReplicaPlacement, Unplaced
from fleetserve.plan.sizing import (
    CUDA_VISIBLE_FRACTION,
    margin_mb,
    model_config_for,
    replica_args,
    resolved_limits,
)
from fleetserve.plan.vllm_rules import model_refusals
from fleetserve.spec import FleetSpec, GpuSpec, ModelSpec, PoolSpec
from fleetserve.units import mib_to_gib

#: Host RAM kept for the OS, Ray (GCS, raylet, dashboard) and the HTTP proxy on a CPU host.
CPU_HOST_RESERVE_MB = 3072
#: Host RAM one unsized replica may use on a CPU host (GiB). vLLM's CPU backend reads
#: ``gpu_memory_utilization`` as a fraction of the NUMA node's RAM that must cover the
#: engine process's whole RSS (weights, compiled graphs: ~2.3 GiB for Gemma 3 270M) plus the
#: KV cache; a flat fraction such as 0.1 fails on a 24 GiB host ("requested memory for kv
#: (-0.25 GiB)"), so the budget is absolute and converted per host.
CPU_REPLICA_MEMORY_GIB = 4.0
#: Fraction of a whole card for an unsized replica that owns its GPU(s).
GPU_MEMORY_FRACTION = 0.9
#: The planner's view of this machine is the host probe's (fleetserve.host): the same
#: CPUs and RAM ``serve`` gives Ray and the engines.
LocalHost = HostFacts


def plan_local(spec: FleetSpec, host: LocalHost) -> PlanResult:
    """Plan ``spec`` (at least one replica per model) on ``host``."""
    if host.gpu_memory_mb:
        return _plan_gpu(spec, host)
    return _plan_cpu(spec, host)


def _plan_gpu(spec: FleetSpec, host: LocalHost) -> PlanResult:
    # Engines may land on any card: plan for the smallest. The probe reads CUDA's figure
    # (torch), the sizing takes a card's nominal memory (nvidia-smi's, what HAMi and the
    # GPU catalogue count) and applies CUDA's share itself: convert back, once, here.
    card_mb = round(min(host.gpu_memory_mb) / CUDA_VISIBLE_FRACTION)
    gpu = GpuType("local", card_mb, 0, known=False)  # capability not probed: rules skipped
    pool = PoolSpec(
        name="local",
        gpu=GpuSpec(count=len(host.gpu_memory_mb), memory_gb=mib_to_gib(card_mb)),
        cpu=host.cpus,
        memory_gb=mib_to_gib(host.memory_mb),
        max_nodes=1,
    )
    shape = PoolShape(
        name="local",
        gpu_type="local",
        card_mb=card_mb,
        cards_per_node=len(host.gpu_memory_mb),
        cpu=float(host.cpus),
        ram_mb=host.memory_mb,
        max_nodes=1,
        split_count=DEVICE_SPLIT_COUNT,
    )
    pools = [PoolCard(pool, gpu, shape)]
    # The machine is the spec's one pool here, so that every diagnosis that names a pool
    # (pools[i]...) names it instead of failing to find it among the spec's cluster pools.
    local_spec = spec.model_copy(
        update={
            "models": [m.model_copy(update={"pools": None}) for m in spec.models],
            "pools": [pool],
        }
    )
    problem, plans = build_problem(local_spec, pools, "local")
    packing = solve(problem, time_limit_s=5.0)
    result = compose_result(
        local_spec, pools=pools, plans=plans, problem=problem, packing=packing, scenario="local"
    )
    return result.model_copy(update={"solver": f"local/{result.solver}"})


def _plan_cpu(spec: FleetSpec, host: LocalHost) -> PlanResult:
    budget = host.memory_mb - CPU_HOST_RESERVE_MB
    cpus_left = float(host.cpus)
    replicas: list[ReplicaPlacement] = []
    unplaced: list[Unplaced] = []
    used_mb = 0
    for m_index, model in enumerate(spec.models):
        config = model_config_for(model, index=m_index)
        refusals = model_refusals(model, config)
        if refusals:  # vLLM would not start it: never plan it
            for index in range(max(1, model.replicas.min)):
                unplaced.append(
                    Unplaced(
                        model=model.name,
                        index=index,
                        reason=f"models[{m_index}].{refusals[0].field}: "
                        + "; ".join(r.reason for r in refusals),
                        resource="engine",
                        fixes=list(dict.fromkeys(f for r in refusals for f in r.fixes)),
                    )
                )
            continue
        # vLLM CPU's OpenAI-server defaults (the engine's one derivation)
        limits = resolved_limits(model, config)
        memory = estimate_replica(
            config,
            max_model_len=limits.max_model_len,
            device="cpu",
            **replica_args(model, limits),
        )
        need = memory.total_mb
        fraction = math.ceil((need + margin_mb(need)) / host.memory_mb * 1000) / 1000
        share = math.ceil(fraction * host.memory_mb)  # what the engine may hold (MiB)
        for index in range(max(1, model.replicas.min)):
            short: tuple[str, float] | None = None
            if fraction > CPU_MAX_MEMORY_FRACTION or used_mb + share > budget:
                short = ("memory", used_mb + share - budget)
            elif model.resources.cpu > cpus_left + 1e-9:
                short = ("cpu", model.resources.cpu - cpus_left)
            if short is not None:
                unit = "MiB" if short[0] == "memory" else "CPUs"
                unplaced.append(
                    Unplaced(
                        model=model.name,
                        index=index,
                        reason=f"this host has no room: needs {share:,} MiB RAM and "
                        f"{model.resources.cpu:g} CPUs; {budget - used_mb:,} MiB and "
                        f"{cpus_left:g} CPUs left (short {short[1]:,.0f} {unit})",
                        resource=short[0],
                        shortfall=float(short[1]),
                        fixes=["lower concurrency or max_model_len", "fewer replicas"],
                    )
                )
                continue
            used_mb += share
            cpus_left -= model.resources.cpu
            replicas.append(
                ReplicaPlacement(
                    model=model.name,
                    index=index,
                    pool="local",
                    node=0,
                    gpus=[],
                    memory_mb=share,
                    cores_percent=0,
                    engine=EngineSettings(
                        gpu_memory_utilization=fraction,
                        max_num_seqs=limits.max_num_seqs,
                        max_model_len=limits.max_model_len,
                        max_num_batched_tokens=limits.max_num_batched_tokens,
                        kv_cache_tokens=limits.kv_cache_tokens,
                    ),
                    tenant=model.tenant,
                    need_mb=need,
                )
            )
    return PlanResult(
        feasible=not unplaced,
        gpus_used=0,
        nodes={"local": 1},
        optimality_gap=0.0,
        replicas=replicas,
        unplaced=unplaced,
        scenario="local",
        solver="local/cpu",
        lower_bound=0.0,
        pools=[
            PoolUsage(
                name="local",
                gpu_type=None,
                card_memory_mb=0,
                gpus_per_node=0,
                nodes=1,
                gpus_used=0,
                memory_used_mb=used_mb,
                replicas=len(replicas),
            )
        ],
    )


def cpu_memory_fraction(total_bytes: int) -> float:
    """``gpu_memory_utilization`` giving one unsized CPU replica its RAM budget on a host
    of ``total_bytes``."""
    fraction = CPU_REPLICA_MEMORY_GIB * 2**30 / max(total_bytes, 1)
    return round(min(CPU_MAX_MEMORY_FRACTION, fraction), 4)


def pool_batched_tokens(spec: FleetSpec, model: ModelSpec) -> int | None:
    """vLLM's batched-tokens default on the cards ``model`` may run on (the spec's GPU
    pools, those it names if it names any): the smallest one's, as one Serve deployment
    gives every replica the same number. None when the spec describes no GPU pool (vLLM's
    fallback for an unknown device applies)."""
    defaults = []
    for pool in spec.pools:
        if model.pools is not None and pool.name not in model.pools:
            continue
        gpu = resolve_pool(pool).gpu
        if gpu is not None:
            defaults.append(vllm_default_batched_tokens(gpu.memory_mib, gpu.name))
    return min(defaults, default=None)


def _config_context(model: ModelSpec) -> int | None:
    """The config's default context, or None when there is no readable config (the fake
    engine's made-up sources, a hub repo id outside the catalogue: vLLM reads it there)."""
    try:
        return model_config_for(model).default_max_model_len
    except SpecError:
        return None


def unsized_settings(
    model: ModelSpec, *, gpu: bool, memory_bytes: int, batched_tokens: int | None = None
) -> EngineSettings:
    """Conservative settings of one of ``model``'s replicas from the spec alone.

    The limits (context, sequences, batched tokens) are resolved exactly as the planner
    resolves them (the model config's context, the card's batched-tokens default), so a
    joined cluster runs the numbers planning would.
    """
    limits = engine_limits(model, context=_config_context(model), batched_tokens=batched_tokens)
    return EngineSettings(
        gpu_memory_utilization=GPU_MEMORY_FRACTION if gpu else cpu_memory_fraction(memory_bytes),
        max_num_seqs=limits.max_num_seqs,
        max_model_len=limits.max_model_len,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        kv_cache_tokens=limits.kv_cache_tokens,
    )


def plan_unsized(
    spec: FleetSpec,
    *,
    gpu: bool,
    memory_bytes: int | None = None,
    settings: dict[str, EngineSettings] | None = None,
) -> PlanResult:
    """One replica per model planned from the spec alone (see the module note).

    ``gpu``: the replicas run on GPUs (a GPU cluster or host); ``memory_bytes``: host RAM a
    CPU replica's fraction is of (default: this machine's, as vLLM CPU measures it);
    ``settings``: engine settings already decided, by model name (they are kept; Ray's
    share follows from them).
    """
    memory = memory_bytes if memory_bytes is not None else engine_visible_memory()
    replicas = []
    for model in spec.models:
        engine = (settings or {}).get(model.name) or unsized_settings(
            model,
            gpu=gpu,
            memory_bytes=memory,
            batched_tokens=pool_batched_tokens(spec, model) if gpu else None,
        )
        num_gpus = 0.0
        if gpu:
            cards = model.gpus_per_replica
            # Whole cards for a replica over several; else no slice was sized, so Ray's
            # share of the card is the engine's.
            num_gpus = float(cards) if cards > 1 else round(engine.gpu_memory_utilization, 4)
        replicas.append(
            ReplicaPlacement(
                model=model.name,
                index=0,
                pool="unsized",
                node=0,
                gpus=[],
                memory_mb=0,
                cores_percent=0,
                engine=engine,
                tenant=model.tenant,
                num_gpus=num_gpus,
                tensor_parallel=model.tensor_parallel,
                pipeline_parallel=model.pipeline_parallel,
                whole_cards=gpu and model.gpus_per_replica > 1,
            )
        )
    return PlanResult(
        feasible=True,
        gpus_used=0,
        nodes={},
        optimality_gap=None,
        replicas=replicas,
        unplaced=[],
        scenario="unsized",
        solver="spec",
    )


def local_deployment(spec: FleetSpec, host: LocalHost, *, sized: bool = True) -> FleetDeployment:
    """What ``fleetserve serve`` deploys on this machine: the local plan (``sized``: real
    engines sized from their model configs), else the unsized plan (the fake engine), read
    as replicas sharing this node (:func:`fleetserve.plan.deployment.node_deployment`)."""
    if sized:
        return node_deployment(spec, plan_local(spec, host))
    return node_deployment(spec, plan_unsized(spec, gpu=bool(host.gpu_memory_mb)))


def joined_deployment(spec: FleetSpec, *, gpu: bool) -> FleetDeployment:
    """What ``fleetserve serve --address`` deploys on a Ray cluster it joins (GPUs or not):
    the unsized plan, as replicas sharing the cluster's nodes."""
    return node_deployment(spec, plan_unsized(spec, gpu=gpu))
