"""Does the rest of a fleet on the engine's core cost the engine throughput? One server, A/B.

Design note. A CPU engine is pinned to the cores it claims (``engine/cpu_binding.py``) and
runs at Ray's worker niceness 15; Ray's daemons, the Serve controller, the ingress and the
replica's own Python (Ray's idle floor, ~11 % of a core) run on any core, the engine's
included. Would keeping them off it help? To measure only that, this script starts one
``fleetserve serve`` (default model, real vLLM) and alternates phases on that one server,
changing nothing but the CPU affinity of every thread of its processes other than the
engine's:

* ``apart``: the rest on the host's cores less the engine's;
* ``shared``: the rest on every core (like any Ray a user starts);

and, as a second knob, the niceness of Ray's workers (the engine's processes, the Serve
controller, the proxy, the replicas; Ray starts them at 15, its daemons at 0):

* ``nice0``: ``shared``, with those processes' threads at niceness 0 (what
  ``RAY_worker_niceness=0`` before ``ray.init`` gives: ``vllm serve``'s footing);
* ``apart-nice0``: ``apart`` with the same - how ``fleetserve serve`` starts a local Ray
  for CPU engines since 2026-12-02.
* ``apart-nice0-engine``: ``apart-nice0``, and the engine's threads that vLLM did not pin
  (``VLLM::EngineCore``, the worker's helper threads) kept on the engine's cores too, away
  from the serving processes - how ``fleetserve serve`` starts them since a8436e3. The
  other modes put those threads on every core, as ``vllm serve`` and the builds before
  a8436e3 leave them.
* ``apart-nice0-serving``: ``apart-nice0``, with those threads on the serving cores
  instead (the worker's cores left to its OpenMP threads alone).

Modes without ``nice0`` put those threads at 15 (Ray's default).

``--background-load N`` runs every phase with N busy processes at niceness 0, each in a
session of its own (``overhead.py``'s loaded host).

The engine's pinned threads are left alone; the cores vLLM pinned its OpenMP threads to
are the engine's cores. Each phase is vLLM's own
benchmark client (``vllm bench serve`` through its Python API, as in ``overhead.py``):
random 128-token prompts, ``--max-tokens`` output tokens, ``ignore_eos``, closed loop at
``--concurrency``, fresh prompts per phase; or, with ``--client fleetserve``,
``overhead.py``'s own client (fixed prompts per index, so prefix-cache hits and a higher
token rate). A discarded warm-up phase comes first.
Reported per phase: output tok/s and TTFT p50; then each mode's mean and the ratio
apart / shared.

    .venv/bin/python benchmarks/core_split.py --phases apart shared apart shared apart shared
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

from fleetserve.engine.config import EngineConfig
from fleetserve.serve.control.ports import free_port
from overhead import (
    Phase,
    Server,
    background_load,
    bench_fleet,
    engine_config,
    percentile,
    run_vllm_phase,
    thread_cores,
    titled_tree,
)
from overhead import run_phase as run_own_phase

MODES = ("apart", "shared", "nice0", "apart-nice0", "apart-nice0-engine", "apart-nice0-serving")
RAY_WORKER_NICENESS = 15  # Ray 2.60's default for every worker it starts


def split(
    root: int, host: set[int], loose: frozenset[int] = frozenset()
) -> tuple[set[int], set[int], list[int]]:
    """The engine's processes (vLLM titles them ``VLLM::EngineCore`` / ``VLLM::Worker``),
    the cores vLLM pinned their threads to (the ``loose`` threads, which phases move, are
    not vLLM's pinning), and every other process of the server."""
    engine: set[int] = set()
    pinned: set[int] = set()
    others: list[int] = []
    for pid, title in titled_tree(root):
        if title.startswith(b"VLLM::"):
            engine.add(pid)
            for tid, cores in thread_cores(pid).items():
                if cores < host and tid not in loose:
                    pinned.update(cores)
        else:
            others.append(pid)
    return engine, pinned, others


def ray_workers(root: int) -> list[int]:
    """Every process of the server that Ray started as a worker: Ray titles them ``ray::``
    (Serve controller, proxy, replicas, idle workers) and the engine's are vLLM's
    (``VLLM::``); the raylet, GCS and agents are Ray's daemons and not among them."""
    return [pid for pid, title in titled_tree(root) if title.startswith((b"ray::", b"VLLM::"))]


def loose_engine_threads(root: int, host: set[int]) -> list[int]:
    """The engine's threads vLLM did not pin, read once before any phase moves them: every
    thread of ``VLLM::EngineCore`` (it runs no OpenMP; the worker does) and any other engine
    thread that may run on every core. Since a8436e3 fleetserve starts them on the engine's
    cores, so ``cores == host`` alone no longer finds them."""
    return [
        tid
        for pid, title in titled_tree(root)
        if title.startswith(b"VLLM::")
        for tid, cores in thread_cores(pid).items()
        if cores == host or title.startswith(b"VLLM::EngineCore")
    ]


def place(root: int, host: set[int], mode: str, workers: list[int], loose: list[int]) -> str:
    """Put every non-engine thread on the cores ``mode`` says and Ray's workers' threads at
    its niceness; a line describing it."""
    engine, pinned, others = split(root, host, frozenset(loose))
    if not pinned:
        raise SystemExit("no engine thread is pinned to a core here: nothing to compare")
    cores = host - pinned if mode.startswith("apart") else host
    nice = 0 if "nice0" in mode else RAY_WORKER_NICENESS
    # The engine's threads vLLM did not pin: on the engine's cores in the -engine mode, on
    # the serving cores in the -serving mode, else on every core (as vLLM leaves them).
    loose_cores = (
        pinned if mode.endswith("-engine") else host - pinned if mode.endswith("-serving") else host
    )
    moved = reniced = 0
    for pid in others:
        for tid in thread_cores(pid):
            try:
                os.sched_setaffinity(tid, cores)
                moved += 1
            except OSError:
                continue
    for tid in loose:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, loose_cores)
    for pid in workers:
        for tid in thread_cores(pid):
            try:
                # PRIO_PROCESS with a thread id sets that thread only (Linux).
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                reniced += 1
            except OSError:
                continue
    return (
        f"{mode}: {moved} threads of {len(others)} processes on cores {sorted(cores)}; "
        f"engine {sorted(engine)} pinned to {sorted(pinned)}; {reniced} threads of "
        f"{len(workers)} Ray workers at niceness {nice}; {len(loose)} unpinned engine threads on "
        f"{sorted(loose_cores)}"
    )


