"""What a model is: the architecture facts of a HF ``config.json``, read per family.

Design note. The memory model needs, per layer, which parameters exist and what one token
leaves in the KV cache. Families differ in exactly those places, so each understood
``model_type`` has a reader that turns its config keys into one :class:`ModelConfig`:

* dense / GQA (Llama, Mistral, Qwen2/3, Phi-3/4, Gemma 1-3): attention with ``kv_heads``
  K and V heads per layer, a gated MLP, optional q/k/v(/o) biases and q/k norms;
* MoE (Mixtral ``num_local_experts``; Qwen2/3-MoE ``num_experts`` with shared experts,
  ``decoder_sparse_step``/``mlp_only_layers``; DeepSeek ``n_routed_experts`` +
  ``n_shared_experts`` x ``moe_intermediate_size`` after ``first_k_dense_replace`` dense
  layers; Llama 4 one shared expert and ``interleave_moe_layer_step``; gpt-oss with router
  and expert biases): every expert counts for memory, ``experts_per_token`` for compute;
* MLA (DeepSeek-V2/V3): low-rank q/kv projections, and ONE latent of ``kv_lora_rank +
  qk_rope_head_dim`` per token per layer in the KV cache (no K/V per head; vLLM keeps the
  whole latent on every tensor-parallel rank);
* hybrid attention: sliding-window layers (Gemma 2 every other layer, Gemma 3 five of six,
  gpt-oss ``layer_types``, Mistral v0.1 all) and Llama 4's chunked local attention (three
  of four layers, ``attention_chunk_size``) keep a bounded number of tokens;
* tied heads (``tie_word_embeddings``; the Gemma family ties by default), vision towers
  (Gemma 3's SigLIP, Llama 4's ViT + pixel-shuffle adapter);
* checkpoint quantization: a ``quantization_config`` (AWQ, GPTQ, compressed-tensors,
  fp8, bitsandbytes, MXFP4) becomes a :class:`CheckpointQuant` - scheme, weight bits,
  group size with the bytes of its scale and zero point as the format stores them, and the
  modules its ``ignore`` / ``modules_to_not_convert`` list keeps in the model dtype - so a
  quantized checkpoint is sized by its real bytes with no spec field.

Anything else is refused with the keys that were not understood (a guessed dense model is
how DeepSeek-V2-Lite was once planned as 2.7B parameters instead of 15.7B). Every value is
type-checked: a config.json with ``"num_local_experts": "eight"`` is a SpecError naming the
key, never a traceback. Parameter counts equal the transformers model built from the same
config on the meta device (tests/unit/plan/test_architectures.py).

``max_model_len_limit`` is vLLM's own rule (``vllm/config/model.py::_get_and_verify_max_len``):
the smallest of the length keys, times the RoPE scaling factor except for the rope types
that already state the scaled length (llama3, yarn, longrope, ...) and Gemma 3.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetserve.errors import SpecError
from fleetserve.plan.catalogue import MODEL_CATALOGUE, catalogue_entry, catalogue_sampling
from fleetserve.sampling import sampling_params

# --------------------------------------------------------------------------- the facts

#: Quantization schemes a checkpoint's ``quantization_config.quant_method`` may name (vLLM's
#: method names; ``awq_marlin``/``gptq_marlin`` are how vLLM re-tags the same files).
QuantScheme = Literal["fp8", "mxfp4", "awq", "gptq", "compressed-tensors", "bitsandbytes"]
_SCHEME_ALIASES: dict[str, QuantScheme] = {
    "fp8": "fp8",
    "mxfp4": "mxfp4",
    "awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "gptq_marlin": "gptq",
    "compressed-tensors": "compressed-tensors",
    "compressed_tensors": "compressed-tensors",
    "bitsandbytes": "bitsandbytes",
}
#: Modules vLLM's quantized linear methods never touch: the embeddings, LM head, norms,
#: MoE routers and vision towers, which the memory model already counts in the model dtype.
#: An ``ignore`` entry naming one of these changes nothing.
_ALWAYS_UNQUANTIZED = ("lm_head", "embed", "norm", "router", "vision", "visual", "multi_modal")
_ATTN_MODULES = ("self_attn", "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "attn")
#: Module names of a decoder layer's MLP across families (Llama 4 ``feed_forward``, Mixtral
#: ``block_sparse_moe``, Qwen MoE ``shared_expert``).
_MLP_MODULES = (
    "mlp",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate_up_proj",
    "experts",
    "shared_expert",
    "feed_forward",
    "block_sparse_moe",
)


@dataclass(frozen=True)
class CheckpointQuant:
    """How a checkpoint stores its decoder linear layers (``quantization_config``).

    Weight bytes of a quantized linear layer: ``bits / 8`` per weight plus, per group of
    ``group_size`` weights, one scale of ``scale_bytes`` and a zero point of ``zero_bits``
    (``group_size`` 0: per-channel or per-tensor scales, under 0.1 % of the weights, not
    counted).
    """

    scheme: QuantScheme
    bits: int
    group_size: int = 0
    scale_bytes: float = 0
    """Bytes of one group's scale (bitsandbytes double quantization: an 8-bit absmax plus
    an fp32 per 256 of them, 1 + 4/256)."""
    zero_bits: int = 0
    kind: str = ""
    """The scheme's variant, for messages and vLLM's per-variant rules (``W4A16``,
    ``nf4``, ``block``; "" when the scheme has one)."""
    experts_only: bool = False
    """Only the routed experts are quantized (gpt-oss MXFP4)."""
    unquantized: tuple[str, ...] = ()
    """Modules the config keeps in the model dtype (``ignore``, ``modules_to_not_convert``)."""
    attention_unquantized: float = 0.0
    """Share of the decoder layers whose attention stays in the model dtype (from
    ``unquantized``)."""
    mlp_unquantized: float = 0.0
    """Share of the decoder layers whose MLP stays in the model dtype."""

    @property
    def label(self) -> str:
        """The scheme as messages name it (``compressed-tensors W4A16``)."""
        return f"{self.scheme} {self.kind}" if self.kind else self.scheme

    def linear_bytes(self, params: int) -> int:
        """Bytes of ``params`` quantized weights with their scales and zero points."""
        data = math.ceil(params * self.bits / 8)
        if not self.group_size:
            return data
        groups = math.ceil(params / self.group_size)
        return data + math.ceil(groups * (self.scale_bytes + self.zero_bits / 8))


#: AWQ/GPTQ as the spec's ``quantization`` field sizes them when the config does not say:
#: 4-bit weights, an fp16 scale and a 4-bit zero point per group of 128 (AutoAWQ's and
#: AutoGPTQ's defaults), and fp8 at one byte per weight.
QUANT_GROUP = 128
SPEC_QUANT: dict[str, CheckpointQuant] = {
    "fp8": CheckpointQuant("fp8", 8),
    "awq": CheckpointQuant("awq", 4, QUANT_GROUP, 2, 4),
    "gptq": CheckpointQuant("gptq", 4, QUANT_GROUP, 2, 4),
}


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts of a decoder LLM (from a HF config.json)."""

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    """K/V heads per layer (MLA: 1, the shared latent)."""
    head_dim: int
    """Query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    v_head_dim: int
    intermediate_size: int
    """Gated MLP width of the dense layers."""
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    num_experts: int
    """Routed experts per MoE layer (0: dense MLP)."""
    experts_per_token: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    """Total width of the always-on shared expert(s) of a MoE layer (0: none)."""
    moe_layers: int
    """How many layers are MoE (the others are dense)."""
    router_bias: bool
    expert_bias: bool
    shared_expert_gate: bool
    score_correction_bias: bool
    q_lora_rank: int
    """MLA: rank of the query down-projection (0: a plain q projection)."""
    kv_lora_rank: int
    """MLA: the latent's width (0: not MLA)."""
    qk_rope_head_dim: int
    sliding_window: int | None
    """Window of the sliding-window layers (None: no such layers)."""
    sliding_layers: int
    chunk_size: int | None
    """Llama 4 chunked local attention: tokens per chunk (None: no such layers)."""
    chunked_layers: int
    max_position_embeddings: int
    """What vLLM derives as the longest allowed context (see :attr:`max_model_len_limit`)."""
    max_len_key: str
    """The config key that limit comes from (for messages)."""
    default_max_model_len: int
    """vLLM's max_model_len when none is given (longrope: the original length)."""
    rope_scaling: str | None
    """RoPE scaling type, for messages (None: none)."""
    torch_dtype: str
    norms_per_layer: int
    qk_norm: bool
    attention_sinks: bool
    extra_params: int
    """Parameters outside the decoder (vision tower + projector), kept unquantized."""
    checkpoint_quant: CheckpointQuant | None = None
    """How the checkpoint ships quantized (its ``quantization_config``; None: it does not)."""
    rope_cache_values: int = 0
    """Entries of vLLM's RoPE cos/sin caches (positions x rotary dim, summed over the
    distinct RoPEs: Gemma 3 has one for its local layers and one for its global ones).
    vLLM allocates them at load in the model dtype and counts them as weights."""
    sampling: tuple[tuple[str, float], ...] = ()
    """The request defaults the model's generation_config.json sets that vLLM applies to
    requests which set none (:data:`fleetserve.sampling.GENERATION_KEYS`; the file beside
    a config.json, the catalogue's for a catalogue entry; empty: none known). Not
    architecture, but read with it: the performance model prices a top-p sort by them
    (:mod:`fleetserve.sampling`)."""

    @property
    def use_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def max_model_len_limit(self) -> int:
        """The longest ``max_model_len`` vLLM starts with (alias of max_position_embeddings)."""
        return self.max_position_embeddings

    @property
    def full_layers(self) -> int:
        """Layers that attend over the whole context."""
        return self.num_layers - self.sliding_layers - self.chunked_layers

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    # ---- parameter counts

    def embedding_params(self) -> int:
        """Input embeddings plus an untied LM head."""
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    def attention_linear_params(self) -> int:
        """Weight matrices of one layer's attention."""
        h = self.hidden_size
        if self.use_mla:
            heads, qk, rope = self.num_heads, self.head_dim, self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * heads * qk
            else:
                q = h * heads * qk
            kv_a = h * (self.kv_lora_rank + rope)
            kv_b = self.kv_lora_rank * heads * (qk - rope + self.v_head_dim)
            return q + kv_a + kv_b + heads * self.v_head_dim * h
        q = self.num_heads * self.head_dim
        k = self.num_kv_heads * self.head_dim
        v = self.num_kv_heads * self.v_head_dim
        return h * (q + k + v) + self.num_heads * self.v_head_dim * h

    def mlp_linear_params(self, moe: bool) -> int:
        """Weight matrices of one layer's MLP (dense, or all experts + shared)."""
        h = self.hidden_size
        if not moe:
            return 3 * h * self.intermediate_size  # gate, up, down
        return (
            self.num_experts * 3 * h * self.moe_intermediate_size
            + 3 * h * self.shared_expert_intermediate_size
        )

    def expert_params(self) -> int:
        """Routed-expert weights of the whole model (what MXFP4 checkpoints quantize)."""
        return (
            self.moe_layers * self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size
        )

    def linear_params(self) -> int:
        """Parameters in the decoder's linear layers (what quantization shrinks)."""
        attn = self.num_layers * self.attention_linear_params()
        mlp = self.dense_layers * self.mlp_linear_params(False)
        mlp += self.moe_layers * self.mlp_linear_params(True)
        return attn + mlp

    def layer_small_params(self, moe: bool) -> int:
        """Norms, biases, routers and sinks of one layer (never quantized)."""
        h = self.hidden_size
        n = self.norms_per_layer * h
        if self.use_mla:
            n += self.kv_lora_rank + self.q_lora_rank  # kv_a / q_a layernorms
        else:
            if self.qkv_bias:
                n += (self.num_heads + self.num_kv_heads) * self.head_dim
                n += self.num_kv_heads * self.v_head_dim
            if self.qk_norm:
                n += 2 * self.head_dim
        if self.o_bias:
            n += h
        if self.attention_sinks:
            n += self.num_heads
        if moe:
            e = self.num_experts
            n += h * e + (e if self.router_bias else 0)
            if self.expert_bias:
                n += e * (2 * self.moe_intermediate_size + h)
            if self.shared_expert_gate:
                n += h
            if self.score_correction_bias:
                n += e
        return n

    def small_params(self) -> int:
        """Norms, biases, routers of every layer plus the final norm."""
        return (
            self.dense_layers * self.layer_small_params(False)
            + self.moe_layers * self.layer_small_params(True)
            + self.hidden_size
        )

    def num_params(self) -> int:
        """All parameters (the published model size)."""
        return (
            self.embedding_params() + self.linear_params() + self.small_params() + self.extra_params
        )

    def active_params(self) -> int:
        """Parameters used per token (MoE: only ``experts_per_token`` routed experts)."""
        if not self.num_experts:
            return self.num_params()
        unused = (self.num_experts - self.experts_per_token) * (
            3 * self.hidden_size * self.moe_intermediate_size
        )
        return self.num_params() - self.moe_layers * unused

    # ---- KV cache

    def kv_elements_per_token_layer(self, tensor_parallel: int = 1) -> int:
        """Elements one token leaves in one attention layer's cache, on one card.

        MLA: the latent (``kv_lora_rank + qk_rope_head_dim``), whole on every rank. Else K
        and V of the card's KV heads: split across tensor-parallel ranks, one replicated
        head per rank when there are fewer KV heads than ranks (vLLM's QKVParallelLinear).
        """
        if self.use_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        heads = max(1, self.num_kv_heads // max(1, tensor_parallel))
        return heads * (self.head_dim + self.v_head_dim)


# --------------------------------------------------------------------------- reading


#: Bounds on any integer a config.json gives (no real model comes near them): the layer
#: count drives per-layer loops, the rest products that must stay finite floats.
_MAX_INT = 2**31
_MAX_LAYERS = 10_000
_MAX_ROPE_FACTOR = 1024.0


class _Reader:
    """Typed access to one config dict; every bad value is a SpecError naming its key."""

    def __init__(self, cfg: dict[str, Any], source: str, prefix: str = "") -> None:
        self.cfg = cfg
        self.source = source
        self.prefix = prefix

    def _where(self, key: str) -> str:
        return f"{self.source}: config.json '{self.prefix}{key}'"

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 0, maximum: int = _MAX_INT
    ) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise SpecError(f"{self.source}: config.json has no '{self.prefix}{key}'")
            return default
        if isinstance(value, float) and value.is_integer() and abs(value) <= maximum:
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError(f"{self._where(key)} must be an integer, got {value!r}")
        if not minimum <= value <= maximum:
            raise SpecError(
                f"{self._where(key)} must be between {minimum} and {maximum}, got {value}"
            )
        return value

    def opt_integer(self, key: str, *, minimum: int = 0) -> int | None:
        return self.integer(key, minimum=minimum) if self.has(key) else None

    def number(self, key: str) -> float | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise SpecError(f"{self._where(key)} must be a positive number, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(f"{self._where(key)} must be true or false, got {value!r}")
        return value

    def text(self, key: str, default: str = "") -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise SpecError(f"{self._where(key)} must be a string, got {value!r}")
        return value

    def items(self, key: str) -> list[Any] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise SpecError(f"{self._where(key)} must be a list, got {type(value).__name__}")
        return value

    def integers(self, key: str) -> list[int] | None:
        value = self.items(key)
        if value is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise SpecError(f"{self._where(key)} must be a list of integers")
        return value

    def obj(self, key: str) -> dict[str, Any] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise SpecError(f"{self._where(key)} must be an object, got {type(value).__name__}")
        return value


#: architectures[0] -> model_type, for configs that only name the class.
_ARCH_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4_text",
    "GptOssForCausalLM": "gpt_oss",
}
_DENSE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"}
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "llama4_text", "gpt_oss"}
_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
#: Keys whose presence means a structure the dense readers do not model.
_FOREIGN_KEYS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "kv_lora_rank",
    "attention_chunk_size",
    "layers_block_type",
    "hybrid_override_pattern",
    "ssm_cfg",
    "mamba_d_state",
    "linear_attn_config",
)
#: Length keys vLLM reads, smallest wins (vllm ModelArchConfigConvertor.derive_max_model_len).
_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
#: RoPE types whose max_position_embeddings already is the scaled length (vLLM skips factor).
_ROPE_PRESCALED = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
#: vLLM's assumed length when a config names none.
_DEFAULT_LEN = 2048

