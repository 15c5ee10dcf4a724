"""The simulator against real vLLM runs on an H100 (issue #29's GPU validation).

The runs (tests/fixtures/sim/h100, docs/benchmarks.md "Capacity simulator"): four Gemma 3
sizes served at once by one ``fleetserve serve`` on an H100 (vLLM 0.26.0, compiled, no
HAMi: every engine may use the whole card's SMs), each swept alone with ``fleetserve
bench`` (c = 1, 4, 16; 512-token prompts, 128 output tokens) while the others idled, then
the 4B and the 12B driven at the same time. The configs are the published text configs the
runs served (weight-free, ``load_format: dummy``). Calibrated on the 1B alone, the
simulator predicts the 4B and the 12B alone; the pair, scored while both ran, shows where
the co-location model falls short.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.bench.report import BenchReport
from fleetserve.perf import Calibration
from fleetserve.plan.planner import plan_fleet
from fleetserve.sim.build import model_setups, uncapped
from fleetserve.sim.calibrate import fit, overlap, prediction_errors, with_calibration
from fleetserve.sim.run import simulate_traces, simulate_workload
from fleetserve.sim.workload import WorkloadSpec
from fleetserve.spec import FleetSpec

RUNS = Path(__file__).parents[2] / "fixtures" / "sim" / "h100"
GOALS = {"output_throughput": 0.10, "tpot.p50": 0.10, "ttft.p50": 0.20, "ttft.p90": 0.20}
SIZES = ("gemma-3-270m", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b")


def _spec() -> FleetSpec:
    """The served pack on a pool of the card (its FLOP/s and bandwidth); the 270M and 1B
    only hold their memory (their configs are the catalogue's)."""
    models = []
    for name in SIZES:
        source = f"{name}" if (RUNS / name).is_dir() else f"google/{name}"
        entry = {
            "name": name,
            "source": source,
            "concurrency": 8,
            "max_model_len": 4096,
            "engine_args": {"load_format": "dummy"},
        }
        if not (RUNS / name).is_dir():
            entry["config"] = name
        models.append(entry)
    pool = {"name": "card", "gpu": {"type": "H100-80GB", "count": 1}, "cpu": 16, "memory_gb": 125}
    return FleetSpec.model_validate({"pools": [pool], "models": models})


@pytest.fixture(scope="module")
def served():  # type: ignore[no-untyped-def]
    spec = _spec()
    plan = plan_fleet(spec, scenario="min")
    # no HAMi on the host that ran them: the placements carry no gpucores cap (0, as
    # fleetserve serve's local plan writes it), the plan's slices only size memory
    plan = uncapped(plan)
    start = Calibration.default(cpu=False)
    models = model_setups(spec, plan, start, base_dir=RUNS)
    cal = fit(models, [(BenchReport.load(RUNS / "gemma-3-1b.json"), None)], start=start)
    return with_calibration(models, cal), cal


def _errors(served, *names: str, together: bool = False) -> dict[tuple[str, str, str], float]:  # type: ignore[no-untyped-def]
    models, cal = served
    reports = {n: BenchReport.load(RUNS / f"{n}.json") for n in names}
    runs = [(r, r.run.model) for r in reports.values()]
    sim = simulate_traces(models, runs, request_overhead_s=cal.request_overhead_s)
    measured: dict[str, BenchReport] = {r.run.model: r for r in reports.values()}
    simulated = sim.reports
    if together:  # scored while both ran (sim.calibrate.overlap)
        measured, simulated = overlap(measured), overlap(simulated)
    return {
        (model, point, metric): b / a - 1
        for model, point, metric, a, b in prediction_errors(measured, simulated)
    }


def test_a_one_size_calibration_keeps_the_cards_efficiencies_physical(served) -> None:  # type: ignore[no-untyped-def]
    # Runs of one size cannot tell a step's fixed overhead from its weight reads, nor a
    # request's serving latency from its prefill: without the prior on a card's
    # efficiencies the 1B's runs fitted compute 0.17, the 4B's 0.28, the 12B's 2.5 ms per
    # step, and each predicted the other sizes 20-80 % off.
    _, cal = served
    assert 0.6 <= cal.bandwidth_efficiency <= 0.9
    assert 0.4 <= cal.compute_efficiency <= 0.8
    assert cal.step_overhead_s < 0.002


def test_a_long_prefill_is_bound_by_launching_its_layers(served) -> None:  # type: ignore[no-untyped-def]
    # The c = 1 first tokens of the 1B, 4B and 12B (25.5, 30.2, 35.8 ms) grow with their
    # layers (26, 34, 48), not their prefill FLOPs (0.7, 3.3, 11.1 TFLOP): the 12B's
    # extra 10.4 TFLOP over the 1B's took 10 ms, more than the card's peak allows. A
    # 522-token step is beyond the CUDA graphs of a batch of 8 (16 tokens), so its kernels
    # are launched one by one: the fit finds a few hundred microseconds a layer, and the
    # request's own costs (serving path, intake) shrink to what a lone request pays.
    _, cal = served
    assert 2e-4 <= cal.layer_launch_s <= 1e-3
    assert cal.request_overhead_s < 0.012
    assert cal.admission_s < 0.005


def test_calibrated_on_the_1b_it_predicts_the_4b_and_the_12b(served) -> None:  # type: ignore[no-untyped-def]
    # measured one after the other: each replayed on its own; every metric of every
    # point within the goals (the 12B's c = 1 TTFT was +29 % before the launch term)
    errors = _errors(served, "gemma-3-4b") | _errors(served, "gemma-3-12b")
    for (model, point, metric), err in errors.items():
        assert abs(err) <= GOALS[metric], (model, point, metric, errors)


def test_a_co_located_pair_is_scored_while_both_ran(served) -> None:  # type: ignore[no-untyped-def]
    # The 4B and the 12B measured at the same time, simulated as one run. The 4B's run
    # ended first: 19 of the 12B's 32 requests ran alone afterwards (TPOT 10.8 ms against
    # 23.4 beside the 4B), so its whole-run p50s scored its speed alone (-3.9 %).
    whole = _errors(served, "together-gemma-3-4b", "together-gemma-3-12b")
    both = _errors(served, "together-gemma-3-4b", "together-gemma-3-12b", together=True)
    assert abs(whole[("gemma-3-12b", "c=1", "tpot.p50")]) < 0.05
    # Over the overlap both engines ran 2.2x slower than alone. Taking turns on the card
    # (each step waits a turn of the other's per turn of its own; the turn fitted on the
    # four-model pack below, not on this pair) predicts every metric of both within the
    # goals; an even split of the card had both 13-28 % too fast.
    for (model, point, metric), err in both.items():
        assert abs(err) <= GOALS[metric], (model, point, metric, both)


#: The same fleet's four-model pack run that morning (``matrix.py pack``): every model
#: driven alone by ``vllm bench serve`` - vLLM's own client, not ours - at c = 32, 128
#: prompts of 512 random tokens, 128 out, then all four at once (each run ending when its
#: 128 requests had). Its aggregate JSONs (no per-request records) are the fixtures.
PACK = RUNS / "pack"


def _pack_errors(served, names: tuple[str, ...]) -> dict[tuple[str, str], float]:  # type: ignore[no-untyped-def]
    models, cal = served
    streams = [
        {
            "model": name,
            "load": {"kind": "concurrency", "concurrency": 32},
            "input_len": "512",
            "output_len": "128",
            "num_requests": 128,
        }
        for name in names
    ]
    workload = WorkloadSpec.model_validate({"streams": streams, "seed": 1})
    out = simulate_workload(models, workload, request_overhead_s=cal.request_overhead_s)
    tag = "alone" if len(names) == 1 else "together"
    errors = {}
    for name in names:
        measured = json.loads((PACK / f"{tag}-{name}-c32.json").read_text(encoding="utf-8"))
        point = out.reports[name].points[0]
        assert point.tpot.p50 is not None
        assert point.ttft.p50 is not None
        errors[(name, "output_throughput")] = (
            point.output_throughput / measured["output_throughput"] - 1
        )
        errors[(name, "tpot.p50")] = point.tpot.p50 / measured["median_tpot_ms"] - 1
        errors[(name, "ttft.p50")] = point.ttft.p50 / measured["median_ttft_ms"] - 1
    return errors


def test_calibrated_on_the_1b_it_predicts_vllms_own_client_on_other_runs(served) -> None:  # type: ignore[no-untyped-def]
    # Runs the calibration never saw, measured by another tool, at 4x the 1B runs'
    # concurrency (so vLLM's queue holds 24 of the 32): the 1B, 4B and 12B within the goals
    for name in ("gemma-3-1b", "gemma-3-4b", "gemma-3-12b"):
        for (model, metric), err in _pack_errors(served, (name,)).items():
            assert abs(err) <= GOALS[metric], (model, metric, err)
    # the 270M's 2 ms steps are host-bound: its throughput is over-predicted (+21 %)
    small = _pack_errors(served, ("gemma-3-270m",))
    assert small[("gemma-3-270m", "output_throughput")] > GOALS["output_throughput"]
    assert abs(small[("gemma-3-270m", "ttft.p50")]) <= GOALS["ttft.p50"]


def test_four_engines_on_one_card_take_turns_on_it(served) -> None:  # type: ignore[no-untyped-def]
    # All four at once. Measured: the 270M ran at 2.8x its alone TPOT, the 1B 4.0x, the
    # 4B 2.4x, while the 12B's p50 did not move: its long steps hold the card for whole
    # turns and the small engines' short steps wait on them. An even split of the card
    # over-predicted every model's throughput, the smaller the more (270M +124 %, 1B
    # +94 %, 4B +44 %, 12B +22 %). Taking turns (``time_slice_s``, fitted here: the
    # squared log errors are least at 1.75-2.25 ms) brings every one within 25 %.
    errors = _pack_errors(served, SIZES)
    for name in SIZES:
        assert abs(errors[(name, "output_throughput")]) <= 0.25, errors
        assert abs(errors[(name, "ttft.p50")]) <= GOALS["ttft.p50"], errors
    # the small engines no longer come out far faster than they ran
    assert errors[("gemma-3-270m", "output_throughput")] < 0, errors


def test_runs_measured_together_calibrate_the_turn_on_the_card() -> None:
    # plan calibrate on the pair alone: the turn comes out near the pack's 1.75-2.25 ms,
    # and the card's efficiencies and launch cost where the one-size fits put them
    spec = _spec()
    start = Calibration.default(cpu=False)
    models = model_setups(spec, uncapped(plan_fleet(spec, scenario="min")), start, base_dir=RUNS)
    runs = [
        (BenchReport.load(RUNS / f"together-{m}.json"), m) for m in ("gemma-3-4b", "gemma-3-12b")
    ]
    cal = fit(models, runs, start=start)
    assert 1e-3 <= cal.time_slice_s <= 3e-3
    assert 0.55 <= cal.compute_efficiency <= 0.65
    assert 3e-4 <= cal.layer_launch_s <= 8e-4


def test_the_cli_calibrates_and_replays_runs_served_without_hami(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the user's path: plan calibrate on one size, simulate another, both --uncapped
    import yaml  # noqa: PLC0415

    from fleetserve.cli import main  # noqa: PLC0415

    spec = _spec().model_dump(mode="json", exclude_defaults=True)
    for m in spec["models"]:  # sources relative to the spec file, as a user writes them
        if (RUNS / m["source"]).is_dir():
            m["source"] = str(RUNS / m["source"])
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    cal = tmp_path / "cal.json"
    one_b = f"{RUNS / 'gemma-3-1b.json'}=gemma-3-1b"
    assert (
        main(["plan", "calibrate", one_b, "--spec", str(path), "--uncapped", "--output", str(cal)])
        == 0
    )
    # the file and the output say what load the fit saw (c = 1, 4 and 16 here)
    fitted = Calibration.load(cal)
    assert fitted.fit.load_range is not None
    low, high = fitted.fit.load_range
    assert 0.9 <= low <= 1.1, fitted.fit.load_range
    assert 8.0 <= high <= 16.0, fitted.fit.load_range
    said = " ".join(capsys.readouterr().out.split())
    assert f"{low:.1f} to {high:.1f} requests in flight" in said
    out = tmp_path / "sim.json"
    four_b = f"{RUNS / 'gemma-3-4b.json'}=gemma-3-4b"
    args = [
        str(path),
        "--uncapped",
        "--trace",
        four_b,
        "--calibration",
        str(cal),
        "--output",
        str(out),
    ]
    assert main(["simulate", *args]) == 0
    assert "requests in flight" in " ".join(capsys.readouterr().out.split())
    simulated = BenchReport.load(out)
    measured = BenchReport.load(RUNS / "gemma-3-4b.json")
    for _, point, metric, a, b in prediction_errors(
        {"gemma-3-4b": measured}, {"gemma-3-4b": simulated}
    ):
        assert abs(b / a - 1) <= GOALS[metric], (point, metric, a, b)
    capped = tmp_path / "capped.json"
    args = [str(path), "--trace", four_b, "--calibration", str(cal), "--output", str(capped)]
    assert main(["simulate", *args]) == 0
    # the HAMi plan's 19 % cores cap the 4B: its TTFT under load is far longer capped
    slow = {p.label: p.ttft.p50 for p in BenchReport.load(capped).points}
    fast = {p.label: p.ttft.p50 for p in simulated.points}
    assert slow["c=4"] is not None
    assert fast["c=4"] is not None
    assert slow["c=4"] > 1.3 * fast["c=4"]
