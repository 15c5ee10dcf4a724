"""The memory model against published figures and the architecture facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.errors import SpecError
from fleetserve.plan.catalogue import MODEL_CATALOGUE, catalogue_name
from fleetserve.plan.memory import (
    CUDA_CONTEXT_BYTES,
    GiB,
    MiB,
    cache_span,
    estimate_replica,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    load_model_config,
    max_model_len_within,
    parse_config,
    rope_cache_bytes,
    weight_bytes,
)

# Published parameter counts (billions) from the model cards / safetensors metadata.
PUBLISHED_PARAMS_B = {
    "llama-3-8b": 8.03,
    "llama-3.1-8b": 8.03,
    "llama-3-70b": 70.55,
    "llama-3.3-70b": 70.55,
    "mistral-7b-v0.1": 7.24,
    "phi-3-mini-128k": 3.82,
    "llama-3.1-70b": 70.55,
    "llama-3.2-1b": 1.24,
    "llama-3.2-3b": 3.21,
    "mistral-7b-v0.3": 7.25,
    "mixtral-8x7b": 46.7,
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-3b": 3.09,
    "qwen2.5-7b": 7.61,
    "qwen2.5-14b": 14.7,
    "qwen2.5-32b": 32.8,
    "qwen2.5-72b": 72.7,
    "gemma-3-270m": 0.268,
    "gemma-3-1b": 1.0,
    "gemma-3-4b": 4.3,
    "gemma-3-12b": 12.2,
    "gemma-3-27b": 27.4,
    "phi-3-mini-4k": 3.82,
    "phi-3-medium-4k": 14.0,
    "phi-4": 14.7,
    "phi-4-mini": 3.84,
    # model cards (hf.co/<org>/<model>): "Number of Parameters" / safetensors totals
    "llama-3.1-405b": 405.85,  # meta-llama/Llama-3.1-405B: 405B
    "llama-4-scout": 109.0,  # Llama-4-Scout-17B-16E: 17B active, 109B total
    "llama-4-maverick": 400.0,  # Llama-4-Maverick-17B-128E: 17B active, 400B total
    "gemma-2-2b": 2.61,  # google/gemma-2-2b: 2.61B params
    "gemma-2-9b": 9.24,  # google/gemma-2-9b: 9.24B params
    "gemma-2-27b": 27.2,  # google/gemma-2-27b: 27.2B params
    "qwen3-0.6b": 0.6,  # Qwen/Qwen3-0.6B: 0.6B
    "qwen3-1.7b": 1.7,  # Qwen/Qwen3-1.7B: 1.7B
    "qwen3-4b": 4.0,  # Qwen/Qwen3-4B: 4.0B
    "qwen3-8b": 8.2,  # Qwen/Qwen3-8B: 8.2B
    "qwen3-14b": 14.8,  # Qwen/Qwen3-14B: 14.8B
    "qwen3-32b": 32.8,  # Qwen/Qwen3-32B: 32.8B
    "qwen3-30b-a3b": 30.5,  # Qwen/Qwen3-30B-A3B: 30.5B total, 3.3B activated
    "qwen3-235b-a22b": 235.0,  # Qwen/Qwen3-235B-A22B: 235B total, 22B activated
    "deepseek-v2-lite": 15.7,  # deepseek-ai/DeepSeek-V2-Lite: 15.7B total
    "deepseek-v2": 236.0,  # deepseek-ai/DeepSeek-V2: 236B total, 21B activated
    "deepseek-v3": 671.0,  # deepseek-ai/DeepSeek-V3: 671B total (+14B MTP module)
    "gpt-oss-20b": 21.0,  # openai/gpt-oss-20b: 21B parameters, 3.6B active
    "gpt-oss-120b": 117.0,  # openai/gpt-oss-120b: 117B parameters, 5.1B active
}


@pytest.mark.parametrize(("name", "billions"), sorted(PUBLISHED_PARAMS_B.items()))
def test_catalogue_parameter_counts_match_published_sizes(name: str, billions: float) -> None:
    params = load_model_config(name).num_params() / 1e9
    assert params == pytest.approx(billions, rel=0.015)


def test_every_catalogue_entry_is_checked_against_a_published_size() -> None:
    assert set(MODEL_CATALOGUE) == set(PUBLISHED_PARAMS_B)


def test_llama3_8b_published_figures() -> None:
    cfg = load_model_config("llama-3-8b")
    # bf16 weights ~16.1 GB (16,060,522,496 bytes of safetensors)
    assert weight_bytes(cfg, "bfloat16") / 1e9 == pytest.approx(16.06, abs=0.05)
    # 2 x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 128 KiB per token
    assert kv_bytes_per_token(cfg) == 128 * 1024
    assert kv_bytes_per_token(cfg, kv_cache_dtype="fp8") == 64 * 1024


def test_llama3_70b_published_figures() -> None:
    cfg = load_model_config("meta-llama/Llama-3.3-70B-Instruct")
    assert weight_bytes(cfg) / 1e9 == pytest.approx(141.1, abs=0.3)
    assert kv_bytes_per_token(cfg) == 320 * 1024
    # TP=4 splits the 8 KV heads: 80 KiB per card
    assert kv_bytes_per_token(cfg, tensor_parallel=4) == 80 * 1024


def test_quantization_shrinks_linear_layers_only() -> None:
    cfg = load_model_config("llama-3-8b")
    bf16 = weight_bytes(cfg)
    fp8 = weight_bytes(cfg, quant="fp8")
    awq = weight_bytes(cfg, quant="awq")
    embeddings = cfg.embedding_params() * 2
    assert fp8 == pytest.approx(embeddings + cfg.linear_params(), rel=0.001)
    # AWQ Llama-3-8B checkpoints are ~5.7 GB (4-bit linears + bf16 embeddings/lm_head)
    assert awq / 1e9 == pytest.approx(5.7, abs=0.2)
    assert awq < fp8 < bf16


def test_moe_counts_all_experts_for_memory_but_two_per_token() -> None:
    cfg = load_model_config("mixtral-8x7b")
    assert cfg.active_params() / 1e9 == pytest.approx(12.9, rel=0.02)


def test_sliding_window_layers_hold_only_the_window() -> None:
    cfg = load_model_config("gemma-3-270m")
    assert (cfg.sliding_layers, cfg.full_layers) == (15, 3)
    per_layer = 2 * 1 * 256 * 2
    # sliding layers: window - 1 + in-flight tokens (one 2048-token chunk), + 1 block
    seq = kv_bytes_per_sequence(cfg, 8192, in_flight_tokens=2048)
    assert seq == 3 * 8192 * per_layer + 15 * (161 * 16) * per_layer
    # a short sequence holds its own length (+1 alignment block on sliding layers)
    assert kv_bytes_per_sequence(cfg, 100) == 3 * 112 * per_layer + 15 * 128 * per_layer
    # without sliding windows it is just tokens x per-token bytes
    llama = load_model_config("llama-3-8b")
    assert kv_bytes_per_sequence(llama, 8192) == 8192 * kv_bytes_per_token(llama)
    # Mistral v0.1 slides on every layer; v0.3 does not
    assert load_model_config("mistral-7b-v0.1").sliding_layers == 32
    assert load_model_config("mistral-7b-v0.3").sliding_window is None


def test_cache_span_counts_only_the_window_of_sliding_layers() -> None:
    """vLLM's "GPU KV cache size" counts tokens in every layer; a cached Gemma 3 prompt
    keeps its whole prefix only in the global layers (1 of 6), so the cache holds several
    times its token count of long prompts - and exactly its count of short ones."""
    gemma = load_model_config("gemma-3-4b")
    per_layer = kv_bytes_per_token(gemma) // gemma.num_layers
    held = gemma.full_layers * 4096 + gemma.sliding_layers * (1024 + 16)  # window + 1 block
    assert cache_span(gemma, 4096) == pytest.approx(gemma.num_layers * 4096 / held)
    assert held * per_layer == kv_bytes_per_sequence(gemma, 4096, in_flight_tokens=1)
    assert 2.6 < cache_span(gemma, 4096) < 2.9
    assert cache_span(gemma, 512) == 1.0  # within the window: every layer holds it all
    assert cache_span(gemma, 32768) > cache_span(gemma, 4096)
    # no sliding layers: one cached token per token, never below 1 (block rounding)
    assert cache_span(load_model_config("llama-3.1-8b"), 4000) == 1.0
    assert cache_span(gemma, 0) == 1.0


def test_qwen_sliding_window_is_off_when_use_sliding_window_is_false() -> None:
    assert load_model_config("qwen2.5-7b").sliding_window is None


def test_estimate_scales_with_concurrency_and_context() -> None:
    cfg = load_model_config("llama-3-8b")
    small = estimate_replica(cfg, max_model_len=4096, concurrency=4)
    big = estimate_replica(cfg, max_model_len=8192, concurrency=16)
    assert big.kv_cache == 8 * small.kv_cache
    assert small.kv_cache == 4 * 4096 * 128 * 1024
    assert big.weights == small.weights
    assert small.total == (
        small.weights
        + small.kv_cache
        + small.activation
        + small.runtime
        + small.cuda_graphs
        + small.cuda_context
    )
    # vLLM's budget holds all but the CUDA context, made before its start-up snapshot, and
    # the CUDA graphs, captured after the KV cache is sized from the budget
    assert small.budget == small.total - CUDA_CONTEXT_BYTES - small.cuda_graphs
    assert small.cuda_graphs > 0


def test_tensor_parallel_splits_weights_and_kv_per_card() -> None:
    cfg = load_model_config("llama-3-70b")
    one = estimate_replica(cfg, max_model_len=8192, concurrency=8)
    four = estimate_replica(cfg, max_model_len=8192, concurrency=8, tensor_parallel=4)
    assert four.cards == 4
    rope = rope_cache_bytes(cfg)  # whole on every card
    assert four.weights - rope == pytest.approx((one.weights - rope) / 4, rel=1e-6)
    assert four.kv_cache == one.kv_cache // 4
    assert four.total < one.total / 3


def test_cpu_estimate_has_no_cuda_graphs() -> None:
    cfg = load_model_config("gemma-3-270m")
    cpu = estimate_replica(cfg, max_model_len=2048, concurrency=8, device="cpu")
    assert cpu.cuda_graphs == 0
    assert cpu.runtime > 0


def test_max_model_len_within_budget() -> None:
    cfg = load_model_config("llama-3-8b")
    budget = 40 * GiB
    longest = max_model_len_within(cfg, budget, upper=131072, concurrency=8)
    assert longest is not None
    assert estimate_replica(cfg, max_model_len=longest, concurrency=8).total <= budget
    assert estimate_replica(cfg, max_model_len=longest + 16, concurrency=8).total > budget
    assert max_model_len_within(cfg, 1 * GiB, upper=8192, concurrency=8) is None


def test_load_from_config_json_and_directory(tmp_path: Path) -> None:
    raw = dict(MODEL_CATALOGUE["qwen2.5-0.5b"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    by_dir = load_model_config(tmp_path)
    by_file = load_model_config(tmp_path / "config.json")
    assert (
        by_dir.num_params()
        == by_file.num_params()
        == load_model_config("qwen2.5-0.5b").num_params()
    )


def test_multimodal_config_counts_the_vision_tower() -> None:
    cfg = load_model_config("gemma-3-4b")
    assert 0.40e9 < cfg.extra_params < 0.45e9  # SigLIP-400M + projector


def test_unknown_config_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="unknown model config 'llama-9-900b'") as info:
        load_model_config("llama-9-900b")
    assert "llama-3-8b" in str(info.value)  # the hint lists the catalogue


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(SpecError, match=r"config\.json:3:3: invalid JSON"):
        load_model_config(path)


def test_missing_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no 'hidden_size'"):
        parse_config({"model_type": "llama", "num_attention_heads": 8}, "x/config.json")


def test_catalogue_names_match_loosely() -> None:
    assert catalogue_name("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert catalogue_name("Qwen/Qwen2.5-7B-Instruct-AWQ") == "qwen2.5-7b"
    assert catalogue_name("google/gemma-3-27b-it") == "gemma-3-27b"
    assert catalogue_name("builtin:gemma-3-270m") == "gemma-3-270m"
    assert catalogue_name("my-own-model") is None


def test_mib_constant() -> None:
    assert MiB == 1024 * 1024


@pytest.mark.parametrize(
    "name", ["llama-3-8b", "mixtral-8x7b", "qwen2.5-0.5b", "gemma-3-270m", "gemma-3-4b", "phi-4"]
)
def test_parameter_count_equals_transformers_model_built_from_the_same_config(name: str) -> None:
    """Build the model with transformers on the meta device (no memory) and count."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = dict(MODEL_CATALOGUE[name])
    model_type = raw.pop("model_type")
    raw.pop("architectures", None)
    config = transformers.AutoConfig.for_model(model_type, **raw)
    auto = (
        transformers.AutoModelForImageTextToText
        if model_type == "gemma3"
        else transformers.AutoModelForCausalLM
    )
    with torch.device("meta"):
        model = auto.from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    assert load_model_config(name).num_params() == expected
