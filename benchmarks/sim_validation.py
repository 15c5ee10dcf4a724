"""Calibrate on some bench runs, predict others, print the error table (issue #29).

CPU (the fixtures; the fleet is the built-in default one, planned for a 2-CPU, 23 GiB host
like the one they ran on):

    PYTHONPATH=src .venv/bin/python benchmarks/sim_validation.py \
        --calibrate tests/fixtures/sim/cpu-cal.json \
        --predict tests/fixtures/sim/cpu-pred-conc.json tests/fixtures/sim/cpu-pred-long.json \
                  tests/fixtures/sim/cpu-pred-rate.json

GPU (``benchmarks/gpu/matrix.py pack --sim`` or ``sim`` writes the runs and the spec they
were served by, on a pool of the host's card): calibrate on one model, predict the others
alone and the runs measured at the same time together (``--together``, simulated as one
fleet run and scored over the time every one of them ran: ``sim.calibrate.overlap``):

    PYTHONPATH=src .venv/bin/python benchmarks/sim_validation.py --spec fleet-card.yaml --uncapped \
        --calibrate sim-gemma-3-4b.json=gemma-3-4b \
        --predict sim-gemma-3-1b.json=gemma-3-1b sim-gemma-3-12b.json=gemma-3-12b \
        --together sim-together-gemma-3-4b.json=gemma-3-4b \
                   sim-together-gemma-3-12b.json=gemma-3-12b

A run is ``BENCH.json`` or ``BENCH.json=MODEL`` (the fleet's model, when the report names
another), either followed by ``@POINT,POINT...`` for some of its load points only - the CPU
validation calibrated across the batch range (docs/benchmarks.md):

    PYTHONPATH=src .venv/bin/python benchmarks/sim_validation.py \
        --calibrate tests/fixtures/sim/cpu-cal.json \
                    tests/fixtures/sim/cpu-pred-conc.json@c=16 \
        --predict tests/fixtures/sim/cpu-pred-conc.json@c=2,c=8 \
                  tests/fixtures/sim/cpu-pred-long.json tests/fixtures/sim/cpu-pred-rate.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetserve.bench.report import BenchReport
from fleetserve.perf.calibration import Calibration
from fleetserve.sim.build import model_setups
from fleetserve.sim.calibrate import fit, overlap, prediction_errors, with_calibration
from fleetserve.sim.command import simulation_plan
from fleetserve.sim.run import simulate_traces
from fleetserve.spec import default_fleet, load_spec

GOALS = {"output_throughput": 0.10, "tpot.p50": 0.10, "ttft.p50": 0.20, "ttft.p90": 0.20}


def _run(item: str) -> tuple[str, BenchReport, str | None]:
    """(name, report, model) of ``BENCH.json[=MODEL][@POINT,...]``."""
    head, at, labels = item.rpartition("@") if "@" in item else (item, "", "")
    path, _, model = head.partition("=")
    report = BenchReport.load(Path(path))
    name = Path(path).stem
    if at:
        keep = set(labels.split(","))
        missing = keep - {p.label for p in report.points}
        if missing:
            raise SystemExit(f"{path}: no load point {', '.join(sorted(missing))}")
        report = report.with_points(keep)
        name += "@" + labels
    return name, report, model or None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", type=Path, help="the fleet the runs were served by")
    ap.add_argument("--calibrate", nargs="+", required=True)
    ap.add_argument("--predict", nargs="*", default=[])
    ap.add_argument("--together", nargs="*", default=[], help="runs measured at the same time")
    ap.add_argument(
        "--uncapped",
        action="store_true",
        help="the runs were served without HAMi (fleetserve serve on one host): no "
        "gpucores cap, every engine may use the whole card's SMs (as the local plan, "
        "cores_percent 0), the plan's slices only set memory",
    )
    args = ap.parse_args()
    # planned as `fleetserve simulate` plans (a spec without pools: the 2-CPU, 23 GiB host
    # the CPU fixtures ran on)
    spec = load_spec(args.spec) if args.spec else default_fleet()
    host = argparse.Namespace(host_cpus=2, host_memory_gb=23, uncapped=args.uncapped)
    plan = simulation_plan(spec, host)
    cpu = not any(r.gpus for r in plan.replicas)
    start = Calibration.default(cpu=cpu)
    base = args.spec.parent if args.spec else None
    models = (
        model_setups(spec, plan, start, base_dir=base) if base else model_setups(spec, plan, start)
    )
    cal_runs = [(report, model) for _, report, model in map(_run, args.calibrate)]
    cal = fit(models, cal_runs, start=start)
    print(cal.model_dump_json(indent=1))
    print("| set | run | point | metric | measured | simulated | error | goal |")
    print("|---|---|---|---|---:|---:|---:|---|")
    groups = [("calibration", [r]) for r in args.calibrate]
    groups += [("prediction", [r]) for r in args.predict]
    if args.together:
        groups.append(("together", args.together))
    for kind, items in groups:
        runs = [_run(i) for i in items]
        sim = simulate_traces(
            with_calibration(models, cal),
            [(report, model) for _, report, model in runs],
            request_overhead_s=cal.request_overhead_s,
        )
        measured = {model or report.run.model: report for _, report, model in runs}
        simulated = {name: sim.reports[name] for name in measured}
        if kind == "together":
            # scored while every engine of the group ran (sim.calibrate.overlap)
            measured, simulated = overlap(measured), overlap(simulated)
        for run_name, report, model in runs:
            name = model or report.run.model
            for _, point, metric, a, b in prediction_errors(
                {name: measured[name]}, {name: simulated[name]}
            ):
                err = b / a - 1
                ok = "yes" if abs(err) <= GOALS[metric] else "no"
                row = (kind, run_name, point, metric, f"{a:.1f}", f"{b:.1f}", f"{err:+.1%}", ok)
                print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
