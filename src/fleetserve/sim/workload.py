"""What the simulated clients send: request streams per model, or a recorded bench run.

A workload file (YAML) lists streams; each sends requests for one model on one of bench's
load shapes (:class:`fleetserve.bench.load.LoadPoint`: closed-loop concurrency, open-loop
Poisson / gamma / constant rate, bursts) with bench's length distributions
(:class:`fleetserve.bench.lengths.LengthDistribution`) and optionally a shared prefix
(``prefix_groups`` groups of ``prefix_len`` tokens, as ``bench --shared-prefix``: what makes
prefix-cache hits and prefix routing matter)::

    duration_s: 3600
    streams:
      - model: chat
        load: {kind: rate, rate: 40, arrival: gamma, burstiness: 0.5}
        input_len: uniform:64-1024
        output_len: normal:256,64
      - model: summarise
        load: {kind: concurrency, concurrency: 8}
        input_len: 4096
        output_len: 256
        prefix_groups: 4
        prefix_len: 1024

A bench report (``fleetserve bench --output run.json``) is replayed point by point
(:func:`trace_streams`): every record's prompt and output tokens in order, closed-loop
points (``c=N``) at their concurrency, open-loop points at the recorded send times. That is
what makes ``fleetserve bench compare measured.json simulated.json`` a like-for-like check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.load import LoadPoint
from fleetserve.bench.report import BenchReport
from fleetserve.errors import InputFileError
from fleetserve.inputfile import read_text, validate
from fleetserve.sampling import GENERATION_KEYS
from fleetserve.yamlsafe import load_yaml


class StreamSpec(BaseModel):
    """One stream of requests for one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="Model name (a spec model's name).")
    label: str | None = Field(
        default=None, description="Point label in the report (default: the load's label)."
    )
    load: LoadPoint = Field(description="Load shape (bench's: concurrency, rate or burst).")
    input_len: LengthDistribution = Field(
        default=LengthDistribution(kind="fixed", low=128, high=128, mean=128),
        description="Prompt tokens (after the shared prefix): N, uniform:LO-HI, normal:M,S.",
    )
    output_len: LengthDistribution = Field(
        default=LengthDistribution(kind="fixed", low=128, high=128, mean=128),
        description="Generated tokens.",
    )
    prefix_groups: int = Field(default=0, ge=0, le=1_000_000, description="Shared prefixes.")
    prefix_len: int = Field(default=0, ge=0, le=1_000_000, description="Tokens per prefix.")
    num_requests: int | None = Field(default=None, ge=1, description="Stop after this many.")
    duration_s: float | None = Field(default=None, gt=0, description="Stop sending after (s).")
    warmup: int = Field(default=0, ge=0, description="First requests excluded from stats.")
    sampling: dict[str, float] = Field(
        default_factory=dict,
        description="Sampling parameters the requests set (vLLM's generation keys: "
        "temperature, top_p, top_k, min_p and the repetition, presence and frequency "
        "penalties), over the model's defaults; empty: the server's "
        "defaults. Top-p sorts the vocabulary, a CPU engine's largest per-sequence cost.",
    )

    @field_validator("sampling")
    @classmethod
    def _sampling_keys(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(GENERATION_KEYS))
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: not a sampling parameter the model's engine takes "
                f"(one of {', '.join(GENERATION_KEYS)})"
            )
        return value

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _parse_length(cls, value: Any) -> Any:
        if isinstance(value, int | str):
            return LengthDistribution.parse(str(value))
        return value

    @property
    def point_label(self) -> str:
        return self.label or self.load.label


class WorkloadSpec(BaseModel):
    """A workload file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    streams: list[StreamSpec] = Field(min_length=1, description="Request streams.")
    duration_s: float | None = Field(
        default=None, gt=0, description="Default sending time of streams without a bound (s)."
    )
    seed: int = Field(default=0, ge=0, description="Seed of lengths and arrivals.")


def load_workload(path: Path) -> WorkloadSpec:
    """Read a workload YAML; errors name the file and the field path."""
    raw = load_yaml(read_text(path), str(path))
    return validate(WorkloadSpec, raw, path)


class TraceRequest(BaseModel):
    """One recorded request to replay."""

    model_config = ConfigDict(frozen=True)

    tokens_in: int
    tokens_out: int
    scheduled: float
    warmup: bool
    group: int = -1


class TracePoint(BaseModel):
    """One recorded load point to replay."""

    model_config = ConfigDict(frozen=True)

    model: str
    label: str
    x: float
    concurrency: int | None
    """Closed-loop concurrency (None: replay the send times)."""
    requests: list[TraceRequest]
    prefix_len: int = 0


_CONCURRENCY = re.compile(r"^c=(\d+)$")


def trace_points(report: BenchReport, model: str | None = None) -> list[TracePoint]:
    """The load points of a bench report, as replayable traces (see the module note)."""
    name = model or report.run.model
    prefix = 0
    match = re.search(r"shared-prefix groups=(\d+) prefix=(\d+)", report.run.workload)
    if match:
        prefix = int(match.group(2))
    by_point: dict[str, list[dict[str, Any]]] = {}
    for rec in report.records:
        by_point.setdefault(str(rec.get("point")), []).append(rec)
    # The server's own counts (``usage``) first: they are what the engine computed. The
    # client's re-tokenisation of the streamed text differs from them where the text does
    # not round-trip (dummy weights' random tokens: 116-135 for 128 generated, H100 runs),
    # and replaying those lengths desynchronises streams the real run kept in step.
    outs = [n for r in report.records if (n := _count(r, "out"))]
    fallback_out = round(sum(outs) / len(outs)) if outs else 128
    points: list[TracePoint] = []
    for summary in report.points:
        recs = sorted(by_point.get(summary.label, []), key=lambda r: int(r["id"]))
        if not recs:
            continue
        origin = min(float(r.get("scheduled") or 0.0) for r in recs)
        requests = [
            TraceRequest(
                tokens_in=_count(r, "in") or 1,
                tokens_out=_count(r, "out") or fallback_out,
                scheduled=float(r.get("scheduled") or 0.0) - origin,
                warmup=bool(r.get("warmup")),
                group=int(r["group"]) if r.get("group") is not None else -1,
            )
            for r in recs
        ]
        m = _CONCURRENCY.match(summary.label)
        points.append(
            TracePoint(
                model=name,
                label=summary.label,
                x=summary.x,
                concurrency=int(m.group(1)) if m else None,
                requests=requests,
                prefix_len=prefix,
            )
        )
    if not points:
        raise InputFileError(f"{report.run.label}: the bench report has no request records")
    return points


def _count(record: dict[str, Any], side: str) -> int:
    """A record's ``in``/``out`` tokens: the server's ``usage`` count, else the client's
    (see :func:`trace_points`); 0 when it has neither."""
    return int(record.get(f"usage_{side}") or record.get(f"tokens_{side}") or 0)
