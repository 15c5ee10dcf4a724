"""Fit the performance model's constants to measured bench runs (``fleetserve plan
calibrate``).

Design note. The constants (:class:`fleetserve.perf.Calibration`: compute and bandwidth
efficiency, per-step and per-sequence overhead, the per-request serving latency, a
replica's intake time per request and - GPU engines only - the host time per layer of a
step launched outside CUDA graphs) are fitted
by replaying each measured run in the simulator - the same requests, in the same order, at
the same concurrency or send times, on the same planned engine - and minimising, with
``scipy.optimize.least_squares``, the log ratios simulated/measured of every point's output
throughput, TPOT p50 and TTFT p50/p90: the numbers the predictions are judged on. Fitting
through the simulator rather than through per-step formulas means the queueing, batching
and chunked prefill the simulator models are part of the fit, so the constants describe the
engine and not the load shape of the runs that measured it.

The parameters are searched in log space (they span decades), bounded to physical ranges,
with a weak pull toward the backend's defaults so that a constant the runs cannot
distinguish (e.g. per-token against compute cost when every prompt has the same length)
stays at a sane value instead of wandering. The fit's RMS relative error is recorded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from fleetserve.bench.metrics import PointSummary, mean_in_flight, summarize
from fleetserve.bench.record import RequestRecord
from fleetserve.bench.report import BenchReport
from fleetserve.errors import UsageError
from fleetserve.perf.calibration import Calibration, FitInfo
from fleetserve.sim.fleet import ModelSetup
from fleetserve.sim.run import simulate_traces

#: Fitted constants, their bounds, and the weight of each metric in the residuals.
PARAMS: tuple[tuple[str, float, float], ...] = (
    ("compute_efficiency", 1e-3, 1.0),
    ("bandwidth_efficiency", 1e-3, 1.0),
    ("step_overhead_s", 1e-5, 5.0),
    ("seq_overhead_s", 1e-7, 1.0),
    ("sort_s_per_compare", 1e-12, 1e-7),
    ("request_overhead_s", 1e-4, 10.0),
    ("admission_s", 1e-5, 0.5),
    ("layer_launch_s", 1e-5, 0.01),
    ("time_slice_s", 1e-4, 0.05),
)
#: Constants only a GPU engine has: a CPU fit leaves them as they start (no CUDA graphs,
#: so no launch term, and no turns on a card: :class:`fleetserve.perf.EnginePerf`). Runs of
#: one model at a time cannot tell the turn either; the prior keeps it where it starts.
GPU_ONLY = frozenset({"layer_launch_s", "time_slice_s"})
#: Constants a GPU fit leaves as they start: the top-p sort runs on the card there, a few
#: kernels of a step's hundreds (0: :mod:`fleetserve.sampling`). A CPU fit on runs
#: whose model samples greedily cannot tell it either; the prior keeps it where it starts.
CPU_ONLY = frozenset({"sort_s_per_compare"})


def fitted_params(backend: str) -> list[tuple[str, float, float]]:
    """The constants a fit on ``backend``'s runs searches, with their bounds."""
    skip = CPU_ONLY if backend == "cuda" else GPU_ONLY
    return [p for p in PARAMS if p[0] not in skip]


METRICS: tuple[tuple[str, float], ...] = (
    ("output_throughput", 1.0),
    ("tpot.p50", 1.0),
    ("ttft.p50", 0.7),
    ("ttft.p90", 0.5),
)
#: Weight of the pull toward the defaults, per unit of log distance.
PRIOR_WEIGHT = 0.05
#: On a GPU the efficiencies get a firmer pull: runs of one model cannot tell a decode
#: step's fixed host overhead from its weight reads (both are paid once per step at any
#: batch), nor a request's serving latency from its prefill compute (one prompt length),
#: so a one-size fit trades them freely - 4B runs on an H100 fitted bandwidth 0.81 and
#: step 1.5 ms, 12B runs 0.86 and 2.5 ms, 1B runs 0.74 and 1.2 ms, and each predicted the
#: other sizes 20-80 % off. A card's efficiencies are properties of its kernels, near the
#: defaults on every size (derived by hand from the same runs: ~0.6 and ~0.8), while the
#: overheads are the host's and the serving path's, free to move. CPU hosts differ too
#: much in both for such a prior.
GPU_EFFICIENCY_PRIOR_WEIGHT = 1.0


