"""The simulator's fast paths (issue #29): each computes what the path it replaced did, and
sampled replicas stand for a model's whole fleet where they are exchangeable, and only
there."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator

import numpy as np
import pytest

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.metrics import summarize
from fleetserve.cli import main
from fleetserve.errors import UsageError
from fleetserve.host import HostFacts
from fleetserve.perf import Calibration, EngineLimits, Traffic, engine_perf, estimate
from fleetserve.plan.architecture import load_model_config
from fleetserve.plan.gpus import gpu_type
from fleetserve.plan.local import plan_local
from fleetserve.sim.build import (
    DRAW_BLOCK,
    _draws,
    _synthetic,
    model_setups,
    to_record,
    workload_streams,
)
from fleetserve.sim.columns import summarize_columns
from fleetserve.sim.engine import Card, EngineSim, SimRequest
from fleetserve.sim.fleet import (
    FleetSimulation,
    ModelSetup,
    ReplicaSetup,
    StreamRun,
    _least_loaded,
)
from fleetserve.sim.parts import Part, Settings, simulate_part, simulate_parts, split
from fleetserve.sim.run import SimOutcome, simulate_workload
from fleetserve.sim.workload import StreamSpec, WorkloadSpec
from fleetserve.spec import ReplicaSpec, RoutingSpec, default_fleet

# --------------------------------------------------------------------------- exact paths


@pytest.fixture(scope="module")
def cpu_models() -> list[ModelSetup]:
    spec = default_fleet()
    plan = plan_local(spec, HostFacts(cpus=2, memory_mb=23 * 1024))
    return model_setups(spec, plan, Calibration.default(cpu=True))


def _finished(models: list[ModelSetup], workload: WorkloadSpec, columns: bool) -> list[StreamRun]:
    streams = workload_streams(workload, lambda: 0.0)
    sim = FleetSimulation(
        models,
        streams,
        request_overhead_s=0.01,
        seed=workload.seed,
        horizon_s=(workload.duration_s or 0.0) + 600.0,
        columns=columns,
    )
    sim.run()
    return streams


def test_requests_kept_as_columns_summarise_as_their_records_do(cpu_models) -> None:  # type: ignore[no-untyped-def]
    """A run without records keeps its requests as columns: their summary is the records'
    summary, field for field - warm-up requests, 503s from a full model, timeouts at the
    horizon included."""
    models = [
        dataclasses.replace(
            m,
            replicas=tuple(dataclasses.replace(r, kv_blocks=400) for r in m.replicas),
            replica_spec=m.replica_spec.model_copy(
                update={"max_ongoing_requests": 3, "max_queued_requests": 2}
            ),
        )
        for m in cpu_models
    ]
    workload = WorkloadSpec.model_validate(
        {
            "streams": [
                {
                    "model": "gemma-3-270m",
                    "load": {"kind": "rate", "rate": 1},
                    "input_len": "uniform:16-30000",
                    "output_len": "uniform:1-50000",
                    "warmup": 2,
                }
            ],
            "duration_s": 20,
        }
    )
    (kept,) = _finished(models, workload, columns=False)
    (cols,) = _finished(models, workload, columns=True)
    assert cols.columns is not None
    assert not cols.done
    records = [to_record(r, kept.label) for r in sorted(kept.done, key=lambda r: r.id)]
    expect = summarize(kept.label, kept.x, records, None)
    assert expect.errors_by_type.keys() == {"http_503_overloaded", "timeout"}
    assert expect.warmup == 2
    assert summarize_columns(cols.label, cols.x, cols.columns) == expect


def _one_at_a_time(
    stream: StreamSpec, seed: int, duration: float
) -> itertools.islice[tuple[float, int, int, int, int, bool]]:
    """The request stream as it was drawn before the batched draws: one call per value."""

    def gen() -> Iterator[tuple[float, int, int, int, int, bool]]:
        rng = np.random.default_rng(seed)
        arrivals = stream.load.arrivals(seed)
        limit = stream.num_requests + stream.warmup if stream.num_requests else None
        for n in itertools.count():
            if limit is not None and n >= limit:
                return
            t = next(arrivals)
            if not stream.num_requests and t > duration:
                return
            group = int(rng.integers(stream.prefix_groups)) if stream.prefix_groups else -1
            prefix = stream.prefix_len if group >= 0 else 0
            prompt = prefix + stream.input_len.sample(rng)
            yield (
                t,
                prompt,
                stream.output_len.sample(rng),
                group,
                prefix,
                n < stream.warmup,
            )

    return itertools.islice(gen(), 12_000)


@pytest.mark.parametrize(
    "stream",
    [
        {"input_len": "uniform:128-1024", "output_len": "uniform:32-512"},
        {"input_len": "uniform:5-5", "output_len": "uniform:1-3", "prefix_groups": 1},
        {
            "input_len": 64,
            "output_len": "uniform:1-999999",
            "prefix_groups": 7,
            "warmup": 3,
        },
        {"input_len": 64, "output_len": 32, "num_requests": 5000},
        {"input_len": "normal:100,30", "output_len": "uniform:1-9", "prefix_groups": 3},
    ],
)
def test_batched_length_draws_are_the_one_at_a_time_draws(
    stream: dict[str, object],
) -> None:
    spec = StreamSpec.model_validate(
        {"model": "m", "load": {"kind": "rate", "rate": 50}, "prefix_len": 16, **stream}
    )
    rng, one = np.random.default_rng(7), np.random.default_rng(7)
    groups = spec.prefix_groups
    expect = [
        (
            int(one.integers(groups)) if groups else -1,
            spec.input_len.sample(one),
            spec.output_len.sample(one),
        )
        for _ in range(3 * DRAW_BLOCK // 2)
    ]
    assert list(itertools.islice(_draws(spec, rng), len(expect))) == expect
    fast = list(itertools.islice(_synthetic(spec, 7, 200.0), 12_000))
    assert fast == list(_one_at_a_time(spec, 7, 200.0))
    assert len(fast) > 4000


def test_least_loaded_is_the_minimum_of_load_then_kv_usage() -> None:
    rng = random.Random(3)
    perf = engine_perf(load_model_config("qwen2.5-7b"), gpu_type("A100"))
    for _ in range(300):
        engines = [
            EngineSim(
                f"e{i}",
                "m",
                perf,
                Card(f"c{i}"),
                max_num_seqs=8,
                max_num_batched_tokens=512,
                kv_blocks=rng.choice([10, 20]),
                block_size=16,
            )
            for i in range(rng.randint(1, 6))
        ]
        for e in engines:
            e.ongoing = rng.randint(0, 4)
            e._blocks_free = float(rng.randint(0, 2) * 5)
            e.active = rng.random() > 0.1
        cap = rng.randint(1, 5)
        room = [e for e in engines if e.active and e.load < cap]
        expect = min(room, key=lambda e: (e.load, e.kv_usage)) if room else None
        assert _least_loaded(engines, cap) is expect


# --------------------------------------------------------------------------- sampling

QWEN = engine_perf(load_model_config("qwen2.5-7b"), gpu_type("A100"))


def _model(n: int = 8, **change: object) -> ModelSetup:
    """``n`` alike replicas of a 7B on A100s, one a card, least-loaded routing."""
    replicas = tuple(
        ReplicaSetup(f"m#{k}", f"card{k}", QWEN, 256, 8192, 12_500, 16) for k in range(n)
    )
    setup = ModelSetup(
        "m",
        replicas,
        ReplicaSpec(min=n, max=n, max_ongoing_requests=512),
        RoutingSpec(policy="prefix"),
        n,
    )
    return dataclasses.replace(setup, **change)  # type: ignore[arg-type]


def _load(n: int, seconds: float, **stream: object) -> WorkloadSpec:
    """60 % of ``n`` replicas' estimated capacity, chat-like lengths."""
    cap = estimate(QWEN, Traffic(1.0, 576, 272), EngineLimits(256, 8192, 200_000)).capacity
    return WorkloadSpec.model_validate(
        {
            "streams": [
                {
                    "model": "m",
                    "load": {"kind": "rate", "rate": round(0.6 * cap * n, 3)},
                    "input_len": "uniform:128-1024",
                    "output_len": "uniform:32-512",
                    **stream,
                }
            ],
            "duration_s": seconds,
        }
    )