UNDERSTOOD_TYPES = tuple(sorted(_DENSE | _MOE | set(_WRAPPERS)))


def _model_type(raw: dict[str, Any], name: str) -> str:
    r = _Reader(raw, name)
    model_type = r.text("model_type")
    if not model_type:
        archs = r.items("architectures") or []
        for arch in archs:
            if isinstance(arch, str) and arch in _ARCH_TYPES:
                return _ARCH_TYPES[arch]
        if archs:
            raise SpecError(
                f"{name}: config.json architectures {archs} are not a family the memory "
                "model understands",
                hint=f"understood model_type values: {', '.join(UNDERSTOOD_TYPES)}; or "
                "name a catalogue entry in 'config'",
            )
        raise SpecError(
            f"{name}: config.json has neither 'model_type' nor 'architectures'",
            hint="point 'config' at the model's own config.json or a catalogue entry",
        )
    return model_type


def _unknown(name: str, what: str) -> SpecError:
    return SpecError(
        f"{name}: {what}: not a family the memory model understands, so its memory "
        "cannot be estimated (refused rather than guessed as a dense model)",
        hint=f"understood model_type values: {', '.join(UNDERSTOOD_TYPES)}; or name a "
        "catalogue entry in 'config'",
    )


def _rope(r: _Reader) -> list[dict[str, Any]]:
    params = r.obj("rope_parameters") or r.obj("rope_scaling")
    if not params:
        return []
    if all(isinstance(v, dict) for v in params.values()):  # per layer type
        return [v for v in params.values() if v]
    return [params]