def _metric(summary: PointSummary, path: str) -> float | None:
    value: object = summary
    for part in path.split("."):
        value = getattr(value, part)
    return None if value is None else float(value)  # type: ignore[arg-type]


def with_calibration(models: Sequence[ModelSetup], cal: Calibration) -> list[ModelSetup]:
    """``models`` with every engine's constants replaced by ``cal``."""
    out = []
    for m in models:
        replicas = tuple(dataclasses.replace(r, perf=r.perf.recalibrated(cal)) for r in m.replicas)
        out.append(dataclasses.replace(m, replicas=replicas))
    return out


def prediction_errors(
    measured: dict[str, BenchReport], simulated: dict[str, BenchReport]
) -> list[tuple[str, str, str, float, float]]:
    """(model, point, metric, measured, simulated) for every metric both runs have."""
    rows = []
    for model, real in measured.items():
        sim = simulated.get(model)
        if sim is None:
            continue
        by_label = {p.label: p for p in sim.points}
        for point in real.points:
            other = by_label.get(point.label)
            if other is None:
                continue
            for name, _ in METRICS:
                a, b = _metric(point, name), _metric(other, name)
                if a is not None and b is not None and a > 0:
                    rows.append((model, point.label, name, a, b))
    return rows


def overlap(reports: Mapping[str, BenchReport]) -> dict[str, BenchReport]:
    """Runs measured (or simulated) at the same time, each point cut to the requests that
    ran while every run of the group was running: sent after the last run's first request,
    ended before the first run's last request.

    Why. Engines that share a card slow each other only while both step, and runs of
    different lengths do not end together: the pair of the GPU validation (a 4B and a 12B
    at c = 1 on one H100) had 19 of the 12B's 32 requests run after the 4B had finished,
    so the 12B's whole-run p50s were its speed alone (TPOT 11.2 ms) while it ran at 23.4
    ms beside the 4B. Scoring a co-location model on whole runs scores the runs' lengths.
    Reports without records, or points missing from a run, are left as they are.
    """
    runs = {name: report for name, report in reports.items() if report.records}
    if len(runs) < 2:
        return dict(reports)
    by_run = {
        name: [RequestRecord(**r) for r in report.records if not r.get("warmup")]
        for name, report in runs.items()
    }
    out = dict(reports)
    labels = set.intersection(*({p.label for p in r.points} for r in runs.values()))
    cut: dict[str, dict[str, PointSummary]] = {name: {} for name in runs}
    for label in labels:
        records = {name: [r for r in recs if r.point == label] for name, recs in by_run.items()}
        if not all(records.values()):
            continue
        begin = max(min(r.start for r in recs) for recs in records.values())
        end = min(max(r.end for r in recs) for recs in records.values())
        for name, recs in records.items():
            point = next(p for p in runs[name].points if p.label == label)
            kept = [r for r in recs if r.start >= begin and r.end <= end]
            if kept:
                cut[name][label] = summarize(label, point.x, kept, None)
    for name, report in runs.items():
        points = [cut[name].get(p.label, p) for p in report.points]
        out[name] = report.model_copy(update={"points": points})
    return out


def load_range(reports: Sequence[BenchReport]) -> tuple[float, float] | None:
    """Fewest and most requests in flight on average over a load point of ``reports``
    (:func:`fleetserve.bench.metrics.mean_in_flight`; reports without records: None)."""
    loads = []
    for report in reports:
        by_point: dict[str, list[RequestRecord]] = {}
        for r in report.records:
            by_point.setdefault(str(r.get("point")), []).append(RequestRecord(**r))
        loads += [mean_in_flight(recs) for recs in by_point.values()]
    loads = [x for x in loads if x > 0]
    return (min(loads), max(loads)) if loads else None


#: A replica's mean load past this many times the largest one a calibration was fitted on
#: is called out: the CPU runs fitted at c = 1 and 4 priced c = 8's TPOT 11 % and c = 16's
#: 23 % too fast (docs/benchmarks.md, "Capacity simulator").
EXTRAPOLATED = 2.0


