"""The run report: settings, per-point summaries and every per-request record.

Stored as JSON (``--output``; format ``fleetserve-bench/1``), read back by
``fleetserve bench compare``. Strict on read: unknown keys or a wrong format name are errors
that name the file.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.bench.metrics import PointSummary
from fleetserve.inputfile import load_tagged, save_json

REPORT_FORMAT = "fleetserve-bench/1"


class RunInfo(BaseModel):
    """What was measured, and how."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(description="Name of the run (defaults to the model).")
    base_url: str = Field(description="Endpoint base URL.")
    model: str = Field(description="Model id sent in requests.")
    endpoint: Literal["chat", "completions"] = Field(description="OpenAI API used.")
    workload: str = Field(description="Workload description.")
    seed: int = Field(description="Seed of the request stream and arrivals.")
    num_requests: int | None = Field(default=None, description="Measured requests per point.")
    duration_s: float | None = Field(default=None, description="Seconds per point.")
    warmup: int = Field(ge=0, description="Warm-up requests per point (excluded).")
    ignore_eos: bool = Field(description="Whether ignore_eos was sent.")
    ignore_eos_note: str = Field(default="", description="How ignore_eos was decided.")
    tokens_source: str = Field(description="How tokens were counted.")
    prompt_lengths: str = Field(description="'exact (tokenizer)' or 'approximate'.")
    slo: str = Field(default="none", description="SLO used for goodput.")
    sampling: dict[str, float] = Field(
        default_factory=dict,
        description="Sampling parameters every request set (vLLM's generation keys in "
        "--extra-body: temperature, top_p, top_k, min_p, the penalties); empty: the "
        "server's defaults. A replay (simulate --trace, plan calibrate) runs the engines "
        "as they served them.",
    )
    started_at: str = Field(description="Wall-clock start (ISO 8601, UTC).")
    monotonic_origin: float = Field(
        description="perf_counter() at the origin of record times (same-host correlation)."
    )
    version: str = Field(description="fleetserve version.")
    interrupted: bool = Field(
        default=False, description="The run was interrupted; the last point is partial."
    )


class BenchReport(BaseModel):
    """A complete run."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["fleetserve-bench/1"] = Field(
        default="fleetserve-bench/1", description="Report format and version."
    )
    run: RunInfo
    points: list[PointSummary]
    records: list[dict[str, Any]] = Field(
        default_factory=list, description="Every request record (see RequestRecord)."
    )

    def save(self, path: Path) -> None:
        save_json(self, path)

    @classmethod
    def load(cls, path: Path) -> BenchReport:
        return load_tagged(cls, path, REPORT_FORMAT, "bench report")

    def with_points(self, labels: Collection[str]) -> BenchReport:
        """This report cut to the load points ``labels``: their summaries and records (a
        calibration on some points of a sweep, a prediction of the others)."""
        return self.model_copy(
            update={
                "points": [p for p in self.points if p.label in labels],
                "records": [r for r in self.records if r.get("point") in labels],
            }
        )
