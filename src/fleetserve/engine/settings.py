"""The engine's settings for one replica, and the one place unset model fields get defaults.

Design note. ``max_model_len``, ``max_num_seqs`` and ``max_num_batched_tokens`` may be left
unset in the spec. vLLM then derives them itself; the planner, the local planner and a
joined cluster must all derive the SAME numbers, or a replica sized by the plan starts with
other limits than it was sized for. :func:`engine_limits` is that derivation; every caller
passes what it knows (the model config's default context, the card's batched-tokens default)
and never writes its own ``or`` fallback. Ray-free and pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.spec import ModelSpec

#: Context length when neither the spec nor a model config gives one (a model without a
#: readable config: the fake engine, or a repo id neither local nor in the catalogue).
FALLBACK_MAX_MODEL_LEN = 4096
#: max_num_batched_tokens vLLM's OpenAI server defaults to on CPUs, HAMi slices and cards
#: under 70 GiB (vllm/engine/arg_utils.py); bigger cards: :func:`vllm_default_batched_tokens`.
DEFAULT_BATCHED_TOKENS = 2048
#: Largest ``gpu_memory_utilization`` one vLLM CPU replica is given: there it is a fraction of
#: host RAM that vLLM allocates eagerly, and the OS, Ray and the proxy need the rest.
CPU_MAX_MEMORY_FRACTION = 0.9


class EngineSettings(BaseModel):
    """vLLM settings that follow from a replica's slice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_memory_utilization: float = Field(
        gt=0, le=1, description="Fraction of the WHOLE card (host RAM on a CPU host)."
    )
    max_num_seqs: int = Field(ge=1, description="vLLM max_num_seqs.")
    max_model_len: int = Field(ge=1, description="vLLM max_model_len.")
    max_num_batched_tokens: int = Field(ge=1, description="vLLM max_num_batched_tokens.")
    slice_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of the HAMi slice, for engines that run under HAMi's CUDA hook "
        "(it reports the slice as the card's total memory). None for whole cards and CPU.",
    )
    kv_cache_tokens: int = Field(
        default=0, ge=0, description="Tokens the planned KV cache holds (concurrency x len)."
    )


@dataclass(frozen=True)
class EngineLimits:
    """A model's batching and context limits with every unset spec field resolved."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    """What the KV cache must hold: ``concurrency`` sequences of ``max_model_len``."""


def vllm_default_batched_tokens(card_mib: int | None, card_name: str = "") -> int:
    """The ``max_num_batched_tokens`` vLLM's OpenAI server picks for a card when none is
    given (``EngineArgs.get_batch_defaults``, vLLM 0.32): 16384 from 160 GiB, 8192 from
    70 GiB except on an A100 (slower there, vLLM PR 17885), else 2048. ``card_mib``: the
    card's memory (nvidia-smi MiB; vLLM compares CUDA's total, 0.4 % less, which moves no
    catalogue card across a threshold); None for a CPU host or a card nobody knows, where
    vLLM (unable to read a device) also falls back to 2048.
    """
    if card_mib is None:
        return DEFAULT_BATCHED_TOKENS
    gib = card_mib / 1024
    if gib >= 160:
        return 16384
    if gib >= 70 and "a100" not in card_name.lower():
        return 8192
    return DEFAULT_BATCHED_TOKENS


def engine_limits(
    model: ModelSpec, *, context: int | None, batched_tokens: int | None = None
) -> EngineLimits:
    """Resolve ``model``'s limits.

    ``context``: the model config's default context (what vLLM uses when ``max_model_len``
    is unset; None when no config is readable). ``batched_tokens``: vLLM's default
    ``max_num_batched_tokens`` for the card (None: :data:`DEFAULT_BATCHED_TOKENS`).
    ``max_num_seqs`` defaults to ``concurrency``; batched tokens are never below it (vLLM
    refuses fewer batched tokens than sequences).
    """
    max_len = model.max_model_len or context or FALLBACK_MAX_MODEL_LEN
    seqs = model.max_num_seqs or model.concurrency
    tokens = model.max_num_batched_tokens or batched_tokens or DEFAULT_BATCHED_TOKENS
    return EngineLimits(
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(tokens, seqs),
        kv_cache_tokens=model.concurrency * max_len,
    )


__all__ = [
    "CPU_MAX_MEMORY_FRACTION",
    "DEFAULT_BATCHED_TOKENS",
    "FALLBACK_MAX_MODEL_LEN",
    "EngineLimits",
    "EngineSettings",
    "engine_limits",
    "vllm_default_batched_tokens",
]