def beyond_calibration(
    reports: Mapping[str, BenchReport], models: Sequence[ModelSetup], fitted: float
) -> list[str]:
    """One line per model whose replicas ran, at some simulated point, more than
    :data:`EXTRAPOLATED` times the ``fitted`` requests in flight (the most a calibration's
    runs had on average), at its busiest point; a model's load is shared evenly by its
    planned replicas."""
    replicas = {m.name: max(1, len(m.replicas)) for m in models}
    lines = []
    for model, report in reports.items():
        loads = [
            (p.mean_in_flight / replicas.get(model, 1), p.label)
            for p in report.points
            if p.mean_in_flight is not None
        ]
        if not loads:
            continue
        load, label = max(loads)
        if load > EXTRAPOLATED * fitted:
            lines.append(
                f"{model}: {load:.1f} requests in flight a replica at {label}, past the "
                f"{fitted:.1f} of the calibration's runs: its per-sequence costs are "
                "extrapolated there"
            )
    return lines


def fit(
    models: Sequence[ModelSetup],
    runs: Sequence[tuple[BenchReport, str | None]],
    *,
    start: Calibration,
    max_evaluations: int = 200,
) -> Calibration:
    """Constants that make the simulator reproduce ``runs`` (see the module note)."""
    if not runs:
        raise UsageError("plan calibrate: give at least one bench report")
    measured = {(model or report.run.model): report for report, model in runs}
    # A constant the start leaves at 0 (admission) starts mid-range (log scale): at its
    # lower bound it would change no replay, and the search would never move it.
    params = fitted_params(start.backend)
    lo = np.array([math.log(b) for _, b, _ in params])
    hi = np.array([math.log(b) for _, _, b in params])
    values = [getattr(start, name) for name, _, _ in params]
    x0 = np.array(
        [math.log(v) if v > 0 else mid for v, mid in zip(values, (lo + hi) / 2, strict=True)]
    )
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def calibration(x: np.ndarray) -> Calibration:
        values = {name: float(math.exp(v)) for (name, _, _), v in zip(params, x, strict=True)}
        return start.model_copy(update=values)

    def residuals(x: np.ndarray) -> np.ndarray:
        cal = calibration(x)
        outcome = simulate_traces(
            with_calibration(models, cal), runs, request_overhead_s=cal.request_overhead_s
        )
        weights = dict(METRICS)
        res = [
            weights[metric] * math.log(max(sim, 1e-9) / real)
            for _, _, metric, real, sim in prediction_errors(measured, outcome.reports)
        ]
        res += list(prior * (x - x0))
        return np.array(res)

    prior = np.array(
        [
            GPU_EFFICIENCY_PRIOR_WEIGHT
            if start.backend == "cuda" and name.endswith("_efficiency")
            else PRIOR_WEIGHT
            for name, _, _ in params
        ]
    )

    # Several starts: the per-sequence and per-step costs trade off against bandwidth, and
    # from the defaults alone the search stops in the nearest valley. Starts differ in the
    # split of a decode step between per-step and per-sequence cost.
    seq_i = [name for name, _, _ in params].index("seq_overhead_s")
    step_i = [name for name, _, _ in params].index("step_overhead_s")
    result = None
    for seq, step in ((None, None), (0.03, 0.03), (0.003, 0.06), (0.0003, 0.01)):
        x = x0.copy()
        if seq is not None and step is not None:
            x[seq_i], x[step_i] = math.log(seq), math.log(step)
        x = np.clip(x, lo + 1e-9, hi - 1e-9)
        found = least_squares(
            residuals, x, bounds=(lo, hi), diff_step=0.05, max_nfev=max_evaluations, method="trf"
        )
        if result is None or found.cost < result.cost:
            result = found
    assert result is not None
    cal = calibration(result.x)
    final = residuals(result.x)[: -len(params)]
    rms = float(np.sqrt(np.mean(np.expm1(np.abs(final)) ** 2))) if final.size else None
    return cal.model_copy(
        update={
            "fit": FitInfo(
                sources=[r.run.label for r, _ in runs],
                model=", ".join(sorted(measured)),
                hardware=models[0].replicas[0].perf.hardware.name if models else "",
                observations=int(final.size),
                rms_relative_error=rms,
                note=f"least squares over simulated replays, {result.nfev} evaluations",
                load_range=load_range([report for report, _ in runs]),
            )
        }
    )
