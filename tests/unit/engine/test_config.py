"""EngineConfig: the spec becomes the exact `vllm serve` options, which vLLM's parser takes."""

from __future__ import annotations

import pytest

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.settings import EngineSettings
from fleetserve.spec import ModelSpec, SecretRef

SETTINGS = EngineSettings(
    gpu_memory_utilization=0.17,
    max_num_seqs=16,
    max_model_len=2048,
    max_num_batched_tokens=2048,
)


def config(**model: object) -> EngineConfig:
    spec = ModelSpec.model_validate({"name": "m", "source": "org/m", **model})
    return EngineConfig.from_spec(spec, model_path="/models/m", settings=SETTINGS)


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_settings_and_spec_fields_become_vllm_options() -> None:
    args = config(dtype="bfloat16", tensor_parallel=2, max_num_seqs=16).vllm_cli_args()
    assert option(args, "--model") == "/models/m"
    assert option(args, "--served-model-name") == "m"
    assert option(args, "--gpu-memory-utilization") == "0.17"
    assert option(args, "--max-num-seqs") == "16"
    assert option(args, "--max-model-len") == "2048"
    assert option(args, "--tensor-parallel-size") == "2"
    assert option(args, "--dtype") == "bfloat16"
    assert "--quantization" not in args


def test_engine_args_booleans_lists_and_dicts() -> None:
    args = config(
        engine_args={
            "enable_prefix_caching": False,
            "enforce_eager": True,
            "seed": 7,
            "override_generation_config": {"temperature": 0.5},
        }
    ).vllm_cli_args()
    assert "--no-enable-prefix-caching" in args
    assert "--enforce-eager" in args
    assert option(args, "--seed") == "7"
    assert option(args, "--override-generation-config") == '{"temperature": 0.5}'


def test_hf_token_reference_is_passed_by_env_name_only() -> None:
    cfg = config(hf_token="${MY_HF}")
    assert cfg.hf_token_env == "MY_HF"
    assert "MY_HF" not in " ".join(cfg.vllm_cli_args())


@pytest.mark.parametrize(
    ("ref", "env"),
    [
        ({"env": "KEY_A"}, "KEY_A"),
        ({"secret": "team-a", "key": "api.key"}, "FLEETSERVE_SECRET_TEAM_A_API_KEY"),
    ],
)
def test_secret_env_names(ref: dict[str, str], env: str) -> None:
    assert SecretRef.model_validate(ref).env_name == env
