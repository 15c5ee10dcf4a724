"""Per-model engine settings: from the local planner, or derived from the spec.

The one place serve gets vLLM's memory and batching numbers; everything else reads
:func:`engine_settings`. On this machine they come from the planner
(``fleetserve.plan.local.plan_local``: the KV cache sized from the model's config,
``gpu_memory_utilization`` as a fraction of the card, or of host RAM on a CPU host). For a
cluster that fleetserve only joins, where this machine's memory says nothing,
:func:`derived_settings` gives conservative numbers from the spec alone.
"""

from __future__ import annotations

from fleetserve.engine.settings import (
    CPU_MAX_MEMORY_FRACTION,
    EngineSettings,
    engine_limits,
    vllm_default_batched_tokens,
)
from fleetserve.errors import CapacityError, SpecError
from fleetserve.host import HostFacts, engine_visible_memory, probe
from fleetserve.plan.local import plan_local
from fleetserve.plan.planner import resolve_pool
from fleetserve.plan.sizing import model_config_for
from fleetserve.spec import FleetSpec, ModelSpec

#: Host RAM one replica may use on a CPU host (GiB). vLLM's CPU backend reads
#: ``gpu_memory_utilization`` as a fraction of the NUMA node's RAM that must cover the
#: engine process's whole RSS (weights, compiled graphs: ~2.3 GiB for Gemma 3 270M) plus the
#: KV cache; a flat fraction such as 0.1 fails on a 24 GiB host ("requested memory for kv
#: (-0.25 GiB)"), so the budget is absolute and converted per host.
CPU_REPLICA_MEMORY_GIB = 4.0
#: Fraction of a whole card for a replica that owns its GPU(s).
GPU_MEMORY_FRACTION = 0.9


def cpu_memory_fraction(total_bytes: int) -> float:
    """``gpu_memory_utilization`` giving one CPU replica its RAM budget on this host."""
    fraction = CPU_REPLICA_MEMORY_GIB * 2**30 / max(total_bytes, 1)
    return round(min(CPU_MAX_MEMORY_FRACTION, fraction), 4)


def derived_settings(
    model: ModelSpec,
    *,
    gpu_host: bool,
    host_memory: int | None = None,
    batched_tokens: int | None = None,
) -> EngineSettings:
    """Conservative settings from the spec alone (no plan).

    The limits (context, sequences, batched tokens) are resolved exactly as the planner
    resolves them (:func:`fleetserve.engine.settings.engine_limits` with the model config's
    context and the card's batched-tokens default, ``batched_tokens``), so a joined cluster
    runs the numbers local planning would.
    """
    limits = engine_limits(model, context=_config_context(model), batched_tokens=batched_tokens)
    return EngineSettings(
        gpu_memory_utilization=(
            GPU_MEMORY_FRACTION
            if gpu_host
            else cpu_memory_fraction(host_memory or engine_visible_memory())
        ),
        max_num_seqs=limits.max_num_seqs,
        max_model_len=limits.max_model_len,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        kv_cache_tokens=limits.kv_cache_tokens,
    )


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


def engine_settings(
    spec: FleetSpec, *, local: bool = True, gpu_host: bool = False, host: HostFacts | None = None
) -> dict[str, EngineSettings]:
    """Engine settings for every model of ``spec``, by model name.

    ``local``: plan on this machine (CapacityError with the planner's reasons when a
    replica cannot be placed); else derive from the spec for a GPU or CPU cluster.
    ``host``: this machine as already probed (:func:`fleetserve.host.probe`), so that the
    plan and the Ray started afterwards see the same CPUs; probed here when not given.
    """
    if not local:
        return {
            m.name: derived_settings(
                m,
                gpu_host=gpu_host,
                batched_tokens=pool_batched_tokens(spec, m) if gpu_host else None,
            )
            for m in spec.models
        }
    plan = plan_local(spec, host or probe())
    if not plan.feasible or plan.unplaced:
        reasons = "; ".join(f"{u.model} (replica {u.index}): {u.reason}" for u in plan.unplaced)
        raise CapacityError(f"the fleet does not fit this machine: {reasons or 'infeasible'}")
    settings: dict[str, EngineSettings] = {}
    for replica in sorted(plan.replicas, key=lambda r: r.index):
        # One Serve deployment per model: every replica starts with the first one's numbers.
        settings.setdefault(replica.model, replica.engine)
    missing = [m.name for m in spec.models if m.name not in settings]
    if missing:
        raise CapacityError(f"the plan placed no replica of {', '.join(missing)}")
    return settings
