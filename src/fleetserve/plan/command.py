"""``fleetserve plan fleet.yaml [--format table|json] [--scenario min|max] [--node-limit N]
[--time-limit S] [--calibration CAL.json]``.

``--calibration`` (what ``fleetserve plan calibrate`` writes, read by the one loader
``simulate`` uses) sets the performance model's constants for models planned from their
traffic; it must be a CUDA calibration, since traffic planning sizes GPU replicas.

Prints a rich table by default and exactly ``PlanResult.model_dump(mode="json")`` with
``--format json``. Exit codes: 0 every replica placed, 1 some replica could not be placed
(the output says why), 2 bad input (unreadable spec, unknown GPU type or model config).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetserve.errors import UsageError
from fleetserve.perf.calibration import Calibration, add_calibration_argument
from fleetserve.plan.milp import NODE_LIMIT
from fleetserve.plan.planner import DEFAULT_TIME_LIMIT_S, plan_fleet
from fleetserve.plan.result import PlanResult, TrafficPlan
from fleetserve.spec import load_spec


def _time_limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, got {value:g}")
    return value


def _node_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: '{text}'") from None
    if not 1 <= value <= 10_000_000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 10000000, got {value}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="place every model replica on GPU pools (HAMi slices + vLLM settings)",
        description=(
            "Compute each replica's memory from its model config, pack the replicas onto the "
            "fleet's GPU pools - most replicas placed, then lowest cost (pools[].cost_per_hour), "
            "then fewest GPUs, then fewest nodes; exact MILP within a deterministic node limit, "
            "else a heuristic with its gap to the lower bound - and derive HAMi limits and vLLM "
            "settings."
        ),
    )
    parser.add_argument("spec", help="fleet spec (YAML)")
    parser.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format"
    )
    parser.add_argument(
        "--scenario",
        choices=("min", "max"),
        default="min",
        help="plan the min replicas (default) or the max replicas of every model",
    )
    parser.add_argument(
        "--node-limit",
        type=_node_limit,
        default=NODE_LIMIT,
        metavar="N",
        help="branch-and-bound nodes per objective level: decides the answer, the same on "
        f"every machine (default {NODE_LIMIT})",
    )
    parser.add_argument(
        "--time-limit",
        type=_time_limit,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help="safety net on the exact solver's seconds; the output says when it was hit "
        f"(0: heuristic only; default {DEFAULT_TIME_LIMIT_S:g})",
    )
    add_calibration_argument(parser, "the step-time constants traffic planning uses")
    parser.set_defaults(handler=run)


def read_calibration(path: Path | None) -> Calibration | None:
    """The calibration of ``--calibration`` (None: none given); refuses a CPU one."""
    if path is None:
        return None
    cal = Calibration.load(path)
    if cal.backend != "cuda":
        raise UsageError(
            f"--calibration {path}: a {cal.backend} calibration, but traffic planning sizes "
            "GPU replicas",
            hint="calibrate from bench runs of a vLLM CUDA engine",
        )
    return cal


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    cal = read_calibration(args.calibration)
    result = plan_fleet(
        spec,
        scenario=args.scenario,
        time_limit_s=args.time_limit,
        node_limit=args.node_limit,
        calibration=cal,
    )
    if args.format == "json":
        json.dump(result.model_dump(mode="json"), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        # piped output keeps every column (rich would squeeze to 80 columns)
        console = Console() if sys.stdout.isatty() else Console(width=150)
        render_table(result, console)
        load = cal.fit.describe_load() if cal is not None else None
        if load is not None:
            console.print(load)
    return 0 if result.feasible else 1


def render_table(result: PlanResult, console: Console) -> None:
    """The human-readable plan: summary, replicas, pools, and what did not fit."""
    gap = "n/a" if result.optimality_gap is None else f"{result.optimality_gap:.1%}"
    state = "[green]feasible[/]" if result.feasible else "[red]NOT feasible[/]"
    cost = "" if result.cost_per_hour is None else f", {result.cost_per_hour:,.2f}/h"
    console.print(
        f"plan ({result.scenario} replicas): {state}; {result.gpus_used} GPUs, "
        f"{sum(result.nodes.values())} nodes{cost}; solver {result.solver}, gap {gap}"
        + (f" (lower bound {result.lower_bound:g} GPUs)" if result.lower_bound is not None else "")
    )
    proven = ", ".join(result.optimal) or "nothing"
    console.print(f"proven optimal: {proven}")
    if result.search_limit:
        console.print(f"[yellow]search cut short:[/] {result.search_limit}")
    table = Table(title="replicas", show_lines=False)
    for col in ("replica", "tenant", "pool/node:cards", "gpumem MiB", "cores %", "num_gpus"):
        table.add_column(col, justify="left" if col in ("replica", "tenant") else "right")
    table.add_column("gpu_memory_util", justify="right")
    table.add_column("seqs x len / batched", justify="right")
    for r in result.replicas:
        # a replica whose pipeline stages cross nodes: every node, "+"-joined
        where = " + ".join(
            f"{r.pool}/{n.node}:{','.join(map(str, n.gpus)) or 'cpu'}" for n in r.spans
        )
        table.add_row(
            f"{r.model}#{r.index}",
            r.tenant or "-",
            where,
            f"{r.memory_mb:,}",
            str(r.cores_percent),
            f"{r.num_gpus:g}",
            f"{r.engine.gpu_memory_utilization:.4f}",
            f"{r.engine.max_num_seqs} x {r.engine.max_model_len} / "
            f"{r.engine.max_num_batched_tokens}",
        )
    console.print(table)
    if result.pools:
        pools = Table(title="pools")
        columns = ["pool", "gpu", "card MiB", "nodes", "GPUs used", "slices MiB", "replicas"]
        priced = result.cost_per_hour is not None
        if priced:
            columns.append("cost/h")
        for col in columns:
            pools.add_column(col, justify="left" if col in ("pool", "gpu") else "right")
        for p in result.pools:
            row = [
                p.name,
                p.gpu_type or "-",
                f"{p.card_memory_mb:,}",
                str(p.nodes),
                f"{p.gpus_used} of {p.nodes * p.gpus_per_node}",
                f"{p.memory_used_mb:,}",
                str(p.replicas),
            ]
            if priced:
                row.append(f"{p.cost_per_hour or 0:,.2f}")
            pools.add_row(*row)
        console.print(pools)
    if result.traffic:
        slo = Table(title="traffic (SLO-driven)")
        columns = ["model", "req/s", "replicas", "on", "tp", "seqs", "gpumem MiB", "cores %"]
        columns += ["goodput/replica", "TTFT ms", "TPOT ms", "binds"]
        if result.cost_per_hour is not None:
            columns.append("cost/h")
        for col in columns:
            slo.add_column(col, justify="left" if col in ("model", "on", "binds") else "right")
        for t in result.traffic:
            row = [
                t.model if t.met else f"[red]{t.model}[/]",
                f"{t.rate:g}",
                f"{t.replicas} of {t.needed}" if t.replicas != t.needed else str(t.replicas),
                f"{t.gpu_type or '-'} ({', '.join(t.pools) or '-'})",
                str(t.tensor_parallel),
                str(t.max_num_seqs),
                f"{t.memory_mb:,}",
                _cores(t),
                f"{t.goodput_per_replica:,.2f}",
                " / ".join(f"{k} {v:,.0f}" for k, v in t.ttft_ms.items()) or "-",
                " / ".join(f"{k} {v:,.1f}" for k, v in t.tpot_ms.items()) or "-",
                t.binding,
            ]
            if result.cost_per_hour is not None:
                row.append(f"{t.cost_per_hour or 0:,.2f}")
            slo.add_row(*row)
        console.print(slo)
        for t in result.traffic:
            console.print(f"{t.model}: {t.binding}: {t.reason}")
    for u in result.unplaced:
        console.print(f"[red]unplaced[/] {u.model}#{u.index}: {u.reason}")
        for fix in u.fixes:
            console.print(f"    fix: {fix}")


def _cores(t: TrafficPlan) -> str:
    if t.beside:  # replicas beside it on one card: its latencies wait on their turns
        return f"{t.cores_percent} (+{t.beside} on card)"
    if t.own_cards:  # moved off shared cards, where an SLO broke
        return f"{t.cores_percent} (own cards)"
    return str(t.cores_percent)


__all__ = ["UsageError", "register", "render_table", "run"]
