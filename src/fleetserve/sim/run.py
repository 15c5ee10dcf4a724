"""Simulate a planned fleet under a workload file or recorded bench runs (the pure core of
``fleetserve simulate``).

How a workload run is carried out is decided here, in this order: a sample of each model's
replicas where asked for and valid (:mod:`.sampling`, statistically equivalent, reported);
then, for a run without records, the fleet's independent parts one after another or in
``workers`` processes (:mod:`.parts`, the same result); else the whole fleet at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetserve.bench.report import BenchReport
from fleetserve.errors import SpecError, UsageError
from fleetserve.sim.build import reports, trace_stream
from fleetserve.sim.fleet import FleetSimulation, ModelSetup, StreamRun
from fleetserve.sim.parts import (
    Part,
    PartResult,
    Settings,
    result_of,
    simulate_part,
    simulate_parts,
    split,
)
from fleetserve.sim.sampling import Sampling, plan_sampling, sampled_inputs, scale_point
from fleetserve.sim.workload import StreamSpec, WorkloadSpec, trace_points

#: Requests per run below which simulated reports keep every record and inter-token gap
#: (what bench stores); above it only the summaries (a fleet-hour has millions).
RECORDS_LIMIT = 50_000


@dataclass
class SimOutcome:
    """Per-model reports and what the engines did."""

    reports: dict[str, BenchReport]
    requests: int = 0
    """The fleet's requests (sampled models: scaled, see :mod:`.sampling`); so are steps
    and preemptions."""
    steps: int = 0
    preemptions: int = 0
    sim_seconds: float = 0.0
    scale_events: list[tuple[float, str, int]] = field(default_factory=list)
    simulated_requests: int = 0
    """Requests actually simulated (fewer than ``requests`` when models were sampled)."""
    sampling: dict[str, Sampling] = field(default_factory=dict)
    """Per model, whether it was sampled and why not (empty: sampling not asked for)."""

    @property
    def sampled(self) -> bool:
        """Whether any model was simulated from a sample of its replicas."""
        return any(s.sampled for s in self.sampling.values())


def _check_models(models: Sequence[ModelSetup], streams: Sequence[tuple[str, str]]) -> None:
    """``streams``: (label, model) of each stream."""
    names = {m.name for m in models}
    for label, model in streams:
        if model not in names:
            raise SpecError(
                f"workload: stream '{label}' names model '{model}', which the fleet does not serve",
                hint=f"fleet models: {', '.join(sorted(names))}",
            )


def simulate_workload(
    models: Sequence[ModelSetup],
    workload: WorkloadSpec,
    *,
    request_overhead_s: float,
    cold_start_s: float = 60.0,
    records: bool | None = None,
    label: str = "simulated",
    sample_replicas: int | None = None,
    workers: int = 1,
) -> SimOutcome:
    """All of a workload's streams at once against the fleet.

    ``sample_replicas``: simulate at most that many replicas of each model where that is
    valid, with their share of its traffic (:mod:`fleetserve.sim.sampling`; None: every
    replica). Records, when kept, are then the sample's. A run without records simulates
    the fleet's independent parts one after another, or ``workers`` processes at once
    (:mod:`fleetserve.sim.parts`; the same result).
    """
    _check_models(models, [(s.point_label, s.model) for s in workload.streams])
    models = serving(models, [(s.model, s.point_label, s.sampling) for s in workload.streams])
    if workers < 1:
        raise UsageError(f"--workers {workers}: at least 1 process", hint="--workers 1")
    sampling: dict[str, Sampling] = {}
    fleet_x = [s.load.x_value for s in workload.streams]
    if sample_replicas is not None:
        sampling = plan_sampling(models, workload, sample_replicas)
        models, workload = sampled_inputs(models, workload, sampling)
    keep = records if records is not None else _small(workload)
    settings = Settings(
        request_overhead_s,
        cold_start_s,
        workload.duration_s + 600.0 if workload.duration_s else None,
        label,
    )
    parts = None if keep else split(models, workload)
    results = None
    if parts is not None:
        weights = [sum(_expected(workload.streams[i], workload) for i in p.streams) for p in parts]
        results = simulate_parts(parts, workload, settings, workers=workers, weights=weights)
    if results is None or any(r.stopped_at_horizon for r in results):
        # The whole fleet at once: records kept, autoscaling, or a part reached the
        # horizon (sim.parts' note says why).
        whole = Part(tuple(models), tuple(range(len(workload.streams))))
        results = [simulate_part(whole, workload, settings, keep=keep)]
    out = SimOutcome(reports={}, sampling=sampling)
    by_model = {r: part for part in results for r in part.reports}
    for model in dict.fromkeys(s.model for s in workload.streams):
        out.reports[model] = by_model[model].reports[model]
    for part in results:
        _add_counts(out, part)
        out.sim_seconds = max(out.sim_seconds, part.now)  # the last event anywhere
        out.scale_events += part.scale_events
    if out.sampled:
        _scale(out, workload, fleet_x)
    return out


def _scale(out: SimOutcome, workload: WorkloadSpec, fleet_x: Sequence[float]) -> None:
    """Sampled models' reports as the fleet's (:func:`scale_point`), marked as such."""
    for model, report in out.reports.items():
        s = out.sampling[model]
        if not s.sampled:
            continue
        xs = [x for st, x in zip(workload.streams, fleet_x, strict=True) if st.model == model]
        report.points = [scale_point(p, s, x) for p, x in zip(report.points, xs, strict=True)]
        report.run = report.run.model_copy(
            update={"workload": f"{report.run.workload}; {s.describe()}"}
        )


def _expected(s: StreamSpec, workload: WorkloadSpec) -> float:
    """Requests a stream will send, about (RECORDS_LIMIT when unbounded)."""
    if s.num_requests:
        return s.num_requests + s.warmup
    if s.load.rate and (s.duration_s or workload.duration_s):
        return s.load.rate * (s.duration_s or workload.duration_s or 0.0)
    return RECORDS_LIMIT


def _small(workload: WorkloadSpec) -> bool:
    return sum(_expected(s, workload) for s in workload.streams) < RECORDS_LIMIT


def _add_counts(out: SimOutcome, part: PartResult) -> None:
    """Add what a simulated part did to ``out``'s counts (sampled models' scaled to the
    fleet's)."""
    for model, n in part.finished.items():
        s = out.sampling.get(model)
        f = s.scale if s is not None else 1.0
        out.simulated_requests += n
        out.requests += round(n * f)
        out.steps += round(part.steps.get(model, 0) * f)
        out.preemptions += round(part.preemptions.get(model, 0) * f)
    for model in part.steps.keys() - part.finished.keys():  # models without a stream
        out.steps += part.steps[model]
        out.preemptions += part.preemptions[model]