def _max_len(r: _Reader, model_type: str) -> tuple[int, str, int, str | None]:
    """(limit, key, default, rope type) as vLLM derives them."""
    limit: float = math.inf  # int once a key is found
    key = ""
    for k in _LEN_KEYS:
        if r.has(k):
            value = r.integer(k, minimum=1)
            if value < limit:
                limit, key = value, k
    if r.has("model_max_length"):  # Command-R style override, as vLLM does
        limit, key = r.integer("model_max_length", minimum=1), "model_max_length"
    if limit == math.inf:
        limit, key = _DEFAULT_LEN, "(none: vLLM assumes 2048)"
    rope_type: str | None = None
    rope = _rope(r)
    if rope and "gemma3" not in model_type:
        factor = 1.0
        for rp in rope:
            kind = rp.get("rope_type") or rp.get("type") or "default"
            if not isinstance(kind, str):
                raise SpecError(f"{r.source}: config.json rope type must be a string")
            if kind != "default":
                rope_type = kind
            if kind not in _ROPE_PRESCALED:
                given = rp.get("factor", factor)
                if given is None:  # vLLM falls back to 1.0 for a null factor
                    given = 1.0
                if (
                    not isinstance(given, (int, float))
                    or isinstance(given, bool)
                    or not 0 < given <= _MAX_ROPE_FACTOR
                ):
                    raise SpecError(
                        f"{r.source}: config.json rope scaling 'factor' must be a positive "
                        f"number, got {given!r}"
                    )
                factor = float(given)
        if factor != 1.0:
            limit = float(limit) * factor
            key = f"{key} x rope factor {factor:g}"
    default = int(limit)
    if any((rp.get("rope_type") or rp.get("type")) == "longrope" for rp in rope):
        default = r.integer("original_max_position_embeddings", int(limit), minimum=1)
    return int(limit), key, default, rope_type


