"""``fleetserve plan calibrate BENCH.json... [--spec fleet.yaml] --output cal.json``.

Thin shell over :func:`fleetserve.sim.calibrate.fit`: the spec (default: the built-in
default fleet, what ``fleetserve serve`` runs without one) is planned as ``simulate`` plans
it, the runs are replayed against it, and the fitted constants are written for ``plan`` and
``simulate`` (``--calibration``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fleetserve.errors import UsageError
from fleetserve.sim.command import add_uncapped_argument


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetserve plan calibrate",
        description=(
            "Fit the performance model's constants (efficiencies, step and request overheads) "
            "to fleetserve bench reports of a known engine, by replaying them in the simulator."
        ),
    )
    p.add_argument("reports", nargs="+", metavar="BENCH.json[=MODEL]", help="bench reports")
    p.add_argument(
        "--spec", type=Path, help="fleet spec the runs were served by (default: built-in)"
    )
    p.add_argument("--output", type=Path, required=True, metavar="FILE", help="calibration file")
    p.add_argument("--host-cpus", type=int, help="CPU host of a pool-less spec (default: this one)")
    p.add_argument("--host-memory-gb", type=float, help="its RAM (GiB)")
    p.add_argument("--note", default="", help="free text kept in the file (host load, version)")
    add_uncapped_argument(p)
    p.set_defaults(cold_start=60.0)
    return p


def run(argv: list[str]) -> int:
    from fleetserve.bench.report import BenchReport  # noqa: PLC0415
    from fleetserve.perf.calibration import Calibration  # noqa: PLC0415
    from fleetserve.sim.build import model_setups  # noqa: PLC0415
    from fleetserve.sim.calibrate import (  # noqa: PLC0415
        fit,
        fitted_params,
        prediction_errors,
        with_calibration,
    )
    from fleetserve.sim.command import simulation_plan  # noqa: PLC0415
    from fleetserve.sim.run import simulate_traces  # noqa: PLC0415
    from fleetserve.spec import default_fleet, load_spec  # noqa: PLC0415

    args = build_parser().parse_args(argv)
    spec = load_spec(args.spec) if args.spec else default_fleet()
    plan = simulation_plan(spec, args)
    if not plan.replicas:
        raise UsageError("plan calibrate: the spec's plan places no replica")
    cpu = not any(r.gpus for r in plan.replicas)
    start = Calibration.default(cpu=cpu)
    models = model_setups(spec, plan, start, base_dir=args.spec.parent if args.spec else None)
    runs = []
    for item in args.reports:
        path, _, model = item.partition("=")
        runs.append((BenchReport.load(Path(path)), model or None))
    cal = fit(models, runs, start=start)
    if args.note:
        cal = cal.model_copy(update={"fit": cal.fit.model_copy(update={"note": args.note})})
    try:
        cal.save(args.output)
    except OSError as e:
        raise UsageError(f"--output {args.output}: cannot write: {e.strerror}") from e
    outcome = simulate_traces(
        with_calibration(models, cal), runs, request_overhead_s=cal.request_overhead_s
    )
    measured = {(m or r.run.model): r for r, m in runs}
    table = Table(title=f"calibration fit ({args.output})")
    for col in ("model", "point", "metric", "measured", "simulated", "error"):
        table.add_column(col, justify="left" if col in ("model", "point", "metric") else "right")
    for model, point, metric, a, b in prediction_errors(measured, outcome.reports):
        table.add_row(model, point, metric, f"{a:.1f}", f"{b:.1f}", f"{b / a - 1:+.1%}")
    console = Console()
    console.print(table)
    console.print(", ".join(f"{k} {getattr(cal, k):.4g}" for k, _, _ in fitted_params(cal.backend)))
    load = cal.fit.describe_load()
    if load is not None:
        console.print(load)
    return 0
