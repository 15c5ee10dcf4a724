"""Calibrate on some CPU bench runs, predict others, print the error table (issue #29).

    PYTHONPATH=src .venv/bin/python benchmarks/sim_validation.py \
        --calibrate tests/fixtures/sim/cpu-cal.json \
        --predict tests/fixtures/sim/cpu-pred-conc.json tests/fixtures/sim/cpu-pred-long.json \
                  tests/fixtures/sim/cpu-pred-rate.json

The fleet is the built-in default one (what the runs were served by), planned for a 2-CPU,
23 GiB host like the one they ran on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetserve.bench.report import BenchReport
from fleetserve.host import HostFacts
from fleetserve.perf.calibration import Calibration
from fleetserve.plan.local import plan_local
from fleetserve.sim.build import model_setups
from fleetserve.sim.calibrate import fit, prediction_errors, with_calibration
from fleetserve.sim.run import simulate_traces
from fleetserve.spec import default_fleet

GOALS = {"output_throughput": 0.10, "tpot.p50": 0.10, "ttft.p50": 0.20, "ttft.p90": 0.20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibrate", nargs="+", type=Path, required=True)
    ap.add_argument("--predict", nargs="*", type=Path, default=[])
    args = ap.parse_args()
    spec = default_fleet()
    plan = plan_local(spec, HostFacts(cpus=2, memory_mb=23 * 1024))
    start = Calibration.default(cpu=True)
    models = model_setups(spec, plan, start)
    cal_runs = [(BenchReport.load(p), None) for p in args.calibrate]
    cal = fit(models, cal_runs, start=start)
    print(cal.model_dump_json(indent=1))
    print("| set | run | point | metric | measured | simulated | error | goal |")
    print("|---|---|---|---|---:|---:|---:|---|")
    for kind, paths in (("calibration", args.calibrate), ("prediction", args.predict)):
        for path in paths:
            report = BenchReport.load(path)
            sim = simulate_traces(
                with_calibration(models, cal),
                [(report, None)],
                request_overhead_s=cal.request_overhead_s,
            )
            for _, point, metric, a, b in prediction_errors(
                {report.run.model: report}, sim.reports
            ):
                err = b / a - 1
                ok = "yes" if abs(err) <= GOALS[metric] else "no"
                row = (kind, path.stem, point, metric, f"{a:.1f}", f"{b:.1f}", f"{err:+.1%}", ok)
                print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
