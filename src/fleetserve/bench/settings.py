"""Typed settings of one ``fleetserve bench`` run (built from the command line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.load import LoadPoint
from fleetserve.bench.slo import Slo


class WorkloadSettings(BaseModel):
    """Where prompts come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["synthetic", "prompts", "shared-prefix", "sharegpt"] = Field(
        description="Workload type."
    )
    prompts: Path | None = Field(default=None, description="Prompt file, one per line.")
    sharegpt: Path | None = Field(default=None, description="ShareGPT JSON file.")
    input_len: LengthDistribution = Field(
        default=LengthDistribution(kind="fixed", low=128, high=128, mean=128),
        description="Prompt (or suffix, shared-prefix) tokens.",
    )
    output_len: LengthDistribution | None = Field(
        default=None, description="Generated tokens asked for (default 128; sharegpt: replies)."
    )
    prefix_groups: int = Field(default=4, ge=1, le=10_000, description="Shared-prefix groups.")
    prefix_len: int = Field(default=512, ge=1, le=1_000_000, description="Shared prefix tokens.")

    @model_validator(mode="after")
    def _check(self) -> WorkloadSettings:
        if self.kind == "prompts" and self.prompts is None:
            raise ValueError("prompts workload needs a prompt file")
        if self.kind == "sharegpt" and self.sharegpt is None:
            raise ValueError("sharegpt workload needs a file")
        return self


class BenchSettings(BaseModel):
    """Everything one run needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1, description="Endpoint base URL (with or without /v1).")
    model: str = Field(min_length=1, description="Model id to request.")
    endpoint: Literal["chat", "completions"] = Field(default="chat", description="OpenAI API.")
    label: str | None = Field(default=None, description="Run name in reports.")
    workload: WorkloadSettings = Field(description="Prompt source.")
    points: list[LoadPoint] = Field(min_length=1, description="Load points (a sweep if >1).")
    num_requests: int | None = Field(default=None, ge=1, le=10_000_000, description="Per point.")
    duration_s: float | None = Field(default=None, gt=0, le=86_400, description="Per point.")
    warmup: int = Field(default=0, ge=0, le=1_000_000, description="Excluded requests per point.")
    seed: int = Field(default=0, ge=0, description="Seed of prompts and arrivals.")
    tokenizer: Path | None = Field(default=None, description="Local tokenizer directory.")
    ignore_eos: Literal["auto", "on", "off"] = Field(default="auto", description="ignore_eos.")
    slo: Slo | None = Field(default=None, description="Goodput SLO.")
    timeout_s: float = Field(default=600, gt=0, le=86_400, description="Per-request timeout.")
    api_key: str | None = Field(default=None, repr=False, description="Bearer token.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Merged into bodies.")
    output: Path | None = Field(default=None, description="JSON report path.")
    markdown: Path | None = Field(default=None, description="Markdown report path.")
    plots: Path | None = Field(default=None, description="Directory for PNG plots.")
    results: Path | None = Field(default=None, description="Prompt/response file.")
    progress: bool = Field(default=True, description="Live progress on a terminal.")

    @model_validator(mode="after")
    def _check(self) -> BenchSettings:
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError(
                f"give --num-requests ({self.num_requests}) or --duration "
                f"({self.duration_s:g}s), not both"
            )
        return self
