"""Speed of the fleet simulator: a 1,000-GPU, 100-model fleet-hour (issue #29).

The fleet: 100 models from the built-in catalogue (1B-70B, cycling through 10 families), 1,000
H100/H200/L40S/A100 cards, every replica on a whole card (tensor parallel 4 for the 70B
ones, 2 for the 27-32B ones), default GPU constants; each model gets a Poisson stream sized
to ~60 % of its replicas' estimated capacity (:func:`fleetserve.perf.estimate`) with chat-like
lengths (prompts uniform 128-1024, outputs uniform 32-512). The fleet is built directly from
the performance model (planning 1,000 cards is the planner's benchmark, benchmarks/packing.py),
so the time measured is the simulation's: event loop, engines, routing, summaries.

    PYTHONPATH=src .venv/bin/python benchmarks/simulator.py [--gpus 1000] [--models 100] [--hours 1]
        [--sample-replicas [N]] [--workers N]

``--sample-replicas`` simulates N replicas per model (default
:data:`fleetserve.sim.sampling.DEFAULT_SAMPLE`) with their share of the traffic and scales
the counts (:mod:`fleetserve.sim.sampling`); the line printed says how many requests were
simulated and how many the fleet served. The fleet's routing is ``prefix`` and its streams
carry no shared prefix, so every model qualifies. ``--workers`` simulates the fleet's
independent parts (here: every model, each on cards of its own) in that many processes
(:mod:`fleetserve.sim.parts`; the same result).
"""

from __future__ import annotations

import argparse
import time

from fleetserve.perf import EngineLimits, Traffic, engine_perf, estimate
from fleetserve.plan.architecture import load_model_config
from fleetserve.plan.gpus import gpu_type
from fleetserve.sim.fleet import ModelSetup, ReplicaSetup
from fleetserve.sim.run import simulate_workload
from fleetserve.sim.sampling import DEFAULT_SAMPLE
from fleetserve.sim.workload import StreamSpec, WorkloadSpec
from fleetserve.spec import ReplicaSpec, RoutingSpec

FAMILIES = (
    ("llama-3.2-1b", 1),
    ("qwen2.5-7b", 1),
    ("llama-3.1-8b", 1),
    ("gemma-3-12b", 1),
    ("qwen3-14b", 1),
    ("mistral-7b-v0.3", 1),
    ("gemma-3-27b", 2),
    ("qwen2.5-32b", 2),
    ("llama-3.1-70b", 4),
    ("qwen3-4b", 1),
)
CARDS = ("H100", "H200", "L40S", "A100")
PROMPT, OUTPUT = "uniform:128-1024", "uniform:32-512"


def build(gpus: int, models: int) -> tuple[list[ModelSetup], list[StreamSpec]]:
    weights = [tp for _, tp in FAMILIES]
    per_model_cards = gpus / models
    setups, streams = [], []
    card_no = 0
    for i in range(models):
        name, tp = FAMILIES[i % len(FAMILIES)]
        card = gpu_type(CARDS[i % len(CARDS)])
        if card.name.startswith("L40S") and tp > 1:
            card = gpu_type("H100")
        config = load_model_config(name)
        perf = engine_perf(config, card, tensor_parallel=tp)
        n = max(
            1,
            round(
                per_model_cards * sum(weights) / len(weights) / tp / (sum(weights) / len(weights))
            ),
        )
        n = max(1, int(per_model_cards // tp))
        replicas = tuple(
            ReplicaSetup(
                id=f"m{i}#{k}",
                card=f"card{card_no + k * tp}",
                perf=perf,
                max_num_seqs=256,
                max_num_batched_tokens=8192,
                kv_blocks=200_000 // 16,
                block_size=16,
            )
            for k in range(n)
        )
        card_no += n * tp
        setups.append(
            ModelSetup(
                name=f"m{i}",
                replicas=replicas,
                replica_spec=ReplicaSpec(
                    min=n, max=n, max_ongoing_requests=512, target_ongoing_requests=64
                ),
                routing=RoutingSpec(policy="prefix"),
                start=n,
            )
        )
        cap = estimate(perf, Traffic(1.0, 576, 272), EngineLimits(256, 8192, 200_000)).capacity
        streams.append(
            StreamSpec.model_validate(
                {
                    "model": f"m{i}",
                    "load": {"kind": "rate", "rate": round(0.6 * cap * n, 3)},
                    "input_len": PROMPT,
                    "output_len": OUTPUT,
                }
            )
        )
    return setups, streams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument(
        "--sample-replicas",
        type=int,
        nargs="?",
        const=DEFAULT_SAMPLE,
        metavar="N",
        help=f"simulate N replicas per model (default {DEFAULT_SAMPLE}) and scale the counts",
    )
    ap.add_argument("--workers", type=int, default=1, metavar="N", help="processes (default 1)")
    args = ap.parse_args()
    if args.gpus < 1 or args.models < 1 or args.hours <= 0 or args.workers < 1:
        ap.error("--gpus, --models and --workers must be at least 1, --hours above 0")
    setups, streams = build(args.gpus, args.models)
    cards = len({r.card for m in setups for r in m.replicas})
    rate = sum(s.load.rate or 0 for s in streams)
    workload = WorkloadSpec(streams=streams, duration_s=args.hours * 3600)
    began = time.perf_counter()
    out = simulate_workload(
        setups,
        workload,
        request_overhead_s=0.01,
        records=False,
        sample_replicas=args.sample_replicas,
        workers=args.workers,
    )
    wall = time.perf_counter() - began
    replicas = sum(len(m.replicas) for m in setups)
    print(
        f"{args.models} models, {replicas} replicas on ~{args.gpus} GPUs ({cards} first cards), "
        f"{rate:,.0f} req/s offered, {args.hours:g} h simulated"
    )
    print(
        f"{out.requests:,} requests, {out.steps:,} engine steps, {out.preemptions} preemptions: "
        f"{wall:.1f} s wall ({out.requests / wall:,.0f} requests/s)"
    )
    if out.sampling:
        sampled = [s for s in out.sampling.values() if s.sampled]
        print(
            f"sampled {len(sampled)} of {len(out.sampling)} models: "
            f"{sum(s.simulated for s in sampled)} of {sum(s.replicas for s in sampled)} "
            f"replicas, {out.simulated_requests:,} requests simulated "
            f"({wall / max(out.simulated_requests, 1) * 1e6:.1f} us each)"
        )
    worst = max(p.ttft.p50 or 0 for r in out.reports.values() for p in r.points)
    print(f"worst model TTFT p50 {worst:.0f} ms")


if __name__ == "__main__":
    main()
