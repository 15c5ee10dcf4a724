"""Built-in model catalogue: the config.json facts of common open-weight families.

Each entry holds the architecture numbers of the model's published Hugging Face
``config.json`` (only the keys the memory model reads), so a fleet can be planned without
downloading anything: ``config: llama-3.1-8b``. The numbers are facts; the unit tests
check each entry's parameter count against the published model size. Names are matched
loosely (case and ``-instruct``/``-it``/``-chat`` suffixes do not matter, and a HF repo id
such as ``meta-llama/Llama-3.1-8B-Instruct`` finds its entry).
"""

from __future__ import annotations

import re
from typing import Any

_LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_LLAMA3_70B: dict[str, Any] = {
    **_LLAMA3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}
_QWEN25_BASE: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "attention_bias": True,  # Qwen2 has q/k/v biases (not a config key upstream)
    "use_sliding_window": False,
    "sliding_window": 131072,
    "torch_dtype": "bfloat16",
}
_GEMMA3_TEXT: dict[str, Any] = {
    "model_type": "gemma3_text",
    "head_dim": 256,
    "sliding_window_pattern": 6,  # 5 local (sliding) layers, then 1 global
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "query_pre_attn_scalar": 256,
}
_SIGLIP_GEMMA3: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 896,
    "num_channels": 3,
    "vision_use_head": False,
}
_PHI3_MINI: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "vocab_size": 32064,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


