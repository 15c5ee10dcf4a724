"""``fleetserve simulate fleet.yaml (--workload W.yaml | --trace BENCH.json ...)``.

Thin shell: reads the spec, plans it (the cluster pools, or this machine for a spec without
pools, as ``serve`` would), reads the calibration, runs :mod:`fleetserve.sim.run` and writes
bench reports (``--output``; one file per model, ``NAME-<model>.json``, when the fleet
serves several) that ``fleetserve bench compare`` reads.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetserve.errors import UsageError
from fleetserve.perf.calibration import add_calibration_argument
from fleetserve.sim.sampling import DEFAULT_SAMPLE, NO_STREAM


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate a fleet under a workload; bench-format reports",
        description=(
            "Discrete-event simulation of a planned fleet: vLLM continuous batching per "
            "replica (chunked prefill, KV capacity, preemption, prefix cache), fleetserve's "
            "routing and autoscaling, step times from the performance model. Example: "
            "fleetserve simulate fleet.yaml --workload traffic.yaml --output sim.json"
        ),
    )
    p.add_argument("spec", type=Path, help="fleet spec (YAML)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", type=Path, metavar="FILE", help="workload YAML (streams)")
    src.add_argument(
        "--trace",
        action="append",
        metavar="BENCH.json[=MODEL]",
        help="replay a bench report (repeat for runs measured at the same time); =MODEL "
        "names the fleet model when the report's differs",
    )
    add_calibration_argument(p, "the engines' step-time constants")
    p.add_argument(
        "--cold-start", type=float, default=60.0, metavar="S", help="replica start-up (autoscaling)"
    )
    p.add_argument(
        "--host-cpus", type=int, help="CPU host to plan a pool-less spec on (default: this one)"
    )
    p.add_argument("--host-memory-gb", type=float, help="its RAM (GiB; default: this host's)")
    add_uncapped_argument(p)
    p.add_argument(
        "--sample-replicas",
        type=int,
        nargs="?",
        const=DEFAULT_SAMPLE,
        metavar="N",
        help=f"simulate N replicas (default {DEFAULT_SAMPLE}) of each model whose replicas are "
        "alike, with their share of its traffic, and scale the counts: much faster on large "
        "fleets, latency percentiles within a few %% (fleetserve.sim.sampling says when it "
        "applies); --workload only",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes simulating the fleet's independent parts (models on cards of their "
        "own) at once; the same result (default 1)",
    )
    p.add_argument("--output", type=Path, metavar="FILE", help="bench-format JSON report")
    p.add_argument("--label", default="simulated", help="run label in the reports")
    p.set_defaults(handler=_run)


def add_uncapped_argument(p: argparse.ArgumentParser) -> None:
    """``--uncapped`` of ``simulate`` and ``plan calibrate``."""
    p.add_argument(
        "--uncapped",
        action="store_true",
        help="the replicas run without HAMi core limits (fleetserve serve on a GPU host): "
        "each may use the whole card's compute, time-sliced with the replicas stepping "
        "beside it; the plan's slices size only memory",
    )


def simulation_plan(spec: Any, args: argparse.Namespace) -> Any:
    """The plan ``simulate`` and ``plan calibrate`` replay: a spec with pools planned on
    them (``args.uncapped``: as served without HAMi), else on this host or the one
    ``args.host_cpus`` / ``args.host_memory_gb`` describe."""
    if spec.pools:
        from fleetserve.plan.planner import plan_fleet  # noqa: PLC0415

        scale = any(m.replicas.max > m.replicas.min for m in spec.models)
        plan = plan_fleet(spec, scenario="max" if scale else "min")
        if args.uncapped:
            from fleetserve.sim.build import uncapped  # noqa: PLC0415

            plan = uncapped(plan)
        return plan
    from fleetserve.host import HostFacts, probe  # noqa: PLC0415
    from fleetserve.plan.local import plan_local  # noqa: PLC0415

    host = probe()
    if args.host_cpus or args.host_memory_gb:
        host = HostFacts(
            cpus=args.host_cpus or host.cpus,
            memory_mb=round(args.host_memory_gb * 1024) if args.host_memory_gb else host.memory_mb,
            gpu_memory_mb=[],
        )
    return plan_local(spec, host)


def _run(args: argparse.Namespace) -> int:
    from fleetserve.bench.report import BenchReport  # noqa: PLC0415
    from fleetserve.perf.calibration import Calibration  # noqa: PLC0415
    from fleetserve.sim.build import model_setups  # noqa: PLC0415
    from fleetserve.sim.calibrate import beyond_calibration  # noqa: PLC0415
    from fleetserve.sim.run import simulate_traces, simulate_workload  # noqa: PLC0415
    from fleetserve.sim.workload import load_workload  # noqa: PLC0415
    from fleetserve.spec import load_spec  # noqa: PLC0415

    if args.sample_replicas is not None and not args.workload:
        raise UsageError("--sample-replicas applies to --workload runs (a trace replays as is)")
    if args.sample_replicas is not None and args.sample_replicas < 1:
        raise UsageError(
            f"--sample-replicas {args.sample_replicas}: a sample needs at least 1 replica",
            hint=f"--sample-replicas {DEFAULT_SAMPLE}",
        )
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: at least 1 process", hint="--workers 1")
    spec = load_spec(args.spec)
    plan = simulation_plan(spec, args)
    if not plan.replicas:
        raise UsageError(f"{args.spec}: the plan places no replica; see fleetserve plan")
    cal = Calibration.load(args.calibration) if args.calibration else None
    models = model_setups(spec, plan, cal, base_dir=args.spec.parent)
    cpu = not any(r.gpus for r in plan.replicas)
    overhead = (cal or Calibration.default(cpu=cpu)).request_overhead_s
    began = time.perf_counter()
    if args.workload:
        outcome = simulate_workload(
            models,
            load_workload(args.workload),
            request_overhead_s=overhead,
            cold_start_s=args.cold_start,
            label=args.label,
            sample_replicas=args.sample_replicas,
            workers=args.workers,
        )
    else:
        traces = []
        for item in args.trace:
            path, _, model = item.partition("=")
            traces.append((BenchReport.load(Path(path)), model or None))
        outcome = simulate_traces(models, traces, request_overhead_s=overhead, label=args.label)
    wall = time.perf_counter() - began
    console = Console()
    table = Table(title=f"simulated {outcome.sim_seconds:,.0f} s in {wall:.1f} s")
    for col in (
        "model",
        "point",
        "req/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TPOT p50 ms",
        "failed",
    ):
        table.add_column(col, justify="left" if col in ("model", "point") else "right")
    for model, report in outcome.reports.items():
        for pt in report.points:
            table.add_row(
                model,
                pt.label,
                f"{pt.request_throughput:.2f}",
                f"{pt.output_throughput:.1f}",
                _ms(pt.ttft.p50),
                _ms(pt.ttft.p90),
                _ms(pt.tpot.p50),
                str(pt.failed),
            )
    console.print(table)
    console.print(
        f"{outcome.requests:,} requests, {outcome.steps:,} engine steps, "
        f"{outcome.preemptions:,} preemptions"
    )
    whole: dict[str, list[str]] = {}
    for s in outcome.sampling.values():
        if s.sampled:
            console.print(f"{s.model}: {s.describe()}")
        elif s.reason != NO_STREAM:
            whole.setdefault(s.reason, []).append(s.model)
    for reason, names in whole.items():
        console.print(f"simulated whole ({reason}): {', '.join(names)}")
    if outcome.sampled:
        console.print(f"{outcome.simulated_requests:,} requests simulated (sampled replicas)")
    if cal is not None and cal.fit.load_range is not None:
        console.print(cal.fit.describe_load())
        for line in beyond_calibration(outcome.reports, models, cal.fit.load_range[1]):
            console.print(f"[yellow]{line}[/]")
    if args.output:
        many = len(outcome.reports) > 1
        for model, report in outcome.reports.items():
            path = (
                args.output.with_name(f"{args.output.stem}-{model}{args.output.suffix}")
                if many
                else args.output
            )
            try:
                report.save(path)
            except OSError as e:
                raise UsageError(f"--output {path}: cannot write: {e.strerror}") from e
            console.print(f"wrote {path}")
    return 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
