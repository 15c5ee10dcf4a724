"""Quantized checkpoints (issue #29 item 4): a config.json's ``quantization_config`` sizes
the weights and decides the cards, with no spec field.

The fixtures under tests/fixtures/plan/quantized/ carry the architecture and the
``quantization_config`` of published checkpoints (config.json on the Hugging Face hub):

* llama-3.1-8b-awq: hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4 (AutoAWQ GEMM,
  4 bit, group 128, zero points);
* qwen2.5-7b-gptq-int4: Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4 (4 bit, group 128, sym);
* llama-3.1-8b-w4a16: RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16
  (compressed-tensors pack-quantized, int4 group 128 symmetric, ignore lm_head);
* llama-3.1-8b-fp8-ct: RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 (compressed-tensors
  float-quantized, fp8 weights and activations per tensor, ignore lm_head);
* llama-3-8b-bnb-4bit: unsloth/llama-3-8b-bnb-4bit (nf4, double quantization).

Expected bytes are computed here from the architecture numbers, not from ModelConfig.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetserve.cli import main
from fleetserve.errors import SpecError
from fleetserve.plan.gpus import gpu_type
from fleetserve.plan.memory import load_model_config, parse_config, weight_bytes
from fleetserve.plan.sizing import model_config_for
from fleetserve.plan.vllm_rules import gpu_refusals, model_refusals
from fleetserve.spec import ModelSpec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "plan" / "quantized"


def fixture(name: str) -> Path:
    return FIXTURES / name / "config.json"


def model(**fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"name": "m", "source": "x", **fields})


# Llama 3 / 3.1 8B: hidden 4096, MLP 14336, 32 layers, 32 heads of 128, 8 KV heads,
# vocabulary 128256, untied head
LLAMA_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
LLAMA_KEPT = 2 * 128256 * 4096 + 32 * 2 * 4096 + 4096  # embeddings + head, norms
# Qwen2.5 7B: hidden 3584, MLP 18944, 28 layers, 28 heads of 128, 4 KV heads, q/k/v biases
QWEN_LINEAR = 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944)
QWEN_KEPT = 2 * 152064 * 3584 + 28 * (2 * 3584 + 3584 + 2 * 512) + 3584


def test_awq_checkpoint_is_4_bits_plus_fp16_scale_and_4_bit_zero_per_128() -> None:
    cfg = load_model_config(fixture("llama-3.1-8b-awq"))
    assert cfg.checkpoint_quant is not None
    assert (cfg.checkpoint_quant.scheme, cfg.checkpoint_quant.bits) == ("awq", 4)
    expected = LLAMA_KEPT * 2 + LLAMA_LINEAR // 2 + LLAMA_LINEAR // 128 * (2 + 4 / 8)
    assert weight_bytes(cfg) == pytest.approx(expected, abs=8)
    assert weight_bytes(cfg) / 1e9 == pytest.approx(5.73, abs=0.02)  # the hub's 5.73 GB
    # no spec field: the same bytes as a spec 'quantization: awq' of the same checkpoint
    assert weight_bytes(cfg, quant="awq") == weight_bytes(cfg)


def test_gptq_checkpoint_packs_zeros_even_when_symmetric() -> None:
    cfg = load_model_config(fixture("qwen2.5-7b-gptq-int4"))
    assert cfg.checkpoint_quant is not None
    assert cfg.checkpoint_quant.label == "gptq"
    expected = QWEN_KEPT * 2 + QWEN_LINEAR // 2 + QWEN_LINEAR / 128 * (2 + 4 / 8)
    assert weight_bytes(cfg) == pytest.approx(expected, abs=8)
    # 8-bit, group 32: twice the data, four times the groups
    raw = json.loads(fixture("qwen2.5-7b-gptq-int4").read_text())
    raw["quantization_config"].update(bits=8, group_size=32)
    eight = parse_config(raw, "gptq-8")
    expected = QWEN_KEPT * 2 + QWEN_LINEAR + QWEN_LINEAR / 32 * (2 + 8 / 8)
    assert weight_bytes(eight) == pytest.approx(expected, abs=8)


def test_compressed_tensors_w4a16_keeps_ignored_modules_in_bf16() -> None:
    cfg = load_model_config(fixture("llama-3.1-8b-w4a16"))
    assert cfg.checkpoint_quant is not None
    assert cfg.checkpoint_quant.label == "compressed-tensors W4A16"
    assert cfg.checkpoint_quant.unquantized == ("lm_head",)
    # symmetric: a bf16 scale per group of 128 and no zero point
    expected = LLAMA_KEPT * 2 + LLAMA_LINEAR // 2 + LLAMA_LINEAR // 128 * 2
    assert weight_bytes(cfg) == pytest.approx(expected, abs=8)
    # an ignore list naming every layer's attention keeps those in bf16
    raw = json.loads(fixture("llama-3.1-8b-w4a16").read_text())
    raw["quantization_config"]["ignore"] = ["lm_head", "re:.*self_attn.*"]
    attn = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
    mlp = LLAMA_LINEAR - attn
    kept_attn = parse_config(raw, "w4a16-attn-kept")
    expected = (LLAMA_KEPT + attn) * 2 + mlp // 2 + mlp // 128 * 2
    assert weight_bytes(kept_attn) == pytest.approx(expected, abs=8)
    # ... and one layer's MLP, that layer only (a projection counts its whole MLP: the
    # estimate errs towards more bytes)
    raw["quantization_config"]["ignore"] = ["model.layers.0.mlp.down_proj"]
    one = parse_config(raw, "w4a16-layer-0")
    raw["quantization_config"]["ignore"] = ["re:.*layers.5.feed_forward$"]  # Llama 4's name
    assert weight_bytes(parse_config(raw, "w4a16-layer-5")) == weight_bytes(one)
    per_layer_mlp = 3 * 4096 * 14336
    expected = (LLAMA_KEPT + per_layer_mlp) * 2 + (LLAMA_LINEAR - per_layer_mlp) * (1 / 2 + 2 / 128)
    assert weight_bytes(one) == pytest.approx(expected, rel=1e-6)


def test_compressed_tensors_fp8_is_one_byte_per_weight() -> None:
    cfg = load_model_config(fixture("llama-3.1-8b-fp8-ct"))
    assert cfg.checkpoint_quant is not None
    assert cfg.checkpoint_quant.label == "compressed-tensors W8A8-FP8"
    assert weight_bytes(cfg) == LLAMA_KEPT * 2 + LLAMA_LINEAR  # per-tensor scales: 4 bytes
    # NVFP4 (float 4-bit weights and activations) is not mistaken for FP8
    raw = json.loads(fixture("llama-3.1-8b-fp8-ct").read_text())
    group = raw["quantization_config"]["config_groups"]["group_0"]
    group["weights"]["num_bits"] = group["input_activations"]["num_bits"] = 4
    fp4 = parse_config(raw, "nvfp4").checkpoint_quant
    assert fp4 is not None
    assert fp4.label == "compressed-tensors W4A4-FP4"


def test_bitsandbytes_nf4_with_double_quantization() -> None:
    cfg = load_model_config(fixture("llama-3-8b-bnb-4bit"))
    assert cfg.checkpoint_quant is not None
    assert cfg.checkpoint_quant.label == "bitsandbytes nf4"
    # an 8-bit absmax per 64 weights, and an fp32 per 256 of those
    expected = LLAMA_KEPT * 2 + LLAMA_LINEAR // 2 + LLAMA_LINEAR / 64 * (1 + 4 / 256)
    assert weight_bytes(cfg) == pytest.approx(expected, abs=8)


def test_a_checkpoint_directory_is_read_though_its_name_is_a_catalogue_alias() -> None:
    # the catalogue reads ".../llama-3-8b-bnb-4bit" as llama-3-8b; the directory must win
    cfg = load_model_config(fixture("llama-3-8b-bnb-4bit").parent)
    assert cfg.checkpoint_quant is not None
    assert load_model_config("unsloth/llama-3-8b-bnb-4bit").checkpoint_quant is None


def test_a_spec_quantization_on_a_differently_quantized_checkpoint_names_both() -> None:
    cfg = load_model_config(fixture("llama-3.1-8b-w4a16"))
    (r,) = model_refusals(model(quantization="awq"), cfg)
    assert r.field == "quantization"
    assert "quantized with compressed-tensors" in r.reason
    assert "--quantization awq" in r.reason
    awq = load_model_config(fixture("llama-3.1-8b-awq"))
    assert model_refusals(model(quantization="awq"), awq) == []


@pytest.mark.parametrize(
    ("name", "refused_on", "held_on", "need"),
    [
        ("llama-3.1-8b-awq", "V100-16GB", "T4", "awq quantization needs compute capability >= 7.5"),
        (
            "llama-3.1-8b-w4a16",
            "V100-32GB",
            "T4",
            "compressed-tensors W4A16 quantization needs compute capability >= 7.5",
        ),
        (
            "llama-3.1-8b-fp8-ct",
            "V100-32GB",
            "T4",  # below 8.9 vLLM falls back to weight-only FP8 (W8A16)
            "compressed-tensors W8A8-FP8 quantization needs compute capability >= 7.5",
        ),
    ],
)
def test_a_card_below_the_schemes_capability_is_refused_naming_it(
    name: str, refused_on: str, held_on: str, need: str
) -> None:
    cfg = load_model_config(fixture(name))
    (r,) = gpu_refusals(model(), cfg, gpu_type(refused_on))
    assert r.field == "pools"
    assert need in r.reason
    assert "has compute capability 7.0" in r.reason
    assert gpu_refusals(model(), cfg, gpu_type(held_on)) == []


def test_gptq_runs_on_a_v100() -> None:
    cfg = load_model_config(fixture("qwen2.5-7b-gptq-int4"))
    assert gpu_refusals(model(), cfg, gpu_type("V100-16GB")) == []  # auto_gptq.py: 6.0


def test_bitsandbytes_is_refused_as_vllm_cannot_load_it() -> None:
    cfg = load_model_config(fixture("llama-3-8b-bnb-4bit"))
    (r,) = model_refusals(model(), cfg)
    assert r.field == "config"
    assert "bitsandbytes nf4" in r.reason
    assert "no bitsandbytes quantization method" in r.reason


@pytest.mark.parametrize(
    ("quantization_config", "message"),
    [
        ({"quant_method": "awq", "bits": "four"}, "'quantization_config.bits' must be an integer"),
        ({"quant_method": "bitsandbytes"}, "must set load_in_4bit or load_in_8bit"),
        ({"quant_method": "compressed-tensors"}, "'quantization_config.config_groups' must"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {"weights": {"num_bits": 4}, "input_activations": {"num_bits": "8"}}
                },
            },
            "'quantization_config.config_groups.g.input_activations.num_bits' must be an int",
        ),
        (
            {"quant_method": "awq", "modules_to_not_convert": ["frobnicator"]},
            "ignores 'frobnicator'",
        ),
    ],
)
def test_a_bad_quantization_config_names_its_key(
    quantization_config: dict[str, Any], message: str
) -> None:
    raw = json.loads(fixture("llama-3.1-8b-awq").read_text())
    raw["quantization_config"] = quantization_config
    with pytest.raises(SpecError, match=message):
        parse_config(raw, "bad")


# --------------------------------------------------------------------------- config paths


def test_a_config_path_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "x" / "config.json"
    with pytest.raises(SpecError, match=rf"^models\[3\]\.config: {missing} does not exist$"):
        model_config_for(model(config=str(missing)), index=3)
    with pytest.raises(SpecError, match=r"models\[0\]\.config: llama-9b\.json does not exist"):
        model_config_for(model(config="llama-9b.json"), index=0)
    # a name that is not a path is still a catalogue miss, and a hub id as source too
    with pytest.raises(SpecError, match="names no known model config"):
        model_config_for(model(config="llama-9-900b"), index=0)
    with pytest.raises(SpecError, match="names no known model config"):
        model_config_for(model(source="someone/llama-9-900b"), index=0)


# --------------------------------------------------------------------------- end to end


def _spec(tmp_path: Path, config: Path | str, gpu: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"models:\n  - name: m\n    source: m\n    config: {config}\n    max_model_len: 4096\n"
        f"pools:\n  - name: p\n    gpu: {{type: {gpu}, count: 1}}\n"
    )
    return str(path)


def test_plan_sizes_an_awq_checkpoint_from_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec(tmp_path, fixture("llama-3.1-8b-awq"), "T4")
    assert main(["plan", path, "--format", "json", "--time-limit", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    (replica,) = data["replicas"]
    # 5.3 GiB of weights on a 15 GiB T4 (in float16 the weights alone are 15 GiB)
    assert replica["gpu_type"] == "T4"
    assert replica["memory_mb"] < 14 * 1024


def test_plan_refuses_a_card_below_the_schemes_capability(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec(tmp_path, fixture("llama-3.1-8b-w4a16"), "V100-32GB")
    assert main(["plan", path, "--format", "json", "--time-limit", "1"]) == 1
    (unplaced,) = json.loads(capsys.readouterr().out)["unplaced"]
    assert unplaced["resource"] == "gpu_capability"
    assert (
        "compressed-tensors W4A16 quantization needs compute capability >= 7.5; V100-32GB "
        "has compute capability 7.0" in unplaced["reason"]
    )


def test_plan_of_a_missing_config_path_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "config.json"
    assert main(["plan", _spec(tmp_path, missing, "T4")]) == 2
    err = capsys.readouterr().err
    assert f"models[0].config: {missing} does not exist" in err
    assert "Traceback" not in err