def _rotary_dim(r: _Reader, head_dim: int) -> int:
    partial = r.cfg.get("partial_rotary_factor", 1.0)
    if not isinstance(partial, (int, float)) or isinstance(partial, bool) or not 0 < partial <= 1:
        partial = 1.0
    return int(head_dim * partial)


def _rope_cache_values(r: _Reader, rotary_dim: int) -> int:
    """Entries of vLLM's cos/sin caches: one cache per distinct RoPE of ``max_position
    _embeddings`` positions x ``rotary_dim``, linear scaling multiplying the positions by
    its factor (vLLM's LinearScalingRotaryEmbedding: Gemma 3 4B+ cache 8 x 131,072
    positions on their global layers, 0.5 GiB that vLLM 0.26 logged as weights). Other
    scaling types are counted at the unscaled length (an approximation)."""
    positions = r.integer("max_position_embeddings", _DEFAULT_LEN, minimum=1)
    ropes = _rope(r) or [{}]
    total = 0
    for rp in ropes:
        kind = rp.get("rope_type") or rp.get("type") or "default"
        factor = rp.get("factor") if kind == "linear" else 1
        scale = float(factor) if isinstance(factor, (int, float)) and factor > 0 else 1.0
        total += int(positions * scale) * rotary_dim
    return total


def _layer_window(
    r: _Reader, layers: int, *, every_other: bool = False, pattern_default: int | None = None
) -> tuple[int | None, int]:
    """(window, sliding layer count) from sliding_window + layer_types / pattern."""
    window = r.opt_integer("sliding_window", minimum=0)
    if r.cfg.get("use_sliding_window") is False or not window:
        return None, 0
    types = r.items("layer_types")
    if types is not None:
        if len(types) != layers:
            raise SpecError(
                f"{r.source}: config.json 'layer_types' has {len(types)} entries for "
                f"{layers} layers"
            )
        odd = {t for t in types if t not in ("sliding_attention", "full_attention")}
        if odd:
            raise _unknown(r.source, f"layer_types {sorted(map(str, odd))}")
        sliding = sum(1 for t in types if t == "sliding_attention")
    elif every_other:
        sliding = (layers + 1) // 2  # layers 0, 2, 4, ... slide (Gemma 2)
    else:
        pattern = r.opt_integer("sliding_window_pattern", minimum=1) or pattern_default
        sliding = layers - layers // pattern if pattern else layers
    return (window, sliding) if sliding else (None, 0)


