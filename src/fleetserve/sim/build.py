"""From a fleet spec, its plan and a workload to a simulation, and back to bench reports.

The plan is the source of every replica's facts: its card type and HAMi ``gpucores``
share, which replicas share a card, tensor/pipeline parallelism and the engine settings
(``max_num_seqs``, ``max_num_batched_tokens``, the KV cache in tokens). A fleet with
autoscaling (``replicas.max > min``) is planned at ``max``; the first ``min`` replicas run
from the start and autoscaling brings in the others.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetserve import __version__
from fleetserve.bench.metrics import summarize
from fleetserve.bench.record import RequestRecord, record_to_json
from fleetserve.bench.report import BenchReport, RunInfo
from fleetserve.errors import SpecError
from fleetserve.perf.calibration import Calibration
from fleetserve.perf.model import engine_perf, graph_tokens
from fleetserve.plan.gpus import gpu_type
from fleetserve.plan.memory import BLOCK_SIZE, CPU_BLOCK_SIZE
from fleetserve.plan.result import PlanResult
from fleetserve.plan.sizing import model_config_for
from fleetserve.sim.columns import (
    failure_message,
    failure_status,
    failure_type,
    summarize_columns,
)
from fleetserve.sim.engine import SimRequest
from fleetserve.sim.fleet import ModelSetup, ReplicaSetup, StreamRun
from fleetserve.sim.workload import StreamSpec, TracePoint, WorkloadSpec
from fleetserve.spec import FleetSpec


def model_setups(
    spec: FleetSpec,
    plan: PlanResult,
    calibration: Calibration | None,
    *,
    base_dir: Path | None = None,
    cpu_calibration: Calibration | None = None,
) -> list[ModelSetup]:
    """Every model's planned replicas as engine models (see the module note).

    ``calibration`` applies to GPU engines, ``cpu_calibration`` (default: the same file
    when it is a CPU one) to CPU engines; a backend without one uses its defaults.
    """
    gpu_cal = calibration if calibration is None or calibration.backend == "cuda" else None
    cpu_cal = cpu_calibration or (
        calibration if calibration is not None and calibration.backend == "cpu" else None
    )
    by_model: dict[str, list[Any]] = {}
    for p in plan.replicas:
        by_model.setdefault(p.model, []).append(p)
    setups: list[ModelSetup] = []
    for i, model in enumerate(spec.models):
        placements = sorted(by_model.get(model.name, []), key=lambda p: p.index)
        if not placements:
            raise SpecError(
                f"models[{i}] '{model.name}': the plan places no replica of it",
                hint="run fleetserve plan on the spec to see why",
            )
        config = model_config_for(model, base_dir, index=i)
        replicas = []
        for p in placements:
            gpu = gpu_type(p.gpu_type) if p.gpus and p.gpu_type else None
            perf = engine_perf(
                config,
                gpu,
                gpu_cal if gpu is not None else cpu_cal,
                dtype=model.dtype,
                quantization=model.quantization,
                kv_cache_dtype=model.kv_cache_dtype,
                tensor_parallel=p.tensor_parallel,
                pipeline_parallel=p.pipeline_parallel,
                # 0: no HAMi cap (the local plan's placements), the whole card
                cores_percent=(p.cores_percent or 100) if gpu is not None else 100,
                cpu_cores=model.resources.cpu,
                graph_tokens=graph_tokens(
                    gpu,
                    p.engine.max_num_seqs,
                    p.engine.max_num_batched_tokens,
                    model.engine_args,
                ),
                engine_args=model.engine_args,
            )
            block = BLOCK_SIZE if gpu is not None else CPU_BLOCK_SIZE
            card = f"{p.pool}/{p.node}/" + (str(p.gpus[0]) if p.gpus else "cpu")
            kv_tokens = p.engine.kv_cache_tokens or p.engine.max_model_len
            replicas.append(
                ReplicaSetup(
                    id=f"{model.name}#{p.index}",
                    card=card,
                    perf=perf,
                    max_num_seqs=p.engine.max_num_seqs,
                    max_num_batched_tokens=p.engine.max_num_batched_tokens,
                    kv_blocks=kv_tokens // block,
                    block_size=block,
                )
            )
        setups.append(
            ModelSetup(
                name=model.name,
                replicas=tuple(replicas),
                replica_spec=model.replicas,
                routing=model.routing,
                start=min(len(replicas), max(model.replicas.min, 1)),
            )
        )
    return setups


# --------------------------------------------------------------------------- streams


def _synthetic(
    stream: StreamSpec, seed: int, default_duration: float | None
) -> Iterator[tuple[float, int, int, int, int, bool]]:
    rng = np.random.default_rng(seed)
    closed = stream.load.kind == "concurrency"
    arrivals = None if closed else stream.load.arrivals(seed)
    duration = stream.duration_s or (None if stream.num_requests else default_duration)
    limit = (stream.num_requests or 0) + stream.warmup if stream.num_requests else None
    draws = _draws(stream, rng)
    for n in itertools.count():
        if limit is not None and n >= limit:
            return
        t = -1.0 if arrivals is None else next(arrivals)
        if duration is not None and t > duration:
            return
        group, prompt, output = next(draws)
        prefix = stream.prefix_len if group >= 0 else 0
        yield t, prefix + prompt, output, group, prefix, n < stream.warmup


#: Requests whose integer draws :func:`_draws` makes in one numpy call.
DRAW_BLOCK = 4096


def _draws(stream: StreamSpec, rng: np.random.Generator) -> Iterator[tuple[int, int, int]]:
    """Each request's (shared-prefix group or -1, prompt tokens after the prefix, output
    tokens), drawn from ``rng`` in that order, request after request.

    When every draw is an integer one (groups, fixed and uniform lengths), a block of
    requests is drawn in one call with per-element bounds: numpy's bounded integers
    consume the generator element by element exactly as one call per value does (tests
    check it), so the lengths are the same as :meth:`LengthDistribution.sample`'s, a few
    times cheaper. A normal length draws floats in between: one request at a time then.
    """
    lengths = (stream.input_len, stream.output_len)
    groups = stream.prefix_groups
    if any(d.kind not in ("fixed", "uniform") for d in lengths):
        while True:
            group = int(rng.integers(groups)) if groups else -1
            yield group, stream.input_len.sample(rng), stream.output_len.sample(rng)
    bounds = ([(0, groups)] if groups else []) + [
        (d.low, d.high + 1) for d in lengths if d.kind == "uniform"
    ]
    if not bounds:
        yield from itertools.repeat((-1, stream.input_len.low, stream.output_len.low))
    low = np.tile([b[0] for b in bounds], DRAW_BLOCK)
    high = np.tile([b[1] for b in bounds], DRAW_BLOCK)
    while True:
        block = rng.integers(low, high).reshape(DRAW_BLOCK, len(bounds)).T.tolist()
        cols = iter(block)
        yield from zip(
            next(cols) if groups else itertools.repeat(-1),
            *(next(cols) if d.kind == "uniform" else itertools.repeat(d.low) for d in lengths),
            strict=False,  # the constants repeat forever
        )


def _closed_with_duration(
    source: Iterator[tuple[float, int, int, int, int, bool]], duration: float, clock: Any
) -> Iterator[tuple[float, int, int, int, int, bool]]:
    for item in source:
        if clock() > duration:
            return
        yield item


def workload_streams(workload: WorkloadSpec, clock: Any) -> list[StreamRun]:
    """Stream runs of a workload file (``clock``: the simulation's time, for closed-loop
    streams bounded by a duration)."""
    runs = []
    for i, s in enumerate(workload.streams):
        source = _synthetic(s, workload.seed + i, workload.duration_s)
        duration = s.duration_s or (None if s.num_requests else workload.duration_s)
        if s.load.kind == "concurrency" and duration is not None:
            source = _closed_with_duration(source, duration, clock)
        elif s.load.kind == "concurrency" and not s.num_requests:
            raise SpecError(
                f"streams[{i}]: a concurrency stream needs num_requests or duration_s",
                hint="set streams[].num_requests, streams[].duration_s or duration_s",
            )
        runs.append(
            StreamRun(
                id=i,
                model=s.model,
                label=s.point_label,
                x=s.load.x_value,
                source=source,
                concurrency=s.load.concurrency if s.load.kind == "concurrency" else None,
            )
        )
    return runs


def trace_stream(point: TracePoint, stream_id: int) -> StreamRun:
    """A stream replaying one recorded bench point."""
    closed = point.concurrency is not None

    def source() -> Iterator[tuple[float, int, int, int, int, bool]]:
        for r in point.requests:
            prefix = point.prefix_len if r.group >= 0 else 0
            yield (
                (-1.0 if closed else r.scheduled),
                r.tokens_in,
                r.tokens_out,
                r.group,
                prefix,
                (r.warmup),
            )

    return StreamRun(
        id=stream_id,
        model=point.model,
        label=point.label,
        x=point.x,
        source=source(),
        concurrency=point.concurrency,
    )


# --------------------------------------------------------------------------- reports


def to_record(req: SimRequest, label: str) -> RequestRecord:
    """A simulated request as bench records a measured one."""
    ok = not req.failed and req.first >= 0
    return RequestRecord(
        id=req.id,
        point=label,
        warmup=req.warmup,
        group=req.group if req.group >= 0 else None,
        scheduled=req.scheduled,
        start=req.arrival,
        ttft=req.first - req.arrival if req.first >= 0 else None,
        itl=list(req.itl or []),
        e2e=max(req.end - req.arrival, 0.0) if req.end >= 0 else None,
        tokens_in=req.prompt,
        tokens_out=req.done,
        chunks=req.done,
        status=200 if ok else failure_status(req.failed),
        ok=ok,
        error_type=None if ok else failure_type(req.failed),
        error=None if ok else failure_message(req.failed),
        finish_reason="length" if ok else None,
    )


def reports(
    streams: Sequence[StreamRun],
    *,
    label: str,
    workload: str,
    seed: int,
    keep_records: bool,
) -> dict[str, BenchReport]:
    """One bench report per model, a point per stream (in stream order)."""
    out: dict[str, BenchReport] = {}
    for model in dict.fromkeys(s.model for s in streams):
        points = []
        records: list[dict[str, Any]] = []
        for s in (s for s in streams if s.model == model):
            if s.columns is not None:
                # No records kept: the same summary from the columns (sim.columns).
                points.append(summarize_columns(s.label, s.x, s.columns))
                continue
            recs = [to_record(r, s.label) for r in sorted(s.done, key=lambda r: r.id)]
            points.append(summarize(s.label, s.x, recs, None))
            if keep_records:
                records += [record_to_json(r) for r in recs]
        out[model] = BenchReport(
            run=RunInfo(
                label=f"{label}:{model}" if label else model,
                base_url="simulated",
                model=model,
                endpoint="chat",
                workload=workload,
                seed=seed,
                warmup=0,
                ignore_eos=True,
                tokens_source="simulated",
                prompt_lengths="exact (simulated)",
                started_at="1970-01-01T00:00:00Z",
                monotonic_origin=0.0,
                version=__version__,
            ),
            points=points,
            records=records,
        )
    return out


def uncapped(plan: PlanResult) -> PlanResult:
    """``plan`` as served without HAMi (``fleetserve serve`` on a GPU host): no replica's
    compute is capped to its gpucores, 0 as the local plan writes it - each gets the
    whole card, time-sliced with the replicas stepping beside it; the slices still size
    memory."""
    return plan.model_copy(
        update={"replicas": [r.model_copy(update={"cores_percent": 0}) for r in plan.replicas]}
    )
