"""Simulating a fleet as its independent parts: one after another, or in ``workers``
processes at once (``fleetserve simulate --workers N``).

Design note. Models that share no card and draw no random numbers from a common generator
do not interact in the simulation: each one's events depend only on its own streams,
engines and router. So the fleet splits into *parts* - models joined by a shared card, and
all models routed by ``pow2`` joined together (their router draws from the simulation's one
generator, in event order) - each simulated as a
:class:`~fleetserve.sim.fleet.FleetSimulation` of its models and streams, and the results
merged. The result is identical to simulating the whole fleet at once, not just alike:

* each stream keeps its seed (``workload.seed`` + its index in the workload) and its
  requests keep their order, so every request is the same; within a part, events are
  processed in the same order as in the whole fleet's heap (the same times, ties broken by
  the same relative push order); request ids differ, but only their order within a stream
  or an engine matters, and that is kept (records, which print ids, are not kept by runs
  this large: parts are for runs without records);
* the simulated time is the last event's: the latest of the parts';
* not for autoscaling fleets: the autoscaler ticks the whole fleet until the last request
  anywhere is done, which a part cannot know; nor when a part reaches the horizon
  (requests still running then time out at the whole fleet's last event before it): the
  fleet is then simulated again at once.

Why bother in one process: a part's heap, engines and requests are a fraction of the
fleet's, and the interpreter runs them from its caches - on the 1,000-GPU benchmark fleet
one model at a time simulates ~1.8x faster than all 100 at once. With ``workers > 1`` the
parts are dealt to processes (largest expected request count first, onto the least
loaded), each simulating its parts one after another.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from fleetserve.bench.report import BenchReport
from fleetserve.sim.build import reports, workload_streams
from fleetserve.sim.fleet import FleetSimulation, ModelSetup, StreamRun
from fleetserve.sim.workload import WorkloadSpec


@dataclass(frozen=True)
class Part:
    """Models simulated together and the indices of their streams in the workload."""

    models: tuple[ModelSetup, ...]
    streams: tuple[int, ...]


@dataclass(frozen=True)
class Settings:
    """How every part is simulated (the same for all)."""

    request_overhead_s: float
    cold_start_s: float
    horizon_s: float | None
    label: str


@dataclass
class PartResult:
    """What simulating a part gave: per-model reports and the counts run.py adds up."""

    reports: dict[str, BenchReport]
    finished: dict[str, int]
    """Requests finished (or failed) per model."""
    steps: dict[str, int]
    preemptions: dict[str, int]
    now: float
    stopped_at_horizon: bool
    scale_events: list[tuple[float, str, int]]


def split(models: Sequence[ModelSetup], workload: WorkloadSpec) -> list[Part] | None:
    """The fleet's independent parts (see the module note), in fleet order; None when it
    does not split (autoscaling)."""
    if any(m.replica_spec.max > m.replica_spec.min for m in models):
        return None
    parent = {m.name: m.name for m in models}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    by_card: dict[str, str] = {}
    pow2: str | None = None
    for m in models:
        for r in m.replicas:
            parent[root(m.name)] = root(by_card.setdefault(r.card, m.name))
        if m.routing.policy == "pow2":
            pow2 = pow2 or m.name
            parent[root(m.name)] = root(pow2)
    names: dict[str, set[str]] = {}
    for m in models:
        names.setdefault(root(m.name), set()).add(m.name)
    return [
        Part(
            tuple(m for m in models if m.name in group),
            tuple(i for i, s in enumerate(workload.streams) if s.model in group),
        )
        for group in names.values()
    ]


def simulate_parts(
    parts: list[Part],
    workload: WorkloadSpec,
    settings: Settings,
    *,
    workers: int,
    weights: Sequence[float],
) -> list[PartResult]:
    """Simulate each part, without records: one after another here (``workers`` 1), else
    dealt to ``workers`` processes by ``weights`` (each part's expected requests)."""
    if workers <= 1 or len(parts) < 2:
        return _one_after_another(parts, workload, settings)
    shares: list[list[Part]] = [[] for _ in range(min(workers, len(parts)))]
    load = [0.0] * len(shares)
    for w, part in sorted(zip(weights, parts, strict=True), key=lambda p: -p[0]):
        i = load.index(min(load))
        shares[i].append(part)
        load[i] += w
    # Forked where the platform can: the workers then start without importing anything.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=context) as pool:
        futures = [pool.submit(_one_after_another, s, workload, settings) for s in shares]
        return [r for f in futures for r in f.result()]


def _one_after_another(
    parts: list[Part], workload: WorkloadSpec, settings: Settings
) -> list[PartResult]:
    return [simulate_part(p, workload, settings, keep=False) for p in parts]


def simulate_part(
    part: Part, workload: WorkloadSpec, settings: Settings, *, keep: bool
) -> PartResult:
    """Simulate ``part`` of the fleet under its streams of ``workload`` (``keep``: records
    and inter-token gaps, else columns)."""
    sim: FleetSimulation | None = None

    def clock() -> float:
        return sim.now if sim is not None else 0.0

    every = workload_streams(workload, clock)  # every stream: each keeps its own seed
    # Stream ids index the simulation's own list: renumber the part's.
    streams = [
        StreamRun(j, s.model, s.label, s.x, s.source, s.concurrency)
        for j, s in enumerate(every[i] for i in part.streams)
    ]
    sim = FleetSimulation(
        list(part.models),
        streams,
        request_overhead_s=settings.request_overhead_s,
        seed=workload.seed,
        keep_itl=keep,
        cold_start_s=settings.cold_start_s,
        horizon_s=settings.horizon_s,
        columns=not keep,
    )
    sim.run()
    return result_of(
        sim,
        reports(
            streams,
            label=settings.label,
            workload="simulated workload",
            seed=workload.seed,
            keep_records=keep,
        ),
    )


def result_of(sim: FleetSimulation, reports: dict[str, BenchReport]) -> PartResult:
    """What a finished simulation did, per model."""
    finished: dict[str, int] = {}
    for s in sim.streams:
        finished[s.model] = finished.get(s.model, 0) + s.finished
    deps = sim.deployments
    return PartResult(
        reports=reports,
        finished=finished,
        steps={name: sum(e.steps for e in d.engines) for name, d in deps.items()},
        preemptions={name: sum(e.preemptions for e in d.engines) for name, d in deps.items()},
        now=sim.now,
        stopped_at_horizon=sim.stopped_at_horizon,
        scale_events=sim.scale_events,
    )