def _dtype(r: _Reader, outer: _Reader | None) -> str:
    for reader in (r, outer):
        if reader is None:
            continue
        for key in ("torch_dtype", "dtype"):
            value = reader.cfg.get(key)
            if isinstance(value, str):
                return value
    return "bfloat16"


def _unquantized_shares(source: str, names: list[str], layers: int) -> tuple[float, float]:
    """Shares of layers whose attention / MLP an ignore list keeps in the model dtype.

    An entry without a layer index (``re:.*self_attn.*``) covers every layer, one with
    ``layers.N.`` that layer; entries naming the modules that are never quantized anyway
    (lm_head, embeddings, norms, routers, vision) change nothing. An entry naming one
    projection keeps that layer's whole attention or MLP in the model dtype: an
    over-estimate of a few projections' bytes, which can only make a slice larger, never
    an engine OOM.
    """
    attn: set[int] = set()
    mlp: set[int] = set()
    for name in names:
        low = name.lower()
        # MoE routers (mlp.gate, shared_expert_gate) are small parameters already
        if any(k in low for k in _ALWAYS_UNQUANTIZED) or low.rstrip("$").endswith("gate"):
            continue
        found = re.search(r"layers\.(\d+)\.", low)
        which = {int(found.group(1))} if found else set(range(layers))
        if any(k in low for k in _ATTN_MODULES):
            attn |= which
        elif any(k in low for k in _MLP_MODULES):
            mlp |= which
        elif found:
            attn |= which
            mlp |= which
        else:
            raise SpecError(
                f"{source}: config.json quantization_config ignores {name!r}, a module the "
                "memory model cannot place (name a projection, self_attn, mlp or lm_head)"
            )
    in_range = range(layers)
    return (
        len([i for i in attn if i in in_range]) / layers,
        len([i for i in mlp if i in in_range]) / layers,
    )


def _names(q: _Reader, key: str) -> list[str]:
    value = q.items(key) or []
    if not all(isinstance(v, str) for v in value):
        raise SpecError(f"{q._where(key)} must be a list of module names")
    return list(value)


def _compressed_tensors(q: _Reader) -> CheckpointQuant:
    """compressed-tensors: one ``config_groups`` entry's ``weights`` for the linear layers
    (``pack-quantized`` int4/int8 in int32 words, ``float-quantized`` fp8,
    ``naive-quantized`` int8; group scales in the model dtype as llm-compressor writes
    them, a zero point per group only when asymmetric)."""
    groups = q.obj("config_groups")
    if not groups:
        raise SpecError(f"{q._where('config_groups')} must name at least one group")
    kinds: set[tuple[int, str, int | None, bool, int, str]] = set()
    for gname, group in groups.items():
        if not isinstance(group, dict):
            raise SpecError(f"{q._where('config_groups.' + gname)} must be an object")
        g = _Reader(group, q.source, f"{q.prefix}config_groups.{gname}.")
        w = g.obj("weights")
        if w is None:
            raise SpecError(f"{q.source}: config.json has no '{g.prefix}weights'")
        wr = _Reader(w, q.source, f"{g.prefix}weights.")
        bits = wr.integer("num_bits", minimum=1, maximum=16)
        wtype = wr.text("type", "int")
        strategy = wr.text("strategy", "tensor")
        size = wr.opt_integer("group_size", minimum=1) if strategy == "group" else None
        if strategy == "block":
            block = wr.integers("block_structure") or [128, 128]
            if min(block) < 1:
                raise SpecError(f"{wr._where('block_structure')} must be positive, got {block}")
            size = math.prod(block)
        symmetric = wr.flag("symmetric", True)
        a = g.obj("input_activations")
        ar = _Reader(a or {}, q.source, f"{g.prefix}input_activations.")
        act_bits = ar.integer("num_bits", 16, minimum=1, maximum=16)
        kinds.add((bits, wtype, size, symmetric, act_bits, strategy))
    if len(kinds) > 1:
        raise SpecError(
            f"{q._where('config_groups')}: groups quantize weights differently "
            f"({sorted(map(str, kinds))}); one scheme per checkpoint is understood"
        )
    bits, wtype, size, symmetric, act_bits, strategy = kinds.pop()
    fmt = q.text("format", "")
    return CheckpointQuant(
        "compressed-tensors",
        bits,
        size or 0,
        # block scales fp32; group scales bf16/fp16, the weights' dtype as llm-compressor
        # saves them
        (4 if strategy == "block" else 2) if size else 0,
        0 if symmetric or not size else 8 if fmt == "naive-quantized" else bits,
        kind=f"W{bits}A{act_bits}" + (f"-FP{bits}" if wtype == "float" else ""),
    )


