"""Per-model engine settings: from the planner when it is there, else from the spec.

The one swap point between "serve derives its own settings" and "serve follows the
plan" (``fleetserve.plan.local.plan_local``): everything else reads
:func:`engine_settings`.
"""

from __future__ import annotations

from fleetserve.plan.result import EngineSettings
from fleetserve.spec import FleetSpec, ModelSpec

#: Fraction of host RAM for one replica's KV cache on a CPU host (vLLM's CPU backend reads
#: ``gpu_memory_utilization`` as a fraction of RAM); small because several engines and
#: the test suite share one machine.
CPU_MEMORY_FRACTION = 0.1
#: Fraction of a whole card for a replica that owns its GPU(s).
GPU_MEMORY_FRACTION = 0.9
#: Context length when neither the spec nor a plan gives one.
DEFAULT_MAX_MODEL_LEN = 4096
#: Floor of ``max_num_batched_tokens`` (vLLM's own default for the OpenAI server).
DEFAULT_BATCHED_TOKENS = 2048


def derived_settings(model: ModelSpec, *, gpu_host: bool) -> EngineSettings:
    """Conservative settings from the spec alone (no plan)."""
    max_model_len = model.max_model_len or DEFAULT_MAX_MODEL_LEN
    max_num_seqs = model.max_num_seqs or model.concurrency
    batched = model.max_num_batched_tokens or max(DEFAULT_BATCHED_TOKENS, max_num_seqs)
    return EngineSettings(
        gpu_memory_utilization=GPU_MEMORY_FRACTION if gpu_host else CPU_MEMORY_FRACTION,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
    )


def engine_settings(spec: FleetSpec, *, gpu_host: bool) -> dict[str, EngineSettings]:
    """Engine settings for every model of ``spec`` on this host, by model name."""
    return {m.name: derived_settings(m, gpu_host=gpu_host) for m in spec.models}
