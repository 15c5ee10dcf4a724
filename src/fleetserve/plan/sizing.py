"""Sizing: what one replica of a model takes on one kind of card, and its engine settings.

Turns the memory model's estimate into the numbers a plan carries: the HAMi slice
(``nvidia.com/gpumem``, MiB, margin included), ``gpucores``, Ray ``num_gpus`` and the vLLM
settings. What must stay true: the engine's requested memory
(``gpu_memory_utilization`` x card) is never more than its slice minus the margin, so
co-located engines cannot OOM each other (ray#62553, ray#58328), and the KV cache it is
left with holds ``concurrency`` x ``max_model_len`` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from fleetserve.engine.settings import (
    DEFAULT_BATCHED_TOKENS,
    EngineLimits,
    EngineSettings,
    engine_limits,
    vllm_default_batched_tokens,
)
from fleetserve.errors import SpecError
from fleetserve.plan.gpus import GPU_CATALOGUE, GpuType
from fleetserve.plan.memory import (
    Dtype,
    KvDtype,
    MiB,
    ModelConfig,
    Quantization,
    ReplicaMemory,
    estimate_replica,
    load_model_config,
    max_model_len_within,
)
from fleetserve.plan.vllm_rules import engine_refusals, model_refusals, tp_splits
from fleetserve.spec import ModelSpec

#: Safety margin of a slice over what the engine is told to use: max(5 %, 256 MiB). It
#: absorbs allocator fragmentation and estimate error outside the engine's budget.
MARGIN_FRACTION = 0.05
MARGIN_MIN_MB = 256
#: A whole card's engine keeps this headroom (seed 004 settled on 0.85-0.9 after OOMs
#: on some driver/firmware combinations; 0.92 for large cards, at least 1 GiB free).
WHOLE_CARD_HEADROOM = 0.08
WHOLE_CARD_HEADROOM_MIN_MB = 1024
#: Host RAM a replica's engine process takes when resources.memory_gb is not given (MiB
#: per card: Python, torch, vLLM, tokenizer, pinned staging buffers).
DEFAULT_HOST_RAM_MB = 4096
#: CUDA reports less memory than nvidia-smi (the driver keeps some): on an H200,
#: torch.cuda.mem_get_info() gives 143155 MiB of nvidia-smi's 143771. vLLM multiplies
#: gpu_memory_utilization by CUDA's figure, so the fraction is computed against it.
CUDA_VISIBLE_FRACTION = 143155 / 143771


def _looks_like_path(ref: str) -> bool:
    """A ``config`` that names a file (a directory or a config.json), not a catalogue entry."""
    return "/" in ref or ref.endswith(".json")


def model_config_for(
    model: ModelSpec, base_dir: Path | None = None, *, index: int | None = None
) -> ModelConfig:
    """The architecture of ``model``: its ``config``, else derived from ``source``.

    Relative paths resolve against ``base_dir`` (the spec file's directory) when given. A
    ``config`` path that does not exist says so (``models[i].config`` with ``index``); a
    name that matches nothing says so; a config.json that exists but is broken or not
    understood reports its own error (JSON line:column, the key at fault). A ``source``
    with a ``/`` is a hub id as often as a path, so only ``config`` gets the path message.
    """
    ref = model.config_ref
    where = "config" if model.config else "source"
    try:
        return load_model_config(ref, base_dir)
    except SpecError as e:
        if e.message.startswith("unknown model config"):
            if where == "config" and _looks_like_path(ref):
                field = (
                    f"models[{index}].config"
                    if index is not None
                    else f"model '{model.name}': config"
                )
                raise SpecError(f"{field}: {ref} does not exist") from e
            raise SpecError(
                f"model '{model.name}': {where} '{ref}' names no known model config",
                hint=e.hint or "set 'config' to a catalogue entry, a config.json or its directory",
            ) from e
        raise SpecError(f"model '{model.name}': {where} '{ref}': {e.message}", hint=e.hint) from e


def default_max_model_len(model: ModelSpec, config: ModelConfig) -> int:
    """The context a replica runs with: the spec's, else what vLLM derives from the config."""
    return resolved_limits(model, config).max_model_len


def resolved_limits(
    model: ModelSpec, config: ModelConfig, batched_tokens: int | None = None
) -> EngineLimits:
    """``model``'s engine limits with unset fields resolved from its config
    (:func:`fleetserve.engine.settings.engine_limits`, the one derivation)."""
    return engine_limits(model, context=config.default_max_model_len, batched_tokens=batched_tokens)


class ReplicaArgs(TypedDict):
    """:func:`estimate_replica`'s arguments that come from the model and its limits.

    Not ``max_model_len`` (callers search or resolve it), nor the parallel sizes: a GPU
    replica is sized per card, a CPU replica as one process.
    """

    concurrency: int
    max_num_seqs: int
    max_num_batched_tokens: int
    dtype: Dtype
    quantization: Quantization
    kv_cache_dtype: KvDtype
    max_loras: int
    max_lora_rank: int
    enforce_eager: bool


def replica_args(model: ModelSpec, limits: EngineLimits) -> ReplicaArgs:
    """What every sizing of one of ``model``'s replicas passes to the memory model."""
    return ReplicaArgs(
        concurrency=model.concurrency,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        dtype=model.dtype,
        quantization=model.quantization,
        kv_cache_dtype=model.kv_cache_dtype,
        max_loras=model.max_loras if model.lora_enabled else 0,
        max_lora_rank=model.max_lora_rank,
        enforce_eager=model.eager,
    )


def margin_mb(need_mb: int) -> int:
    return max(MARGIN_MIN_MB, math.ceil(need_mb * MARGIN_FRACTION))


def whole_card_utilization(card_mb: int) -> float:
    headroom = max(WHOLE_CARD_HEADROOM_MIN_MB, card_mb * WHOLE_CARD_HEADROOM)
    return math.floor((card_mb - headroom) / card_mb * 100) / 100


def default_batched_tokens(card_mb: int, gpu_name: str, whole: bool) -> int:
    """vLLM's default for a whole card; a HAMi slice gets the small-card default (vLLM
    under HAMi sees the slice, not the card, as the device's memory)."""
    if not whole:
        return DEFAULT_BATCHED_TOKENS
    return vllm_default_batched_tokens(card_mb, gpu_name)


@dataclass(frozen=True)
class Sizing:
    """One replica of a model on one card type."""

    memory: ReplicaMemory
    need_mb: int
    """What the engine is told to use per card (MiB)."""
    slice_mb: int
    """HAMi gpumem per card (need + margin), or the card's memory for whole cards."""
    cores: int
    cards: int
    whole: bool
    num_gpus: float
    engine: EngineSettings


@dataclass(frozen=True)
class Rejection:
    """Why a replica cannot go on a card type / pool."""

    resource: str
    shortfall: float
    reason: str
    fixes: tuple[str, ...] = ()
    """Fixes known at rejection time (vLLM refusals); empty: the planner computes them."""
    field: str | None = None
    """The model spec field at fault (``tensor_parallel``, ...), for ``models[i].<field>``."""


def size_replica(
    model: ModelSpec,
    config: ModelConfig,
    gpu: GpuType,
    card_mb: int,
    *,
    split_count: int = 10,
    batched_tokens: int | None = None,
    whole: bool = False,
) -> Sizing | Rejection:
    """Size one replica of ``model`` on cards of ``card_mb`` MiB (slice or whole cards;
    ``whole``: whole cards even where a slice would hold it - the card's time is its own).

    A replica vLLM would refuse to start (:mod:`fleetserve.plan.vllm_rules`) is rejected
    with the field at fault and the fixes that pass the same rules.
    """
    refusals = engine_refusals(model, config, gpu)
    if refusals:
        first = refusals[0]
        anywhere = model_refusals(model, config)
        return Rejection(
            "engine" if anywhere else "gpu_capability",
            0,
            "; ".join(r.reason for r in refusals),
            fixes=tuple(dict.fromkeys(f for r in refusals for f in r.fixes)),
            field=first.field if first.field != "pools" else None,
        )
    if card_mb <= 0:
        return Rejection("gpu_memory", 0, f"{gpu.name} has no memory ({card_mb} MiB)")
    cards = model.tensor_parallel * model.pipeline_parallel

    def attempt(whole: bool) -> tuple[ReplicaMemory, int, EngineSettings]:
        limits = resolved_limits(
            model, config, batched_tokens or default_batched_tokens(card_mb, gpu.name, whole)
        )
        memory = estimate_replica(
            config,
            max_model_len=limits.max_model_len,
            tensor_parallel=model.tensor_parallel,
            pipeline_parallel=model.pipeline_parallel,
            **replica_args(model, limits),
        )
        need = memory.total_mb
        if whole:
            util = whole_card_utilization(card_mb)
            slice_util = None
        else:
            # vLLM's budget excludes its own CUDA context (made before its snapshot)
            budget = math.ceil(memory.budget / MiB)
            util = math.ceil(budget / (card_mb * CUDA_VISIBLE_FRACTION) * 10_000) / 10_000
            slice_util = math.floor(need / (need + margin_mb(need)) * 10_000) / 10_000
        engine = EngineSettings(
            gpu_memory_utilization=min(1.0, max(util, 0.0001)),  # checked below
            max_num_seqs=limits.max_num_seqs,
            max_model_len=limits.max_model_len,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            slice_memory_utilization=slice_util,
            kv_cache_tokens=limits.kv_cache_tokens,
        )
        return memory, need, engine

    if cards == 1 and not whole:
        memory, need, engine = attempt(whole=False)
        slice_mb = need + margin_mb(need)
        if slice_mb <= card_mb:
            cores = min(100, max(math.ceil(100 * slice_mb / card_mb), math.ceil(100 / split_count)))
            return Sizing(
                memory=memory,
                need_mb=need,
                slice_mb=slice_mb,
                cores=cores,
                cards=1,
                whole=cores >= 100,
                num_gpus=max(0.0001, math.floor(slice_mb / card_mb * 10_000) / 10_000),
                engine=engine,
            )
    memory, need, engine = attempt(whole=True)
    usable = math.floor(engine.gpu_memory_utilization * card_mb * CUDA_VISIBLE_FRACTION)
    if need > usable:
        return Rejection(
            "gpu_memory",
            need - usable,
            f"needs {need:,} MiB per card ({_terms(memory)}); {gpu.name} gives an engine "
            f"{usable:,} of its {card_mb:,} MiB: short by {need - usable:,} MiB",
        )
    return Sizing(
        memory=memory,
        need_mb=need,
        slice_mb=card_mb,
        cores=100,
        cards=cards,
        whole=True,
        num_gpus=float(cards),
        engine=engine,
    )


def _terms(memory: ReplicaMemory) -> str:
    runtime = (memory.runtime + memory.cuda_graphs + memory.cuda_context) / MiB
    return (
        f"weights {memory.weights / MiB:,.0f} + KV {memory.kv_cache / MiB:,.0f} + activation "
        f"{memory.activation / MiB:,.0f} + runtime {runtime:,.0f}"
    )


def suggest_fixes(
    model: ModelSpec, config: ModelConfig, card_mb: int, gpu: GpuType, max_cards: int
) -> list[str]:
    """What would make one replica fit: each fix computed with the memory model."""
    fixes: list[str] = []

    def fits(m: ModelSpec, g: GpuType = gpu, mb: int = card_mb) -> Sizing | None:
        result = size_replica(m, config, g, mb)
        return result if isinstance(result, Sizing) else None

    for g in sorted(GPU_CATALOGUE, key=lambda g: g.memory_mib):
        if g.memory_mib > card_mb:
            found = fits(model, g, g.memory_mib)
            if found is not None:
                fixes.append(f"a bigger card: {g.name} ({g.memory_mib:,} MiB)")
                break
    for tp in (2, 4, 8):
        if tp <= model.tensor_parallel or tp > max(max_cards, 1) * 8:
            continue
        if not tp_splits(config, tp):
            continue  # vLLM would refuse it: never suggest it
        found = fits(model.model_copy(update={"tensor_parallel": tp}))
        if found is not None:
            note = "" if tp <= max_cards else f" (pools need {tp} cards per node)"
            fixes.append(f"tensor_parallel: {tp} ({found.need_mb:,} MiB per card){note}")
            break
    if model.quantization is None:
        for quant in ("fp8", "awq"):
            update = {"quantization": quant}
            found = fits(model.model_copy(update=update))
            if found is not None:
                fixes.append(f"quantization: {quant} ({found.need_mb:,} MiB per card)")
                break
    if model.kv_cache_dtype == "auto":
        found = fits(model.model_copy(update={"kv_cache_dtype": "fp8"}))
        if found is not None:
            fixes.append(f"kv_cache_dtype: fp8 ({found.need_mb:,} MiB per card)")
    limits = resolved_limits(model, config)
    max_len = limits.max_model_len
    budget = math.floor(whole_card_utilization(card_mb) * card_mb) * MiB
    # The same replica as the sizing above, LoRA slots included.
    longest = max_model_len_within(
        config,
        budget,
        upper=max_len,
        tensor_parallel=model.tensor_parallel,
        pipeline_parallel=model.pipeline_parallel,
        **replica_args(model, limits),
    )
    if longest is not None and longest < max_len:
        fixes.append(f"max_model_len: {longest} (from {max_len})")
    if model.concurrency > 1:
        for conc in range(model.concurrency - 1, 0, -1):
            trial = model.model_copy(update={"concurrency": conc, "max_num_seqs": None})
            if fits(trial) is not None:
                fixes.append(f"concurrency: {conc} (from {model.concurrency})")
                break
    return fixes
