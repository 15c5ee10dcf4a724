"""Simulate a planned fleet under a workload file or recorded bench runs (the pure core of
``fleetserve simulate``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetserve.bench.report import BenchReport
from fleetserve.errors import SpecError
from fleetserve.sim.build import reports, trace_stream, workload_streams
from fleetserve.sim.fleet import FleetSimulation, ModelSetup, StreamRun
from fleetserve.sim.workload import WorkloadSpec, trace_points

#: Requests per run below which simulated reports keep every record and inter-token gap
#: (what bench stores); above it only the summaries (a fleet-hour has millions).
RECORDS_LIMIT = 50_000


@dataclass
class SimOutcome:
    """Per-model reports and what the engines did."""

    reports: dict[str, BenchReport]
    requests: int = 0
    steps: int = 0
    preemptions: int = 0
    sim_seconds: float = 0.0
    scale_events: list[tuple[float, str, int]] = field(default_factory=list)


def _check_models(models: Sequence[ModelSetup], streams: Sequence[StreamRun]) -> None:
    names = {m.name for m in models}
    for s in streams:
        if s.model not in names:
            raise SpecError(
                f"workload: stream '{s.label}' names model '{s.model}', which the fleet "
                "does not serve",
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
) -> SimOutcome:
    """All of a workload's streams at once against the fleet."""
    sim: FleetSimulation | None = None

    def clock() -> float:
        return sim.now if sim is not None else 0.0

    streams = workload_streams(workload, clock)
    _check_models(models, streams)
    horizon = workload.duration_s + 600.0 if workload.duration_s else None
    keep = records if records is not None else _small(workload)
    sim = FleetSimulation(
        list(models),
        streams,
        request_overhead_s=request_overhead_s,
        seed=workload.seed,
        keep_itl=keep,
        cold_start_s=cold_start_s,
        horizon_s=horizon,
    )
    sim.run()
    out = SimOutcome(
        reports(
            streams,
            label=label,
            workload="simulated workload",
            seed=workload.seed,
            keep_records=keep,
        ),
        sim_seconds=sim.now,
        scale_events=sim.scale_events,
    )
    _count(out, sim)
    return out


def _small(workload: WorkloadSpec) -> bool:
    total = 0.0
    for s in workload.streams:
        if s.num_requests:
            total += s.num_requests + s.warmup
        elif s.load.rate and (s.duration_s or workload.duration_s):
            total += s.load.rate * (s.duration_s or workload.duration_s or 0.0)
        else:
            total += RECORDS_LIMIT
    return total < RECORDS_LIMIT


def _count(out: SimOutcome, sim: FleetSimulation) -> None:
    out.requests += sum(len(s.done) for s in sim.streams)
    for dep in sim._deps.values():
        for e in dep.engines:
            out.steps += e.steps
            out.preemptions += e.preemptions


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
    rounds = max(len(p) for p in per_trace)
    all_streams: list[StreamRun] = []
    out = SimOutcome(reports={})
    for i in range(rounds):
        streams = [
            trace_stream(points[i], len(all_streams) + k)
            for k, points in enumerate(p for p in per_trace if i < len(p))
        ]
        _check_models(models, streams)
        # Stream ids index the simulation's own list: renumber for this round.
        local = [
            StreamRun(j, s.model, s.label, s.x, s.source, s.concurrency)
            for j, s in enumerate(streams)
        ]
        sim = FleetSimulation(
            list(models), local, request_overhead_s=request_overhead_s, keep_itl=True
        )
        sim.run()
        _count(out, sim)
        out.sim_seconds += sim.now
        all_streams += local
    names = ", ".join(r.run.label for r, _ in traces)
    out.reports = reports(
        all_streams, label=label, workload=f"replay of {names}", seed=0, keep_records=True
    )
    return out
