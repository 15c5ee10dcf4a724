"""vLLM's start-up rules (issue #10 points 2 and 3): never place what vLLM refuses.

Each rule is checked on its own (the reason, the field, a fix that passes the same rule),
through the planner (the replica is unplaced with ``models[i].<field>`` and the fix), and
by hypothesis over random fleets: a placed replica never breaks a rule, and every fix a
refusal suggests, once applied, clears that refusal.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.plan import plan_fleet
from fleetserve.plan.checks import plan_violations
from fleetserve.plan.gpus import custom_gpu, gpu_type
from fleetserve.plan.memory import load_model_config, parse_config
from fleetserve.plan.vllm_rules import (
    Refusal,
    engine_refusals,
    gpu_refusals,
    model_refusals,
    valid_tp_degrees,
)
from fleetserve.spec import FleetSpec, ModelSpec, parse_spec


def model(**fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"name": "m", "source": "x", **fields})


def fleet(models: list[dict[str, Any]], pools: list[dict[str, Any]]) -> FleetSpec:
    for m in models:
        m.setdefault("source", m.get("config", "x"))
    return parse_spec({"models": models, "pools": pools})


def pool(gpu: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": "p", "gpu": {"type": gpu, "count": count}, "cpu": 64, "memory_gb": 512, **extra}


def fields(refusals: list[Refusal]) -> list[str]:
    return [r.field for r in refusals]


# --------------------------------------------------------------------------- context


def test_context_above_the_model_limit_is_refused_with_the_limit_as_fix() -> None:
    cfg = load_model_config("llama-3-8b")  # max_position_embeddings 8192, no rope scaling
    (r,) = model_refusals(model(max_model_len=32768), cfg)
    assert r.field == "max_model_len"
    assert "32768 > 8192" in r.reason
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in r.reason
    assert r.fixes == ("max_model_len: 8192",)
    assert model_refusals(model(max_model_len=8192), cfg) == []


def test_rope_scaling_extends_the_limit_only_as_vllm_does() -> None:
    base = {
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 4096,
    }
    linear = parse_config({**base, "rope_scaling": {"type": "linear", "factor": 4.0}}, "l")
    assert linear.max_model_len_limit == 16384  # factor applied
    dynamic = parse_config({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 2}}, "d")
    assert dynamic.max_model_len_limit == 8192
    # yarn/llama3/longrope state the scaled length in max_position_embeddings already
    yarn = parse_config({**base, "rope_scaling": {"type": "yarn", "factor": 4.0}}, "y")
    assert yarn.max_model_len_limit == 4096
    assert model_refusals(model(max_model_len=16384), yarn)[0].field == "max_model_len"
    # Gemma 3's 131072 already includes its linear factor 8
    assert load_model_config("gemma-3-4b").max_model_len_limit == 131072
    # the smallest length key wins; model_max_length overrides
    both = parse_config({**base, "n_positions": 2048}, "n")
    assert (both.max_model_len_limit, both.max_len_key) == (2048, "n_positions")


# --------------------------------------------------------------------------- parallelism


def test_tp_must_divide_the_attention_heads() -> None:
    qwen7 = load_model_config("qwen2.5-7b")  # 28 heads, 4 KV heads
    (r,) = model_refusals(model(tensor_parallel=8), qwen7)
    assert r.field == "tensor_parallel"
    assert "28 attention heads" in r.reason
    assert r.fixes == ("tensor_parallel: 4",)
    llama = load_model_config("llama-3-8b")  # 32 heads on TP 6
    (r,) = model_refusals(model(tensor_parallel=6), llama)
    assert r.fixes == ("tensor_parallel: 4", "tensor_parallel: 8")


def test_kv_heads_split_or_replicate_evenly() -> None:
    phi4 = load_model_config("phi-4")  # 40 heads, 10 KV heads
    (r,) = model_refusals(model(tensor_parallel=4), phi4)
    assert "10 KV heads cannot be split over tensor_parallel 4" in r.reason
    assert r.fixes == ("tensor_parallel: 2",)
    assert valid_tp_degrees(phi4, 40) == [1, 2, 5, 10, 20, 40]
    # fewer KV heads than ranks: replicated, if the ranks are a multiple of them
    llama70 = load_model_config("llama-3-70b")  # 64 heads, 8 KV heads
    assert model_refusals(model(tensor_parallel=16), llama70) == []
    # MLA has one latent: only the heads rule applies
    lite = load_model_config("deepseek-v2-lite")  # 16 heads
    assert valid_tp_degrees(lite, 16) == [1, 2, 4, 8, 16]


def test_the_dense_mlp_width_must_divide_too() -> None:
    cfg = parse_config(
        {
            "model_type": "llama",
            "vocab_size": 1000,
            "hidden_size": 1024,
            "intermediate_size": 1100,  # 1100 / 8 is not whole (ColumnParallelLinear)
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
        },
        "x",
    )
    (r,) = model_refusals(model(tensor_parallel=8), cfg)
    assert "MLP width 1100" in r.reason
    assert r.fixes == ("tensor_parallel: 4",)


def test_pp_needs_a_layer_per_stage() -> None:
    cfg = load_model_config("gemma-3-270m")  # 18 layers
    assert model_refusals(model(pipeline_parallel=4), cfg) == []  # uneven split is fine
    (r,) = model_refusals(model(pipeline_parallel=32), cfg)
    assert r.field == "pipeline_parallel"
    assert r.fixes == ("pipeline_parallel: 18",)


# --------------------------------------------------------------------------- cards


def test_bf16_needs_compute_capability_8() -> None:
    cfg = load_model_config("llama-3-8b")
    (r,) = gpu_refusals(model(dtype="bfloat16"), cfg, gpu_type("T4"))
    assert r.field == "dtype"
    assert "compute capability 7.5" in r.reason
    assert r.fixes == ("dtype: float16",)
    assert gpu_refusals(model(dtype="float16"), cfg, gpu_type("T4")) == []
    assert gpu_refusals(model(dtype="auto"), cfg, gpu_type("T4")) == []  # vLLM picks fp16
    assert gpu_refusals(model(dtype="bfloat16"), cfg, gpu_type("V100")) != []
    assert gpu_refusals(model(dtype="bfloat16"), cfg, gpu_type("MI300X")) == []


def test_quantization_minimum_capabilities() -> None:
    cfg = load_model_config("llama-3-8b")
    # vLLM 0.32: fp8 weights run from 7.5 (FP8 Marlin, weight-only) - T4 yes, V100 no
    assert gpu_refusals(model(quantization="fp8"), cfg, gpu_type("T4")) == []
    (r,) = gpu_refusals(model(quantization="fp8"), cfg, gpu_type("V100-16GB"))
    assert r.field == "quantization"
    assert "needs compute capability >= 7.5" in r.reason
    assert "quantization: gptq (a GPTQ checkpoint)" in r.fixes
    assert gpu_refusals(model(quantization="gptq"), cfg, gpu_type("V100-16GB")) == []
    assert gpu_refusals(model(quantization="awq"), cfg, gpu_type("V100-16GB")) != []
    # fp8 KV cache: vLLM's Triton attention backend takes it on any capability
    assert gpu_refusals(model(kv_cache_dtype="fp8"), cfg, gpu_type("T4")) == []


def test_mxfp4_checkpoints_need_ampere_and_bf16() -> None:
    oss = load_model_config("gpt-oss-20b")
    refused = gpu_refusals(model(), oss, gpu_type("T4"))
    assert fields(refused) == ["pools", "pools"]
    assert "mxfp4 quantization needs compute capability >= 8.0" in refused[0].reason
    assert refused[0].fixes == refused[1].fixes  # one card fix, however many rules
    assert gpu_refusals(model(), oss, gpu_type("A10G")) == []
    (r,) = model_refusals(model(dtype="float16"), oss)
    assert r.field == "dtype"
    assert r.fixes == ("dtype: bfloat16",)
    (r,) = model_refusals(model(quantization="awq"), oss)
    assert r.field == "quantization"
    assert "quantized with mxfp4" in r.reason


def test_cards_given_only_by_memory_skip_the_card_rules() -> None:
    cfg = load_model_config("llama-3-8b")
    assert gpu_refusals(model(dtype="bfloat16"), cfg, custom_gpu(16)) == []


# --------------------------------------------------------------------------- planner


def test_planner_leaves_out_bf16_on_a_t4_with_the_fp16_fix() -> None:
    spec = fleet(
        [{"name": "q", "config": "qwen2.5-0.5b", "dtype": "bfloat16", "max_model_len": 2048}],
        [pool("T4")],
    )
    result = plan_fleet(spec)
    (u,) = result.unplaced
    assert u.resource == "gpu_capability"
    assert u.reason.startswith("models[0].dtype: ")
    assert u.fixes == ["dtype: float16"]
    fixed = fleet(
        [{"name": "q", "config": "qwen2.5-0.5b", "dtype": "float16", "max_model_len": 2048}],
        [pool("T4")],
    )
    assert plan_fleet(fixed).feasible


def test_planner_leaves_out_a_tp_degree_vllm_refuses() -> None:
    spec = fleet(
        [{"name": "q", "config": "qwen2.5-7b", "tensor_parallel": 8, "max_model_len": 4096}],
        [pool("H100", count=8)],
    )
    (u,) = plan_fleet(spec).unplaced
    assert u.resource == "engine"
    assert u.reason.startswith("models[0].tensor_parallel: 28 attention heads")
    assert u.fixes == ["tensor_parallel: 4"]


def test_planner_leaves_out_a_context_vllm_refuses() -> None:
    spec = fleet([{"name": "l", "config": "llama-3-8b", "max_model_len": 32768}], [pool("H100")])
    (u,) = plan_fleet(spec).unplaced
    assert u.reason.startswith("models[0].max_model_len: ")
    assert u.fixes == ["max_model_len: 8192"]


def test_memory_fixes_never_suggest_a_refused_tp() -> None:
    # qwen2.5-72b (64 heads, 8 KV) on 24 GiB cards: only valid TP degrees are suggested
    spec = fleet(
        [{"name": "q", "config": "qwen2.5-7b", "max_model_len": 32768, "concurrency": 16}],
        [pool("T4", count=8)],
    )
    for u in plan_fleet(spec).unplaced:
        for fix in u.fixes:
            match = re.match(r"tensor_parallel: (\d+)", fix)
            if match:
                assert int(match.group(1)) in valid_tp_degrees(load_model_config("qwen2.5-7b"))


# --------------------------------------------------------------------------- properties

CONFIGS = [
    "qwen2.5-0.5b",
    "qwen2.5-7b",
    "llama-3-8b",
    "llama-3.1-8b",
    "phi-4",
    "gemma-2-2b",
    "qwen3-0.6b",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "gpt-oss-20b",
]
GPUS = ["T4", "V100-16GB", "L4", "A100-80GB", "H100", "MI300X"]


@st.composite
def risky_fleets(draw: st.DrawFn) -> FleetSpec:
    pools = [
        {
            "name": f"p{i}",
            "gpu": {"type": draw(st.sampled_from(GPUS)), "count": draw(st.sampled_from([1, 4, 8]))},
            "cpu": 128,
            "memory_gb": 2048,
            "max_nodes": 2,
        }
        for i in range(draw(st.integers(1, 2)))
    ]
    models: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        config = draw(st.sampled_from(CONFIGS))
        m: dict[str, Any] = {
            "name": f"m{i}",
            "config": config,
            "max_model_len": draw(st.sampled_from([1024, 4096, 4096, 8192, 65536])),
            "concurrency": draw(st.sampled_from([1, 4])),
            "tensor_parallel": draw(st.sampled_from([1, 1, 1, 2, 4, 3, 6, 8])),
            "pipeline_parallel": draw(st.sampled_from([1, 1, 1, 2])),
            "dtype": draw(st.sampled_from(["auto", "auto", "bfloat16", "float16"])),
            "replicas": {"min": 1, "max": 1},
        }
        quant = draw(st.sampled_from([None, None, None, "fp8", "awq", "gptq"]))
        if quant:
            m["quantization"] = quant
        if draw(st.booleans()):
            m["kv_cache_dtype"] = "fp8"
        models.append(m)
    return fleet(models, pools)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=risky_fleets())
def test_a_plan_never_places_a_replica_vllm_would_refuse(spec: FleetSpec) -> None:
    result = plan_fleet(spec, time_limit_s=0.5)
    pools = {p.name: p for p in spec.pools}
    for r in result.replicas:
        m = spec.model(r.model)
        gpu_name = pools[r.pool].gpu
        assert gpu_name is not None
        assert gpu_name.type is not None
        config = load_model_config(m.config or m.source)
        assert engine_refusals(m, config, gpu_type(gpu_name.type)) == []
    assert plan_violations(spec, result) == []


def _apply(m: ModelSpec, fix: str) -> ModelSpec | None:
    match = re.fullmatch(r"(\w+): (\w+)", fix)
    if match is None:
        return None  # a pool/card fix, or a fix with a note
    key, value = match.groups()
    parsed: Any = int(value) if value.isdigit() else value
    return m.model_copy(update={key: parsed})


@settings(max_examples=60, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    tp=st.integers(1, 16),
    pp=st.integers(1, 3),
    dtype=st.sampled_from(["auto", "bfloat16", "float16"]),
    quant=st.sampled_from([None, "fp8", "awq", "gptq"]),
    max_len=st.sampled_from([2048, 40960, 131072, 262144]),
    gpu=st.sampled_from(GPUS),
)
def test_every_suggested_fix_clears_its_refusal(
    config: str, tp: int, pp: int, dtype: str, quant: str | None, max_len: int, gpu: str
) -> None:
    m = model(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        dtype=dtype,
        quantization=quant,
        max_model_len=max_len,
    )
    cfg = load_model_config(config)
    card = gpu_type(gpu)
    for refusal in engine_refusals(m, cfg, card):
        assert refusal.fixes, refusal
        for fix in refusal.fixes:
            fixed = _apply(m, fix)
            if fixed is None:
                continue
            still = [r for r in engine_refusals(fixed, cfg, card) if r.reason == refusal.reason]
            assert still == [], (fix, refusal)


@pytest.mark.parametrize("gpu", ["T4", "V100-16GB", "L4", "H100", "B200", "MI300X"])
def test_default_fleet_models_start_on_every_card(gpu: str) -> None:
    cfg = load_model_config("gemma-3-270m")
    assert engine_refusals(model(max_model_len=4096), cfg, gpu_type(gpu)) == []
