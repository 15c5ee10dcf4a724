"""Every architecture family the memory model understands, read from config.json fixtures.

The fixtures (tests/fixtures/plan/configs/<model>/config.json) were written for these tests
from the models' published config.json values (only architecture keys plus a few unread
ones, the way real files carry them). Each family is checked against the published
parameter count of a real model of that family (model card figures cited), and the
KV/weight facts that used to be wrong (issue #10 point 1) are pinned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetserve.errors import SpecError
from fleetserve.plan import plan_fleet
from fleetserve.plan.catalogue import MODEL_CATALOGUE
from fleetserve.plan.memory import (
    MiB,
    estimate_replica,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    load_model_config,
    parse_config,
    pp_stage_layers,
    rope_cache_bytes,
    weight_bytes,
)
from fleetserve.spec import FleetSpec, parse_spec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "plan" / "configs"


def fixture(name: str) -> Path:
    return FIXTURES / name / "config.json"


@pytest.mark.parametrize(
    ("name", "billions", "family"),
    [
        ("deepseek-v2-lite", 15.7, "MLA + MoE with shared experts"),  # card: 15.7B total
        ("deepseek-v3", 671.0, "MLA + MoE, fp8 checkpoint"),  # card: 671B total
        ("mixtral-8x7b", 46.7, "MoE (num_local_experts)"),  # card: 46.7B
        ("gemma-2-9b", 9.24, "alternating sliding/global, tied head"),  # card: 9.24B
        ("qwen3-8b", 8.2, "dense GQA with q/k norms"),  # card: 8.2B
        ("qwen3-30b-a3b", 30.5, "Qwen MoE"),  # card: 30.5B total, 3.3B activated
        ("llama-4-scout", 109.0, "MoE + chunked attention + vision tower"),  # card: 109B
        ("gpt-oss-20b", 21.0, "MoE with biases, sinks, MXFP4"),  # card: 21B parameters
    ],
)
def test_family_parameter_count_matches_the_model_card(
    name: str, billions: float, family: str
) -> None:
    config = load_model_config(fixture(name))
    assert config.num_params() / 1e9 == pytest.approx(billions, rel=0.01), family


def test_fixture_files_read_like_the_catalogue() -> None:
    for path in FIXTURES.glob("*/config.json"):
        name = path.parent.name
        assert load_model_config(path).num_params() == load_model_config(name).num_params()


# --------------------------------------------------------------------------- MLA / MoE


def test_deepseek_v2_lite_is_mla_moe_not_a_dense_2_7b() -> None:
    cfg = load_model_config(fixture("deepseek-v2-lite"))
    assert cfg.use_mla
    assert cfg.num_experts == 64
    assert cfg.moe_layers == 26
    # bf16 weights: 15.7B x 2 bytes = ~29,957 MiB (the dense misreading said 5,127)
    assert weight_bytes(cfg) / MiB == pytest.approx(29_957, abs=5)
    # one latent of kv_lora_rank + qk_rope_head_dim (512 + 64) per token per layer
    assert kv_bytes_per_token(cfg) == 27 * 576 * 2
    # ... whole on every tensor-parallel rank (vLLM does not shard the latent)
    assert kv_bytes_per_token(cfg, tensor_parallel=4) == 27 * 576 * 2
    # card: 2.4B activated (without the 0.42B embedding + head)
    assert (cfg.active_params() - cfg.embedding_params()) / 1e9 == pytest.approx(2.24, abs=0.05)


def test_deepseek_v3_loads_its_fp8_checkpoint() -> None:
    cfg = load_model_config(fixture("deepseek-v3"))
    assert cfg.checkpoint_quant is not None
    assert cfg.checkpoint_quant.label == "fp8 block"
    assert cfg.moe_layers == 58
    assert cfg.score_correction_bias
    # linears at 1 byte; embeddings, head, norms in bf16: ~673 GB (the checkpoint: 688 GB
    # with the 14B MTP module vLLM does not load without speculative decoding)
    assert weight_bytes(cfg) / 1e9 == pytest.approx(673, abs=3)
    assert cfg.active_params() / 1e9 == pytest.approx(37.5, abs=0.3)  # card: 37B activated


def test_qwen_moe_counts_every_expert_and_activates_eight() -> None:
    cfg = load_model_config(fixture("qwen3-30b-a3b"))
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_layers) == (128, 8, 48)
    assert cfg.active_params() / 1e9 == pytest.approx(3.3, abs=0.1)  # card: 3.3B activated


def test_qwen2_moe_shared_expert_and_sparse_step() -> None:
    raw: dict[str, Any] = {
        "model_type": "qwen2_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 1,
        "max_position_embeddings": 8192,
    }
    cfg = parse_config(raw, "qwen1.5-moe-a2.7b")
    assert cfg.shared_expert_gate
    assert cfg.qkv_bias
    assert cfg.num_params() / 1e9 == pytest.approx(14.3, rel=0.01)  # Qwen1.5-MoE-A2.7B: 14.3B
    every_other = parse_config({**raw, "mlp_only_layers": [0, 1]}, "x")
    assert every_other.moe_layers == 22


def test_mixtral_active_parameters() -> None:
    cfg = load_model_config(fixture("mixtral-8x7b"))
    assert cfg.active_params() / 1e9 == pytest.approx(12.9, rel=0.02)  # card: 12.9B active


def test_llama4_scout_chunked_layers_and_vision_tower() -> None:
    cfg = load_model_config(fixture("llama-4-scout"))
    assert (cfg.chunk_size, cfg.chunked_layers, cfg.full_layers) == (8192, 36, 12)
    assert cfg.moe_layers == 48
    assert cfg.shared_expert_intermediate_size == 8192
    assert 0.85e9 < cfg.extra_params < 0.9e9  # ViT + pixel-shuffle adapter + projector
    text_active = cfg.active_params() - cfg.extra_params
    assert text_active / 1e9 == pytest.approx(17.2, abs=0.1)  # card: 17B active
    maverick = load_model_config("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    assert maverick.moe_layers == 24  # interleave_moe_layer_step 2


def test_chunked_layers_hold_a_chunk_plus_in_flight_tokens() -> None:
    cfg = load_model_config("llama-4-scout")
    per_layer = 2 * 8 * 128 * 2
    long = kv_bytes_per_sequence(cfg, 131072, in_flight_tokens=4096)
    # 12 global layers hold 131072 tokens; 36 chunked ones cdiv(8192 + 4096, 16) blocks
    assert long == 12 * 131072 * per_layer + 36 * (12288 // 16) * 16 * per_layer


def test_gpt_oss_mxfp4_experts_sinks_and_alternating_windows() -> None:
    cfg = load_model_config(fixture("gpt-oss-20b"))
    assert cfg.checkpoint_quant is not None
    assert cfg.checkpoint_quant.scheme == "mxfp4"
    assert cfg.attention_sinks
    assert (cfg.sliding_window, cfg.sliding_layers, cfg.full_layers) == (128, 12, 12)
    # MXFP4 experts (4.25 bits) + bf16 attention/embeddings: the 13.8 GB checkpoint
    assert weight_bytes(cfg) / 1e9 == pytest.approx(13.8, abs=0.1)
    assert load_model_config("gpt-oss-120b").num_params() / 1e9 == pytest.approx(116.8, abs=0.1)


# --------------------------------------------------------------------------- hybrid, tied


def test_gemma2_ties_its_head_and_alternates_global_and_local_layers() -> None:
    cfg = load_model_config(fixture("gemma-2-9b"))
    assert cfg.tie_word_embeddings  # no untied head: the +1,750 MiB misreading
    assert cfg.embedding_params() == 256000 * 3584
    assert (cfg.sliding_window, cfg.sliding_layers, cfg.full_layers) == (4096, 21, 21)
    per_layer = 2 * 8 * 256 * 2
    seq = kv_bytes_per_sequence(cfg, 8192, in_flight_tokens=2048)
    held = -(-(4095 + 2048) // 16) + 1  # window - 1 + in flight, + 1 alignment block
    assert seq == 21 * 8192 * per_layer + 21 * held * 16 * per_layer


def test_gemma_family_ties_by_default_llama_does_not() -> None:
    base = {
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    assert parse_config({**base, "model_type": "gemma2"}, "g").tie_word_embeddings
    assert not parse_config({**base, "model_type": "llama"}, "l").tie_word_embeddings


def test_pipeline_stages_split_layers_like_vllm() -> None:
    assert pp_stage_layers(32, 2) == [16, 16]
    assert pp_stage_layers(27, 2) == [14, 13]  # remainder before the last stage
    assert pp_stage_layers(10, 4) == [2, 3, 3, 2]
    cfg = load_model_config("qwen2.5-32b")
    one = estimate_replica(cfg, max_model_len=4096, concurrency=4)
    two = estimate_replica(cfg, max_model_len=4096, concurrency=4, pipeline_parallel=2)
    # untied, 64 layers: 32 + embedding on one stage, 32 + head on the other (the RoPE
    # cache is whole on every stage)
    rope = rope_cache_bytes(cfg)
    assert two.weights - rope == pytest.approx((one.weights - rope) / 2, abs=1)
    tied = load_model_config("qwen2.5-3b")  # a tied head is a copy on the last stage too
    one = estimate_replica(tied, max_model_len=4096, concurrency=4)
    two = estimate_replica(tied, max_model_len=4096, concurrency=4, pipeline_parallel=2)
    table = tied.vocab_size * tied.hidden_size * 2
    rope = rope_cache_bytes(tied)
    assert two.weights - rope == pytest.approx((one.weights - rope - table) / 2 + table, rel=0.001)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"model_type": "mamba", "hidden_size": 8}, "model_type 'mamba'"),
        ({"architectures": ["RwkvForCausalLM"]}, r"architectures \['RwkvForCausalLM'\]"),
        ({"hidden_size": 8}, "neither 'model_type' nor 'architectures'"),
        (
            {**MODEL_CATALOGUE["llama-3-8b"], "n_routed_experts": 64},
            "a 'llama' config with n_routed_experts",
        ),
        (
            {**MODEL_CATALOGUE["mixtral-8x7b"], "num_local_experts": "eight"},
            "'num_local_experts' must be an integer, got 'eight'",
        ),
        (
            {**MODEL_CATALOGUE["llama-3-8b"], "max_position_embeddings": "4k"},
            "'max_position_embeddings' must be an integer, got '4k'",
        ),
        (
            {**MODEL_CATALOGUE["llama-3-8b"], "num_key_value_heads": 5},
            r"num_attention_heads \(32\) is not a multiple of num_key_value_heads \(5\)",
        ),
        (
            {**MODEL_CATALOGUE["llama-3-8b"], "hidden_size": True},
            "'hidden_size' must be an integer",
        ),
        (
            {**MODEL_CATALOGUE["gpt-oss-20b"], "quantization_config": {"quant_method": "xyz"}},
            r"quant_method' 'xyz' is not understood",
        ),
        ({**MODEL_CATALOGUE["llama-3-8b"], "vision_config": {}}, "vision_config"),
    ],
)
def test_what_is_not_understood_is_refused_with_its_keys(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_config(raw, "x/config.json")


def test_bad_config_json_values_from_a_file_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MODEL_CATALOGUE["mixtral-8x7b"], "num_local_experts": "eight"}))
    with pytest.raises(SpecError, match=r"config\.json 'num_local_experts' must be an integer"):
        load_model_config(path)


# --------------------------------------------------------------------------- transformers


@pytest.mark.parametrize(
    "name",
    [
        "gemma-2-2b",
        "qwen3-0.6b",
        "qwen3-30b-a3b",
        "deepseek-v2-lite",
        "deepseek-v2",  # q_lora_rank (V2-Lite has none)
        "deepseek-v3",
        "gpt-oss-20b",
        "llama-4-scout",
        "llama-4-maverick",  # MoE and dense layers interleaved
    ],
)
def test_parameter_count_equals_transformers_on_the_meta_device(name: str) -> None:
    """The same config built by transformers (no memory: meta device) has as many
    parameters, except DeepSeek-V3's 58 x 256 router score-correction biases, which
    transformers keeps as buffers and the checkpoint (and vLLM) as weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = dict(MODEL_CATALOGUE[name])
    model_type = raw.pop("model_type")
    raw.pop("architectures", None)
    raw.pop("quantization_config", None)
    config = transformers.AutoConfig.for_model(model_type, **raw)
    auto = (
        transformers.AutoModelForImageTextToText
        if model_type in ("gemma3", "llama4")
        else transformers.AutoModelForCausalLM
    )
    with torch.device("meta"):
        model = auto.from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    buffers = 58 * 256 if name == "deepseek-v3" else 0
    assert load_model_config(name).num_params() == expected + buffers