def _parse_quant(q: _Reader, method: str) -> CheckpointQuant:
    scheme = _SCHEME_ALIASES[method]
    if scheme == "mxfp4":
        # 4-bit values plus one 8-bit (e8m0) scale per 32 (the OCP MX format)
        return CheckpointQuant("mxfp4", 4, 32, 1, experts_only=True)
    if scheme == "fp8":
        block = q.integers("weight_block_size")
        if block and min(block) < 1:
            raise SpecError(f"{q._where('weight_block_size')} must be positive, got {block}")
        if block:  # DeepSeek-V3: an fp32 scale per 128 x 128 block
            return CheckpointQuant("fp8", 8, math.prod(block), 4, kind="block")
        return CheckpointQuant("fp8", 8)
    if scheme in ("awq", "gptq"):
        bits = q.integer("bits", 4, minimum=2, maximum=8)
        size = q.integer("group_size", QUANT_GROUP, minimum=-1)
        if size in (0, -1):  # -1: one group per input row (a per-channel scale)
            size = 0
        # AWQ stores zeros only with zero_point (GEMM: always); GPTQ always packs qzeros
        zeros = bits if scheme == "gptq" or q.flag("zero_point", True) else 0
        kind = "desc_act" if scheme == "gptq" and q.flag("desc_act", False) else ""
        return CheckpointQuant(scheme, bits, size, 2 if size else 0, zeros if size else 0, kind)
    if scheme == "compressed-tensors":
        return _compressed_tensors(q)
    # bitsandbytes: 4-bit (nf4/fp4) with an fp32 absmax per 64 weights - or, with double
    # quantization, an 8-bit absmax plus an fp32 per 256 of those; 8-bit LLM.int8 with
    # per-row scales
    if q.flag("load_in_8bit", False):
        return CheckpointQuant("bitsandbytes", 8, kind="int8")
    if not q.flag("load_in_4bit", False):
        raise SpecError(
            f"{q._where('load_in_4bit')}: a bitsandbytes config must set load_in_4bit or "
            "load_in_8bit"
        )
    kind = q.text("bnb_4bit_quant_type", "fp4")
    if q.flag("bnb_4bit_use_double_quant", False):
        return CheckpointQuant("bitsandbytes", 4, 64, 1 + 4 / 256, 0, kind=kind)
    return CheckpointQuant("bitsandbytes", 4, 64, 4, 0, kind=kind)


def _checkpoint_quant(r: _Reader, outer: _Reader | None, layers: int) -> CheckpointQuant | None:
    for reader in (outer, r):
        if reader is None:
            continue
        raw = reader.obj("quantization_config")
        if raw is None:
            continue
        q = _Reader(raw, r.source, f"{reader.prefix}quantization_config.")
        method = q.text("quant_method", "")
        if method not in _SCHEME_ALIASES:
            raise SpecError(
                f"{q._where('quant_method')} {method!r} is not understood (understood: "
                f"{', '.join(sorted(set(_SCHEME_ALIASES.values())))})"
            )
        ignored = [
            *_names(q, "ignore"),
            *_names(q, "modules_to_not_convert"),
            *_names(q, "llm_int8_skip_modules"),
        ]
        quant = _parse_quant(q, method)
        attn, mlp = _unquantized_shares(r.source, ignored, layers)
        return dataclasses.replace(
            quant,
            unquantized=tuple(ignored),
            attention_unquantized=attn,
            mlp_unquantized=mlp,
        )
    return None