def test_sampled_replicas_stand_for_the_whole_model() -> None:
    """4 of 8 exchangeable replicas with half the traffic: latency percentiles within 5 %
    of simulating all 8 (measured: within 2.5 % over four seeds), counts and throughputs
    scaled back within 3 % (Poisson noise of ~20,000 requests), and the report says so."""
    workload = _load(8, 600)
    full = simulate_workload([_model()], workload, request_overhead_s=0.01, records=False)
    part = simulate_workload(
        [_model()], workload, request_overhead_s=0.01, records=False, sample_replicas=4
    )
    assert part.sampled
    assert not full.sampled
    assert part.sampling["m"].simulated == 4
    assert part.simulated_requests < 0.55 * full.simulated_requests
    a, b = full.reports["m"].points[0], part.reports["m"].points[0]
    for metric in ("ttft", "tpot", "e2e"):
        for p in ("p50", "p90"):
            fleet, sample = (
                getattr(getattr(a, metric), p),
                getattr(getattr(b, metric), p),
            )
            assert sample == pytest.approx(fleet, rel=0.05), (metric, p)
    for field in ("requests", "succeeded", "request_throughput", "output_throughput"):
        assert getattr(b, field) == pytest.approx(getattr(a, field), rel=0.03), field
    assert part.requests == pytest.approx(full.requests, rel=0.03)
    assert b.label == a.label
    assert b.x == a.x
    assert "4 of 8 replicas simulated" in part.reports["m"].run.workload