def serving(
    models: Sequence[ModelSetup], asked: Sequence[tuple[str, str, dict[str, float]]]
) -> list[ModelSetup]:
    """``models`` with each engine serving the sampling its requests set: ``asked`` holds
    (model, run or stream label, the sampling parameters its requests set; empty: the
    server's defaults). ``temperature: 0`` samples greedily and skips the top-p sort a
    model's defaults may ask for (:mod:`fleetserve.sampling`). An engine runs one sampling
    mode in a simulation, so requests of one model that sort and requests that do not are
    refused together (other differences - a temperature, a top-k - cost the same here)."""
    by_name = {m.name: m for m in models}
    first: dict[str, tuple[str, dict[str, float], bool]] = {}
    for name, label, params in asked:
        model = by_name.get(name)
        if model is None or not model.replicas:
            continue  # _check_models names it
        sorts = model.replicas[0].perf.cost.with_request_sampling(params).sorts
        seen = first.setdefault(name, (label, params, sorts))
        if seen[2] != sorts:
            raise UsageError(
                f"requests of model '{name}' sample differently: '{seen[0]}' with "
                f"{_described(seen[1])}, '{label}' with {_described(params)} (top-p sorts "
                "the vocabulary in one and not the other)",
                hint="simulate (or calibrate on) them one at a time",
            )
    out = []
    for m in models:
        params = first[m.name][1] if m.name in first else {}
        if not params:
            out.append(m)
            continue
        replicas = tuple(dataclasses.replace(r, perf=r.perf.serving(params)) for r in m.replicas)
        out.append(dataclasses.replace(m, replicas=replicas))
    return out


def _described(params: dict[str, float]) -> str:
    if not params:
        return "the server's defaults"
    return ", ".join(f"{k} {v:g}" for k, v in sorted(params.items()))


def simulate_traces(
    models: Sequence[ModelSetup],
    traces: Sequence[tuple[BenchReport, str | None]],
    *,
    request_overhead_s: float,
    label: str = "simulated",
) -> SimOutcome:
    """Replay recorded bench runs: the i-th point of every trace runs together (runs of
    several models measured at the same time), each point on a fresh fleet, as bench runs
    its points one after the other."""
    per_trace = [trace_points(report, model) for report, model in traces]
    # a bench run records the sampling its requests set (--extra-body): replayed as served
    models = serving(
        models,
        [(model or r.run.model, r.run.label, dict(r.run.sampling)) for r, model in traces],
    )
    rounds = max(len(p) for p in per_trace)
    all_streams: list[StreamRun] = []
    out = SimOutcome(reports={})
    for i in range(rounds):
        streams = [
            trace_stream(points[i], len(all_streams) + k)
            for k, points in enumerate(p for p in per_trace if i < len(p))
        ]
        _check_models(models, [(s.label, s.model) for s in streams])
        # Stream ids index the simulation's own list: renumber for this round.
        local = [
            StreamRun(j, s.model, s.label, s.x, s.source, s.concurrency)
            for j, s in enumerate(streams)
        ]
        sim = FleetSimulation(
            list(models), local, request_overhead_s=request_overhead_s, keep_itl=True
        )
        sim.run()
        _add_counts(out, result_of(sim, {}))
        out.sim_seconds += sim.now
        all_streams += local
    names = ", ".join(r.run.label for r, _ in traces)
    out.reports = reports(
        all_streams, label=label, workload=f"replay of {names}", seed=0, keep_records=True
    )
    return out