def test_a_planned_deepseek_v2_lite_replica_holds_its_real_weights() -> None:
    """Issue #10's fleet: DeepSeek-V2-Lite was sized as a dense 2.7B (5,127 MiB of weights,
    7x the KV); it needs ~30 GiB of weights and one 576-wide latent per token and layer."""

    def spec(gpu: str) -> FleetSpec:
        return parse_spec(
            {
                "models": [
                    {
                        "name": "lite",
                        "source": "deepseek-ai/DeepSeek-V2-Lite-Chat",
                        "max_model_len": 8192,
                        "concurrency": 8,
                    }
                ],
                "pools": [{"name": "p", "gpu": {"type": gpu, "count": 2}}],
            }
        )

    (placed,) = plan_fleet(spec("A100-80GB")).replicas
    cfg = load_model_config("deepseek-v2-lite")
    kv_mib = 8 * kv_bytes_per_sequence(cfg, 8192, in_flight_tokens=4096) / MiB
    assert kv_mib == pytest.approx(8 * 8192 * 27 * 576 * 2 / MiB)
    assert placed.need_mb > 29_957 + kv_mib
    assert placed.need_mb < 29_957 + kv_mib + 3_000  # + activation, runtime, graphs
    (left_out,) = plan_fleet(spec("L4")).unplaced  # 22.5 GiB cards: weights alone do not fit
    assert left_out.resource == "gpu_memory"
    assert any(f.startswith("tensor_parallel: 2") for f in left_out.fixes)