@pytest.mark.parametrize(
    ("model", "stream", "reason"),
    [
        (_model(), {"prefix_groups": 4, "prefix_len": 256}, "prefix-affinity"),
        (
            _model(replica_spec=ReplicaSpec(min=8, max=10, max_ongoing_requests=512)),
            {},
            "autoscaling",
        ),
        (
            _model(
                replicas=tuple(
                    dataclasses.replace(r, card=f"card{k // 2}")
                    for k, r in enumerate(_model().replicas)
                )
            ),
            {},
            "share cards",
        ),
        (
            _model(
                replicas=tuple(
                    dataclasses.replace(r, kv_blocks=12_500 + k)
                    for k, r in enumerate(_model().replicas)
                )
            ),
            {},
            "differ",
        ),
        (
            _model(),
            {"load": {"kind": "concurrency", "concurrency": 64}, "num_requests": 300},
            "closed-loop",
        ),
    ],
)
def test_sampling_is_not_used_where_replicas_are_not_exchangeable(
    model: ModelSetup, stream: dict[str, object], reason: str
) -> None:
    workload = _load(8, 20, **stream)
    whole = simulate_workload([model], workload, request_overhead_s=0.01, records=False)
    asked = simulate_workload(
        [model], workload, request_overhead_s=0.01, records=False, sample_replicas=4
    )
    assert not asked.sampled
    assert reason in asked.sampling["m"].reason
    assert asked.sampling["m"].simulated == asked.sampling["m"].replicas == 8
    assert _dump(asked) == _dump(whole)


def _dump(out: SimOutcome) -> object:
    return (
        {k: r.model_dump() for k, r in out.reports.items()},
        out.requests,
        out.steps,
        out.simulated_requests,
    )


def test_a_sample_of_no_replicas_is_refused_with_a_message() -> None:
    with pytest.raises(UsageError, match="at least 1 replica"):
        simulate_workload([_model()], _load(8, 5), request_overhead_s=0.0, sample_replicas=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "w.yaml", "--sample-replicas", "0"], "at least 1 replica"),
        (["--trace", "run.json", "--sample-replicas"], "applies to --workload runs"),
    ],
)
def test_the_command_refuses_a_sample_it_cannot_take(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "fleet.yaml", *args]) != 0
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- parts


