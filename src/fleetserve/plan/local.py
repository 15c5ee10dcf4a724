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
"""

from __future__ import annotations

import math

from fleetserve.engine.settings import CPU_MAX_MEMORY_FRACTION, EngineSettings
from fleetserve.host import HostFacts
from fleetserve.plan.gpus import GpuType
from fleetserve.plan.memory import estimate_replica
from fleetserve.plan.planner import PoolCard, build_problem, compose_result, solve
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
from fleetserve.spec import FleetSpec, GpuSpec, PoolSpec
from fleetserve.units import mib_to_gib

#: Host RAM kept for the OS, Ray (GCS, raylet, dashboard) and the HTTP proxy on a CPU host.
CPU_HOST_RESERVE_MB = 3072
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