_GEMMA2: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "vocab_size": 256000,
    "head_dim": 256,
    "sliding_window": 4096,  # layers 0, 2, 4, ... local; the others global
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
_QWEN3: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_QWEN3_MOE: dict[str, Any] = {
    **_QWEN3,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_key_value_heads": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
_LLAMA4_VISION: dict[str, Any] = {
    "model_type": "llama4_vision_model",
    "hidden_size": 1408,
    "intermediate_size": 5632,
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
    "num_channels": 3,
    "pixel_shuffle_ratio": 0.5,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
    "vision_output_dim": 4096,
}
_LLAMA4_TEXT: dict[str, Any] = {
    "model_type": "llama4_text",
    "vocab_size": 202048,
    "hidden_size": 5120,
    "intermediate_size": 8192,  # each routed expert and the shared expert
    "intermediate_size_mlp": 16384,  # the dense layers
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_experts_per_tok": 1,
    "attention_chunk_size": 8192,  # 3 of 4 layers attend within 8192-token chunks
    "attention_bias": False,
    "tie_word_embeddings": False,
}
_DEEPSEEK_MLA: dict[str, Any] = {
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_GPT_OSS: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "attention_bias": True,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16",
}


def _alternating(layers: int) -> list[str]:
    """gpt-oss's layer_types: sliding, full, sliding, full, ..."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def _llama4(text: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {**_LLAMA4_TEXT, **text},
        "vision_config": dict(_LLAMA4_VISION),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def _gemma3_mm(text: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {**_GEMMA3_TEXT, **text},
        "vision_config": dict(_SIGLIP_GEMMA3),
        "mm_tokens_per_image": 256,
        "torch_dtype": "bfloat16",
    }


#: Canonical name -> config.json facts.
MODEL_CATALOGUE: dict[str, dict[str, Any]] = {
    # Meta Llama 3.x (3.0 has 8k context; 3.1/3.3 128k with RoPE scaling)
    "llama-3-8b": {**_LLAMA3_8B, "max_position_embeddings": 8192},
    "llama-3.1-8b": {**_LLAMA3_8B, "max_position_embeddings": 131072},
    "llama-3-70b": {**_LLAMA3_70B, "max_position_embeddings": 8192},
    "llama-3.1-70b": {**_LLAMA3_70B, "max_position_embeddings": 131072},
    "llama-3.3-70b": {**_LLAMA3_70B, "max_position_embeddings": 131072},
    "llama-3.2-1b": {
        **_LLAMA3_8B,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    },
    "llama-3.2-3b": {
        **_LLAMA3_8B,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    },
    # Mistral AI
    "mistral-7b-v0.1": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b-v0.3": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "vocab_size": 32768,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "sliding_window": None,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": None,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    # Alibaba Qwen2.5
    "qwen2.5-0.5b": {
        **_QWEN25_BASE,
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-1.5b": {
        **_QWEN25_BASE,
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-3b": {
        **_QWEN25_BASE,
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-7b": {
        **_QWEN25_BASE,
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-14b": {
        **_QWEN25_BASE,
        "vocab_size": 152064,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-32b": {
        **_QWEN25_BASE,
        "vocab_size": 152064,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-72b": {
        **_QWEN25_BASE,
        "vocab_size": 152064,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    },
    # Google Gemma 3 (270m and 1b are text-only; 4b+ carry a SigLIP vision tower)
    "gemma-3-270m": {
        "architectures": ["Gemma3ForCausalLM"],
        **_GEMMA3_TEXT,
        "vocab_size": 262144,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "sliding_window": 512,
        "max_position_embeddings": 32768,
    },
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"],
        **_GEMMA3_TEXT,
        "vocab_size": 262144,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "sliding_window": 512,
        "max_position_embeddings": 32768,
    },
    "gemma-3-4b": _gemma3_mm(
        {
            "vocab_size": 262208,
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_hidden_layers": 34,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "sliding_window": 1024,
            "max_position_embeddings": 131072,
        }
    ),
    "gemma-3-12b": _gemma3_mm(
        {
            "vocab_size": 262208,
            "hidden_size": 3840,
            "intermediate_size": 15360,
            "num_hidden_layers": 48,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "sliding_window": 1024,
            "max_position_embeddings": 131072,
        }
    ),
    "gemma-3-27b": _gemma3_mm(
        {
            "vocab_size": 262208,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "num_hidden_layers": 62,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "query_pre_attn_scalar": 168,
            "sliding_window": 1024,
            "max_position_embeddings": 131072,
        }
    ),
    # Microsoft Phi-3 / Phi-4
    "phi-3-mini-4k": {**_PHI3_MINI, "sliding_window": 2047, "max_position_embeddings": 4096},
    "phi-3-mini-128k": {
        **_PHI3_MINI,
        "sliding_window": 262144,
        "max_position_embeddings": 131072,
    },
    "phi-3-medium-4k": {
        **_PHI3_MINI,
        "hidden_size": 5120,
        "intermediate_size": 17920,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 10,
        "sliding_window": 2047,
        "max_position_embeddings": 4096,
    },
    "phi-4": {
        **_PHI3_MINI,
        "vocab_size": 100352,
        "hidden_size": 5120,
        "intermediate_size": 17920,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 10,
        "sliding_window": None,
        "max_position_embeddings": 16384,
    },
    "phi-4-mini": {
        **_PHI3_MINI,
        "vocab_size": 200064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
        "sliding_window": 262144,
        "max_position_embeddings": 131072,
    },
    # Meta Llama 3.1 405B (dense) and Llama 4 (MoE + chunked attention + vision tower)
    "llama-3.1-405b": {
        **_LLAMA3_8B,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "llama-4-scout": _llama4(
        {
            "num_local_experts": 16,
            "interleave_moe_layer_step": 1,
            "max_position_embeddings": 10485760,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
        }
    ),
    "llama-4-maverick": _llama4(
        {
            "num_local_experts": 128,
            "interleave_moe_layer_step": 2,  # MoE and dense layers alternate
            "max_position_embeddings": 1048576,
        }
    ),
    # Google Gemma 2 (global and 4096-token sliding layers alternate; tied head)
    "gemma-2-2b": {
        **_GEMMA2,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256,
    },
    "gemma-2-9b": {
        **_GEMMA2,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "query_pre_attn_scalar": 256,
    },
    "gemma-2-27b": {
        **_GEMMA2,
        "hidden_size": 4608,
        "intermediate_size": 36864,
        "num_hidden_layers": 46,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "query_pre_attn_scalar": 144,
    },
    # Alibaba Qwen3 (q/k norms, no biases; 0.6B-4B tie the head) and Qwen3 MoE
    "qwen3-0.6b": {
        **_QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "qwen3-1.7b": {
        **_QWEN3,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        **_QWEN3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        **_QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
    },
    "qwen3-14b": {
        **_QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
    },
    "qwen3-32b": {
        **_QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
    },
    "qwen3-30b-a3b": {
        **_QWEN3_MOE,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
    },
    "qwen3-235b-a22b": {
        **_QWEN3_MOE,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_hidden_layers": 94,
        "num_attention_heads": 64,
    },
    # DeepSeek V2 / V3: MLA attention (one 576-wide latent per token per layer) + MoE
    "deepseek-v2-lite": {
        **_DEEPSEEK_MLA,
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": 102400,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "topk_method": "greedy",
    },
    "deepseek-v2": {
        **_DEEPSEEK_MLA,
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": 102400,
        "hidden_size": 5120,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_hidden_layers": 60,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "n_routed_experts": 160,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "topk_method": "group_limited_greedy",
    },
    "deepseek-v3": {
        **_DEEPSEEK_MLA,
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,  # the MTP layer: not loaded without speculation
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    },
    # OpenAI gpt-oss (MXFP4 experts, alternating 128-token sliding/full attention, sinks)
    "gpt-oss-20b": {
        **_GPT_OSS,
        "num_hidden_layers": 24,
        "num_local_experts": 32,
        "layer_types": _alternating(24),
    },
    "gpt-oss-120b": {
        **_GPT_OSS,
        "num_hidden_layers": 36,
        "num_local_experts": 128,
        "layer_types": _alternating(36),
    },
}

#: Other spellings -> canonical name.
_ALIASES: dict[str, str] = {
    "llama-3.1-8b": "llama-3.1-8b",
    "meta-llama-3-8b": "llama-3-8b",
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama-3-70b": "llama-3-70b",
    "meta-llama-3.1-70b": "llama-3.1-70b",
    "mistral-7b": "mistral-7b-v0.3",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "phi-3-mini": "phi-3-mini-4k",
    "phi-3.5-mini": "phi-3-mini-128k",
    "phi-3-medium": "phi-3-medium-4k",
    "gemma-3-270m": "gemma-3-270m",
    "builtin:gemma-3-270m": "gemma-3-270m",
    "meta-llama-3.1-405b": "llama-3.1-405b",
    "llama-4-scout-17b-16e": "llama-4-scout",
    "llama-4-maverick-17b-128e": "llama-4-maverick",
    "gemma-2-2b": "gemma-2-2b",
    "deepseek-v2-lite": "deepseek-v2-lite",
    "deepseek-v3-0324": "deepseek-v3",
    "qwen3-30b-a3b-2507": "qwen3-30b-a3b",
    "qwen3-235b-a22b-2507": "qwen3-235b-a22b",
}

_SUFFIXES = ("-instruct", "-it", "-chat", "-hf", "-pt", "-base", "-original")


def _normalise(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    if not key.startswith("builtin:"):
        key = key.rsplit("/", 1)[-1]
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix):
                key = key[: -len(suffix)]
                changed = True
        stripped = re.sub(r"-(awq|gptq|fp8|int4|int8|bnb-4bit)$", "", key)
        if stripped != key:
            key, changed = stripped, True
    return key


#: The request defaults Gemma 3's published generation_config.json files set (every size,
#: google/gemma-3-*): vLLM applies them to requests that set none (``--generation-config
#: auto``, its default). The default model's own generation_config.json writes the same.
GEMMA3_SAMPLING: dict[str, float] = {"top_k": 64, "top_p": 0.95}
#: Sampling defaults of the catalogue's models whose generation_config.json sets any (by
#: canonical name); a model not here samples as vLLM's own defaults (temperature 1, no
#: top-k or top-p), which is also what ``--generation-config vllm`` asks for.
SAMPLING_DEFAULTS: dict[str, dict[str, float]] = {
    name: GEMMA3_SAMPLING for name in MODEL_CATALOGUE if name.startswith("gemma-3-")
}


def catalogue_name(name: str) -> str | None:
    """The canonical catalogue name ``name`` refers to, or None."""
    key = _normalise(name)
    if key in MODEL_CATALOGUE:
        return key
    return _ALIASES.get(key)


def catalogue_entry(name: str) -> dict[str, Any] | None:
    """A copy of the config.json facts for ``name`` (None if not in the catalogue)."""
    canonical = catalogue_name(name)
    if canonical is None:
        return None
    return dict(MODEL_CATALOGUE[canonical])


def catalogue_sampling(name: str) -> dict[str, float]:
    """The request defaults ``name``'s generation_config.json sets (empty: none known)."""
    canonical = catalogue_name(name)
    return dict(SAMPLING_DEFAULTS.get(canonical, {})) if canonical else {}