def _fleet() -> tuple[list[ModelSetup], WorkloadSpec]:
    """Five models: two alone on their cards, two sharing a card (one part), one more
    routed by pow2 with another pow2 model (one part: one random generator); a
    closed-loop stream and a warm-up among the streams."""
    small = engine_perf(load_model_config("llama-3.2-1b"), gpu_type("L40S"))

    def model(name: str, cards: list[str], policy: str = "prefix") -> ModelSetup:
        replicas = tuple(
            ReplicaSetup(f"{name}#{k}", card, small, 64, 2048, 4000, 16)
            for k, card in enumerate(cards)
        )
        spec = ReplicaSpec(min=len(cards), max=len(cards), max_ongoing_requests=64)
        return ModelSetup(name, replicas, spec, RoutingSpec(policy=policy), len(cards))  # type: ignore[arg-type]

    models = [
        model("a", ["c0", "c1"]),
        model("b", ["c2", "c3"], "pow2"),
        model("c", ["c4", "c5"]),
        model("d", ["c5", "c6"], "round_robin"),
        model("e", ["c7", "c8"], "pow2"),
    ]
    rate = {"kind": "rate", "rate": 40}
    streams: list[dict[str, object]] = [
        {"model": "a", "load": rate, "warmup": 5},
        {"model": "b", "load": rate},
        {"model": "c", "load": {"kind": "concurrency", "concurrency": 16}, "duration_s": 20},
        {"model": "d", "load": rate},
        {"model": "e", "load": {"kind": "rate", "rate": 30, "arrival": "gamma", "burstiness": 0.5}},
        {"model": "a", "load": {"kind": "rate", "rate": 10}, "label": "second"},
    ]
    for s in streams:
        s.update({"input_len": "uniform:64-1024", "output_len": "uniform:16-256"})
    return models, WorkloadSpec.model_validate({"streams": streams, "duration_s": 20})


def test_a_fleet_simulated_in_parts_is_the_fleet_simulated_at_once() -> None:
    models, workload = _fleet()
    parts = split(models, workload)
    assert parts is not None
    assert [[m.name for m in p.models] for p in parts] == [["a"], ["b", "e"], ["c", "d"]]
    settings = Settings(0.01, 60.0, 620.0, "simulated")
    whole = simulate_part(
        Part(tuple(models), tuple(range(len(workload.streams)))), workload, settings, keep=False
    )
    assert not whole.stopped_at_horizon
    for workers in (1, 2):
        results = simulate_parts(
            parts, workload, settings, workers=workers, weights=[1.0] * len(parts)
        )
        reports = {k: r.model_dump() for p in results for k, r in p.reports.items()}
        assert reports == {k: r.model_dump() for k, r in whole.reports.items()}
        assert max(p.now for p in results) == whole.now
        for count in ("finished", "steps", "preemptions"):
            merged = {k: v for p in results for k, v in getattr(p, count).items()}
            assert merged == getattr(whole, count), count
    out = simulate_workload(models, workload, request_overhead_s=0.01, records=False, workers=2)
    assert {k: r.model_dump() for k, r in out.reports.items()} == {
        k: r.model_dump() for k, r in whole.reports.items()
    }
    assert list(out.reports) == ["a", "b", "c", "d", "e"]
    assert out.sim_seconds == whole.now


def test_an_autoscaling_fleet_is_simulated_at_once() -> None:
    models, workload = _fleet()
    models[0] = dataclasses.replace(
        models[0], replica_spec=models[0].replica_spec.model_copy(update={"max": 3})
    )
    assert split(models, workload) is None


def test_a_part_that_reaches_the_horizon_sends_the_fleet_back_to_one_simulation() -> None:
    """Requests still running at the horizon time out at the whole fleet's last event, which
    a part alone does not know: the fleet is simulated at once then, as before parts."""
    models, workload = _fleet()
    overload = workload.model_copy(
        update={
            "streams": [
                s.model_copy(update={"output_len": LengthDistribution.parse("60000")})
                if s.model == "d"
                else s
                for s in workload.streams
            ],
            "duration_s": 2.0,
        }
    )
    settings = Settings(0.01, 60.0, 602.0, "simulated")
    parts = split(models, overload)
    assert parts is not None
    results = simulate_parts(parts, overload, settings, workers=1, weights=[1.0] * 3)
    assert any(r.stopped_at_horizon for r in results)
    whole = simulate_part(
        Part(tuple(models), tuple(range(len(overload.streams)))), overload, settings, keep=False
    )
    out = simulate_workload(models, overload, request_overhead_s=0.01, records=False, workers=2)
    assert {k: r.model_dump() for k, r in out.reports.items()} == {
        k: r.model_dump() for k, r in whole.reports.items()
    }
    assert out.reports["d"].points[0].errors_by_type.get("timeout")