def _vision_siglip(vision: _Reader, text_hidden: int) -> int:
    """Gemma 3's SigLIP encoder plus its projector (norm + linear into the text model)."""
    vh = vision.integer("hidden_size", minimum=1)
    vi = vision.integer("intermediate_size", 4 * vh)
    layers = vision.integer("num_hidden_layers", maximum=_MAX_LAYERS)
    patch = vision.integer("patch_size", 14, minimum=1)
    image = vision.integer("image_size", 224, minimum=1)
    channels = vision.integer("num_channels", 3)
    per_layer = 4 * vh * vh + 4 * vh + 2 * vh * vi + vi + vh + 4 * vh
    embeddings = channels * patch * patch * vh + vh + (image // patch) ** 2 * vh
    projector = vh * text_hidden + vh
    head = 0
    if vision.flag("vision_use_head", True) and vision.text("model_type") == "siglip_vision_model":
        # SigLIP's attention-pooling head: probe, MHA (in/out proj), layernorm, MLP
        head = vh + 3 * vh * vh + 3 * vh + vh * vh + vh + 2 * vh + 2 * vh * vi + vi + vh
    return layers * per_layer + embeddings + 2 * vh + projector + head


def _vision_llama4(vision: _Reader, text_hidden: int) -> int:
    """Llama 4's ViT (biased attention/MLP, class + position embeddings), its pixel-shuffle
    MLP adapter and the linear projector into the text model."""
    vh = vision.integer("hidden_size", minimum=1)
    vi = vision.integer("intermediate_size", minimum=1)
    layers = vision.integer("num_hidden_layers", maximum=_MAX_LAYERS)
    patch = vision.integer("patch_size", minimum=1)
    image = vision.integer("image_size", minimum=1)
    channels = vision.integer("num_channels", 3)
    proj_in = vision.integer("projector_input_dim", minimum=1)
    proj_out = vision.integer("projector_output_dim", minimum=1)
    out = vision.integer("vision_output_dim", minimum=1)
    per_layer = 4 * (vh * vh + vh) + (vh * vi + vi) + (vi * vh + vh) + 4 * vh
    embeddings = channels * patch * patch * vh + vh + ((image // patch) ** 2 + 1) * vh
    norms = 4 * vh  # pre and post layernorms (weight + bias)
    adapter = vi * proj_in + proj_out * proj_out
    projector = out * text_hidden
    return layers * per_layer + embeddings + norms + adapter + projector


def parse_config(raw: Any, name: str = "<config>") -> ModelConfig:
    """A :class:`ModelConfig` from a HF config.json dict (SpecError naming the key if bad)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{name}: config.json must be a JSON object")
    model_type = _model_type(raw, name)
    outer: _Reader | None = None
    extra = 0
    cfg = raw
    if model_type in _WRAPPERS:
        outer = _Reader(raw, name)
        text = outer.obj("text_config")
        if text is None:
            raise SpecError(f"{name}: config.json of a '{model_type}' model has no 'text_config'")
        cfg = dict(text)
        cfg.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings"))
        model_type = _WRAPPERS[model_type]
    elif _Reader(raw, name).has("text_config"):
        raise _unknown(name, f"model_type '{model_type}' with a text_config")
    if model_type not in _DENSE and model_type not in _MOE:
        raise _unknown(name, f"model_type '{model_type}'")
    prefix = "text_config." if outer is not None else ""
    r = _Reader(cfg, name, prefix)
    if model_type in _DENSE:
        foreign = [k for k in _FOREIGN_KEYS if r.has(k) and r.cfg.get(k) not in (0, False)]
        if foreign:
            raise _unknown(name, f"a '{model_type}' config with {', '.join(foreign)}")

    hidden = r.integer("hidden_size", minimum=1)
    heads = r.integer("num_attention_heads", minimum=1)
    layers = r.integer("num_hidden_layers", minimum=1, maximum=_MAX_LAYERS)
    vocab = r.integer("vocab_size", minimum=1)
    kv_heads = r.integer("num_key_value_heads", heads, minimum=1)
    gemma = model_type.startswith("gemma")
    head_default = 256 if gemma else (128 if model_type == "qwen3" else hidden // heads)
    if head_default == 0 and not r.has("head_dim"):
        raise SpecError(f"{name}: config.json hidden_size {hidden} < {heads} attention heads")
    head_dim = r.integer("head_dim", head_default, minimum=1)
    if model_type not in ("deepseek_v2", "deepseek_v3") and heads % kv_heads:
        raise SpecError(
            f"{name}: config.json num_attention_heads ({heads}) is not a multiple of "
            f"num_key_value_heads ({kv_heads})"
        )
    limit, len_key, default_len, rope_type = _max_len(r, model_type)

    fields: dict[str, Any] = {
        "name": name,
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "v_head_dim": head_dim,
        "intermediate_size": r.integer("intermediate_size", 4 * hidden, minimum=1),
        "tie_word_embeddings": r.flag("tie_word_embeddings", gemma),
        "qkv_bias": r.flag("attention_bias", model_type in ("qwen2", "qwen2_moe", "gpt_oss")),
        "o_bias": False,
        "num_experts": 0,
        "experts_per_token": 0,
        "moe_intermediate_size": 0,
        "shared_expert_intermediate_size": 0,
        "moe_layers": 0,
        "router_bias": False,
        "expert_bias": False,
        "shared_expert_gate": False,
        "score_correction_bias": False,
        "q_lora_rank": 0,
        "kv_lora_rank": 0,
        "qk_rope_head_dim": 0,
        "sliding_window": None,
        "sliding_layers": 0,
        "chunk_size": None,
        "chunked_layers": 0,
        "max_position_embeddings": limit,
        "max_len_key": len_key,
        "default_max_model_len": default_len,
        "rope_scaling": rope_type,
        "torch_dtype": _dtype(r, outer),
        "norms_per_layer": 4 if model_type in ("gemma2", "gemma3_text") else 2,
        "qk_norm": model_type in ("gemma3_text", "qwen3", "qwen3_moe"),
        "attention_sinks": False,
        "extra_params": 0,
        "checkpoint_quant": _checkpoint_quant(r, outer, layers),
        "rope_cache_values": _rope_cache_values(r, _rotary_dim(r, head_dim)),
    }
    # Llama's attention_bias biases o_proj too; Qwen2's only q/k/v
    fields["o_bias"] = fields["qkv_bias"] and model_type in ("llama", "mistral", "gpt_oss")

    if model_type in ("mistral", "mixtral", "phi3", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not r.flag(
            "use_sliding_window", False
        ):
            pass  # Qwen configs carry a sliding_window that is off
        else:
            fields["sliding_window"], fields["sliding_layers"] = _layer_window(r, layers)
    elif model_type == "gemma2":
        fields["sliding_window"], fields["sliding_layers"] = _layer_window(
            r, layers, every_other=True
        )
    elif model_type == "gemma3_text":
        fields["sliding_window"], fields["sliding_layers"] = _layer_window(
            r, layers, pattern_default=6
        )
    elif model_type == "gpt_oss":
        fields["sliding_window"], fields["sliding_layers"] = _layer_window(r, layers)

    if model_type == "mixtral":
        experts = r.integer("num_local_experts", 8, minimum=1)
        fields.update(
            num_experts=experts,
            experts_per_token=r.integer("num_experts_per_tok", 2, minimum=1),
            moe_intermediate_size=fields["intermediate_size"],
            moe_layers=layers,
        )
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        experts = r.integer("num_experts", 60 if model_type == "qwen2_moe" else 128, minimum=1)
        step = r.integer("decoder_sparse_step", 1, minimum=1)
        dense_only: set[int] = set(r.integers("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        shared = r.integer("shared_expert_intermediate_size", 0)
        fields.update(
            num_experts=experts,
            experts_per_token=r.integer(
                "num_experts_per_tok", 4 if model_type == "qwen2_moe" else 8
            ),
            moe_intermediate_size=r.integer("moe_intermediate_size", minimum=1),
            shared_expert_intermediate_size=shared,
            shared_expert_gate=shared > 0,
            moe_layers=moe_layers,
        )
    elif model_type in ("deepseek_v2", "deepseek_v3"):
        kv_lora = r.integer("kv_lora_rank", minimum=1)
        rope = r.integer("qk_rope_head_dim", minimum=1)
        nope = r.integer("qk_nope_head_dim", minimum=1)
        routed = r.integer("n_routed_experts", 0)
        first_dense = r.integer("first_k_dense_replace", 0)
        freq = r.integer("moe_layer_freq", 1, minimum=1)
        moe_inter = r.integer("moe_intermediate_size", minimum=1) if routed else 0
        fields.update(
            num_kv_heads=1,
            head_dim=nope + rope,
            v_head_dim=r.integer("v_head_dim", minimum=1),
            q_lora_rank=r.opt_integer("q_lora_rank") or 0,
            kv_lora_rank=kv_lora,
            qk_rope_head_dim=rope,
            qkv_bias=False,
            o_bias=False,
            num_experts=routed,
            experts_per_token=r.integer("num_experts_per_tok", minimum=1) if routed else 0,
            moe_intermediate_size=moe_inter,
            shared_expert_intermediate_size=r.integer("n_shared_experts", 0) * moe_inter,
            moe_layers=sum(
                1 for i in range(layers) if routed and i >= first_dense and i % freq == 0
            ),
            score_correction_bias=r.text("topk_method") == "noaux_tc",
        )
    elif model_type == "llama4_text":
        experts = r.integer("num_local_experts", minimum=1)
        step = r.integer("interleave_moe_layer_step", 1, minimum=1)
        listed = r.integers("moe_layers")
        moe_layers = len(listed) if listed else len(range(step - 1, layers, step))
        chunk = r.opt_integer("attention_chunk_size", minimum=1)
        nope_layers = r.integers("no_rope_layers")
        if nope_layers:  # 1 = RoPE (chunked local) layer, 0 = NoPE (global) layer
            chunked = sum(1 for v in nope_layers if v)
        else:
            interval = r.integer("no_rope_layer_interval", 4, minimum=1)
            chunked = sum(1 for i in range(layers) if (i + 1) % interval != 0)
        fields.update(
            intermediate_size=r.integer("intermediate_size_mlp", minimum=1),
            num_experts=experts,
            experts_per_token=r.integer("num_experts_per_tok", 1, minimum=1),
            moe_intermediate_size=r.integer("intermediate_size", minimum=1),
            shared_expert_intermediate_size=r.integer("intermediate_size", minimum=1),
            moe_layers=moe_layers,
            chunk_size=chunk,
            chunked_layers=chunked if chunk else 0,
            qk_norm=False,  # Llama 4's q/k L2 norm has no weights
        )
    elif model_type == "gpt_oss":
        experts = r.integer("num_local_experts", minimum=1)
        fields.update(
            num_experts=experts,
            experts_per_token=r.integer(
                "num_experts_per_tok", r.integer("experts_per_token", 4, minimum=1), minimum=1
            ),
            moe_intermediate_size=fields["intermediate_size"],
            moe_layers=layers,
            router_bias=True,
            expert_bias=True,
            attention_sinks=True,
        )
    if fields["num_experts"] and fields["experts_per_token"] > fields["num_experts"]:
        raise SpecError(
            f"{name}: config.json routes {fields['experts_per_token']} experts per token "
            f"but has {fields['num_experts']}"
        )

    if outer is not None:
        vision = outer.obj("vision_config")
        if vision is not None:
            vr = _Reader(vision, name, "vision_config.")
            extra = (_vision_siglip if model_type == "gemma3_text" else _vision_llama4)(vr, hidden)
    elif _Reader(raw, name).has("vision_config"):
        raise _unknown(name, f"a vision_config on a '{model_type}' model")
    fields["extra_params"] = extra
    if fields["qk_rope_head_dim"]:  # MLA: only the rope part of the head rotates
        fields["rope_cache_values"] = _rope_cache_values(r, fields["qk_rope_head_dim"])
    return ModelConfig(**fields)


def _catalogue_hint() -> str:
    return f"catalogue: {', '.join(sorted(MODEL_CATALOGUE))}"


def _generation_file(config_path: Path, config: Any) -> tuple[tuple[str, float], ...]:
    """The request defaults vLLM finds for the checkpoint of ``config_path``: its
    generation_config.json's; where that file is missing, unreadable or not JSON, vLLM
    (``try_get_generation_config``) falls back to the generation keys of config.json
    itself (``config``), and so does this - a bad file is not an error to vLLM."""
    path = config_path.parent / "generation_config.json"
    try:
        return sampling_params(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return sampling_params(config)


def load_model_config(name_or_path: str | Path, base_dir: Path | None = None) -> ModelConfig:
    """A model's config from the catalogue name, a config.json, or a directory holding one.

    A relative path is read relative to ``base_dir`` (the spec file's directory) when given.
    Raises SpecError (exit 2) naming what was tried when nothing matches, and the JSON
    error (line:column) of a broken config.json.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if path.is_dir():
        path = path / "config.json"
    # A path that exists is read, though its name looks like a catalogue entry: the
    # catalogue drops quantization suffixes (".../Llama-3.1-8B-Instruct-AWQ-INT4" reads as
    # llama-3.1-8b), and the checkpoint's own quantization_config must size it.
    looks_like_path = "/" in text or text.endswith(".json")
    entry = None if looks_like_path and path.is_file() else catalogue_entry(text)
    if entry is not None:
        sampling = sampling_params(catalogue_sampling(text))
        return dataclasses.replace(parse_config(entry, text), sampling=sampling)
    if not path.is_file():
        raise SpecError(
            f"unknown model config '{text}': not a catalogue entry, a config.json or a "
            "directory holding one",
            hint=_catalogue_hint(),
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    except RecursionError as e:
        raise SpecError(f"{path}: invalid JSON: nested too deeply") from e
    return dataclasses.replace(parse_config(raw, str(path)), sampling=_generation_file(path, raw))