def run_phase(
    server: Server, config: EngineConfig, args: argparse.Namespace, name: str, seed: int
) -> Phase:
    """One phase of the chosen client (overhead.py's runners, so the same arguments)."""
    if args.client == "fleetserve":
        per_client = -(-args.requests // args.concurrency)
        return asyncio.run(
            run_own_phase(server.url, config.name, args.concurrency, per_client, args.max_tokens)
        )
    result = args.out / f"{name}.json"
    return run_vllm_phase(
        server.url, config, args.concurrency, args.requests, args.max_tokens, seed, result
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", nargs="+", choices=MODES, default=["apart", "shared"] * 3)
    parser.add_argument("--client", choices=["vllm", "fleetserve"], default="vllm")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16, help="requests per phase")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--background-load", type=int, default=0, help="busy processes during every phase"
    )
    parser.add_argument("--ready-timeout-s", type=float, default=900)
    parser.add_argument("--out", type=Path, default=Path("out/core-split"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # A SIGTERM (``timeout``) unwinds like Ctrl-C, so the server below is stopped, not left
    # running with its Ray.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    config = engine_config(bench_fleet({}))
    host = os.sched_getaffinity(0)
    argv = [sys.executable, "-m", "fleetserve.cli", "serve", "--port"]
    port = free_port()
    server = Server("fleetserve", [*argv, str(port)], port, "/ready", args.out / "fleetserve.log")
    rows: list[dict[str, Any]] = []
    try:
        print(f"ready in {server.start(args.ready_timeout_s):.0f} s", flush=True)
        assert server.root is not None
        workers = ray_workers(server.root)
        loose = loose_engine_threads(server.root, host)
        run_phase(server, config, args, "warmup", 1)
        for i, mode in enumerate(args.phases):
            print(place(server.root, host, mode, workers, loose), flush=True)
            with background_load(args.background_load, max_s=1800):
                phase = run_phase(server, config, args, f"{i}-{mode}", 100 + i)
            row = {
                "phase": i,
                "mode": mode,
                "background_load": args.background_load,
                "tok_s": phase.tokens / phase.wall_s,
                "ttft_p50_s": percentile(phase.ttft_s, 50),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
    summary: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if mine:
            summary[mode] = {
                "tok_s": statistics.mean(r["tok_s"] for r in mine),
                "ttft_p50_s": statistics.mean(r["ttft_p50_s"] for r in mine),
                "phases": len(mine),
            }
    if "shared" in summary:
        for mode in MODES:
            if mode != "shared" and mode in summary:
                summary[f"{mode}_over_shared"] = {
                    k: summary[mode][k] / summary["shared"][k] for k in ("tok_s", "ttft_p50_s")
                }
    (args.out / "summary.json").write_text(
        json.dumps({"phases": rows, "summary": summary}, indent=1)
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