def _drain(engine: EngineSim, requests: list[SimRequest], gaps: list[float]) -> int:
    """Submit ``requests`` at the given gaps and run the engine until it is idle; returns
    the most sequences it ran at once."""
    peak = 0
    t, end, pending = 0.0, None, list(zip(requests, gaps, strict=True))
    while pending or end is not None:
        nxt = t + pending[0][1] if pending else None
        if end is None or (nxt is not None and nxt < end):
            assert nxt is not None
            t = nxt
            req, _ = pending.pop(0)
            new = engine.submit(req, t)
            end = new if new is not None else end
        else:
            t = end
            end = engine.complete(t)
        # what is taken never exceeds the cache, whatever the path (runs, preemption, cache)
        assert -1e-9 <= engine._blocks_free <= engine.kv_blocks + 1e-9
        peak = max(peak, len(engine.running))
    return peak


@pytest.mark.parametrize("model", ["qwen2.5-7b", "gemma-3-4b", "gemma-3-270m"])
@pytest.mark.parametrize("seed", range(6))
def test_kv_blocks_come_back_exactly_when_every_request_is_done(seed: int, model: str) -> None:
    """Every block a request takes - its prefill chunks, each decode step, singly or in a
    run of steps - comes back when it finishes or is preempted; only the shared prefixes
    still cached hold blocks after. (Runs of decode steps once took nothing and gave their
    growth back: the cache grew by ~25 % over a 20-request burst.) Gemma 3's sliding-window
    layers (window 1,024 and 512) hold only the window: sequences cross it while prefilling
    and while decoding, singly and within runs."""
    rng = random.Random(seed)
    perf = engine_perf(load_model_config(model), gpu_type("A100"))
    engine = EngineSim(
        "e",
        "m",
        perf,
        Card("c"),
        max_num_seqs=rng.choice([4, 8, 16]),
        max_num_batched_tokens=rng.choice([256, 512]),
        kv_blocks=rng.choice([150, 400, 2000]),  # small ones preempt
        block_size=16,
    )
    requests = []
    for i in range(40):
        group = rng.choice([-1, 0, 1, 2])
        requests.append(
            SimRequest(
                id=i,
                stream=0,
                prompt=rng.randint(20, 1500),
                output=rng.randint(1, 600),
                arrival=0.0,
                group=group,
                prefix=rng.choice([64, 200]) if group >= 0 else 0,
            )
        )
    _drain(engine, requests, [rng.expovariate(20.0) for _ in requests])
    assert all(r.end >= 0 for r in requests)
    cached = engine.cached_blocks()
    assert engine._blocks_free + cached == pytest.approx(engine.kv_blocks)


def test_a_sliding_window_model_holds_more_long_sequences_than_its_token_count() -> None:
    """A cache of 4 x 4k tokens by vLLM's count: a model attending over the whole context
    in every layer runs about 4 long sequences at once; Gemma 3 (five of six layers keep
    1,024 tokens) runs all eight."""
    prompts = [3900] * 8

    def peak(model: str) -> int:
        engine = EngineSim(
            "e",
            "m",
            engine_perf(load_model_config(model), gpu_type("H100-80GB")),
            Card("c"),
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            kv_blocks=4 * 4096 // 16,
            block_size=16,
        )
        reqs = [SimRequest(i, 0, p, 64, 0.0) for i, p in enumerate(prompts)]
        most = _drain(engine, reqs, [0.0] * len(reqs))
        assert engine._blocks_free == pytest.approx(engine.kv_blocks)
        return most

    assert peak("gemma-3-4b") == 8
    assert peak("llama-3.1-8b") <= 5
