"""SLO planner speed when many models break a target beside their card's neighbours.

Design note. ``plan_fleet`` plans a traffic-planned model again on whole cards when it
breaks an SLO only beside the other replicas on its card (``card_sharing``), one round per
batch of crowded models that share no card, re-packing the fleet each round
(``fleetserve.plan.planner``). The cost of a plan is its number of rounds times one
packing. This times the worst shape for it: ``--models`` Qwen2.5 7B chats at 1 req/s with
a TPOT p50 target that two of them on one card break (55 ms: each reads 53.6 ms alone
on half an RTX A6000, 55.6 ms beside the other), on one node of ``--cards`` A6000s, so
every pair that lands on one card is crowded. Reported: seconds (median of ``--runs``),
models moved to whole cards, models meeting every target, GPUs, cost per hour. The default
performance model (the roofline fleetserve plans with when no calibration is given).

    PYTHONPATH=src .venv/bin/python benchmarks/slo_plan.py --models 24 --cards 24
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from fleetserve.plan import plan_fleet
from fleetserve.spec import FleetSpec, parse_spec


def crowded_fleet(models: int, cards: int, tpot_ms: float) -> FleetSpec:
    return parse_spec(
        {
            "models": [
                {
                    "name": f"chat-{i}",
                    "config": "qwen2.5-7b",
                    "max_model_len": 4096,
                    "traffic": {
                        "rate": 1,
                        "prompt_tokens": {"mean": 300, "p99": 1000},
                        "output_tokens": {"mean": 100, "p99": 300},
                    },
                    "slo": {"ttft_ms": {"p99": 3000}, "tpot_ms": {"p50": tpot_ms}},
                }
                for i in range(models)
            ],
            "pools": [
                {
                    "name": "a6000",
                    "gpu": {"type": "RTX-A6000", "count": cards},
                    "cpu": 32 * cards,
                    "memory_gb": 256 * cards,
                    "max_nodes": 1,
                    "cost_per_hour": 0.8 * cards,
                }
            ],
        }
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=24)
    p.add_argument("--cards", type=int, default=24)
    p.add_argument("--tpot-ms", type=float, default=55.0)
    p.add_argument("--runs", type=int, default=2)
    a = p.parse_args(argv)
    spec = crowded_fleet(a.models, a.cards, a.tpot_ms)
    times: list[float] = []
    row: dict[str, Any] = {}
    for _ in range(a.runs):
        t0 = time.perf_counter()
        result = plan_fleet(spec)
        times.append(time.perf_counter() - t0)
        row = {
            "models": a.models,
            "cards": a.cards,
            "feasible": result.feasible,
            "own_cards": sum(t.own_cards for t in result.traffic),
            "met": sum(t.met for t in result.traffic),
            "card_sharing": sum(t.binding == "card_sharing" for t in result.traffic),
            "gpus": len({(r.node, g) for r in result.replicas for g in r.gpus}),
            "cost_per_hour": round(result.cost_per_hour, 2),
        }
    row["seconds_median"] = round(statistics.median(times), 1)
    row["seconds_all"] = [round(t, 1) for t in times]
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
