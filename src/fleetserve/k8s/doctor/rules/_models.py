"""Model facts for memory rules, from the planner's memory model (``fleetserve.plan.memory``).

What must stay true: only models in fleetserve's catalogue are sized (a manifest's model path
is never opened: it names a file on the cluster, not here); anything else - an unknown HF
id, a quantization the memory model does not know - gives None and the rules stay silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from fleetserve.engine.settings import DEFAULT_BATCHED_TOKENS
from fleetserve.errors import FleetServeError
from fleetserve.plan.catalogue import catalogue_entry
from fleetserve.plan.memory import (
    Dtype,
    KvDtype,
    Quantization,
    ReplicaMemory,
    estimate_replica,
    load_model_config,
)

_DTYPES = {"auto", "bfloat16", "float16", "float32"}
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
_QUANT = {
    "fp8": "fp8",
    "awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "gptq_marlin": "gptq",
}


@dataclass(frozen=True)
class ReplicaNeed:
    """Per-card memory one engine rank needs to start with one ``max_model_len`` sequence."""

    model: str
    max_model_len: int
    #: True when max_model_len is vLLM's default (the model's context), not written.
    default_len: bool
    ranks: int
    per_card: ReplicaMemory


def replica_need(engine: dict[str, Any], *, complete: bool = False) -> ReplicaNeed | None:
    """What a vLLM engine with these (written) arguments needs per card, or None if unknown.

    ``complete`` says the arguments are the engine's whole command line (Ray Serve LLM's
    ``engine_kwargs``, a ``vllm serve`` pod): an unset ``max_model_len`` is then vLLM's own
    default, the model's ``max_position_embeddings``. Otherwise the app's code may set it,
    and an unset value means "unknown".
    """
    model = engine.get("model")
    if not isinstance(model, str) or catalogue_entry(model) is None:
        return None
    mml = engine.get("max_model_len")
    if mml is None and complete:
        try:
            mml = load_model_config(model).max_position_embeddings
        except FleetServeError:
            return None
    if not isinstance(mml, int) or mml <= 0:
        return None
    dtype = str(engine.get("dtype", "auto")).lower()
    dtype = _DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in _DTYPES:
        return None
    quant_raw = engine.get("quantization")
    quant = None if quant_raw in (None, "", "none") else _QUANT.get(str(quant_raw).lower())
    if quant_raw not in (None, "", "none") and quant is None:
        return None
    kv_dtype = str(engine.get("kv_cache_dtype", "auto")).lower()
    kv_dtype = "fp8" if kv_dtype.startswith("fp8") else kv_dtype
    if kv_dtype not in ("auto", "fp8"):
        return None
    tp = int(engine.get("tensor_parallel_size") or 1)
    pp = int(engine.get("pipeline_parallel_size") or 1)
    seqs = engine.get("max_num_seqs")
    mnbt = engine.get("max_num_batched_tokens")
    try:
        config = load_model_config(model)
        per_card = estimate_replica(
            config,
            max_model_len=mml,
            concurrency=1,
            max_num_seqs=int(seqs) if isinstance(seqs, int) else None,
            # vLLM's smallest default token budget (bigger cards default higher); the
            # activation term grows with it, so this is the optimistic side.
            max_num_batched_tokens=int(mnbt) if isinstance(mnbt, int) else DEFAULT_BATCHED_TOKENS,
            dtype=cast(Dtype, dtype),
            quantization=cast(Quantization, quant),
            kv_cache_dtype=cast(KvDtype, kv_dtype),
            tensor_parallel=tp,
            pipeline_parallel=pp,
            enforce_eager=engine.get("enforce_eager") is True,
        )
    except (FleetServeError, KeyError, ValueError, ZeroDivisionError):
        return None
    return ReplicaNeed(
        model=model,
        max_model_len=mml,
        default_len="max_model_len" not in engine,
        ranks=tp * pp,
        per_card=per_card,
    )


def gib(x: float) -> str:
    """Bytes as ``12.34 GiB``."""
    return f"{x / 2**30:.2f} GiB"
