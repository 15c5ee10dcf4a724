"""CPU cost of fleetserve's serving path per streamed token, fast path on vs off.

Design note. On a CPU (or small) host every CPU-second the serving layer spends is taken
from the engine, so the cost that matters is CPU time per streamed token, not latency on an
idle box. This benchmark isolates the serving layer: ``fleetserve serve --engine fake``
(no model; the fake engine streams one SSE event per token every ``--token-delay``
seconds) is started once per ``--paths`` entry, alternating over ``--rounds``: ``direct``
(the default: direct ingress + gRPC, responses over the multiplexed stream relay),
``direct-serve-relay`` (the same with ``server.stream_relay: serve``: one Serve streaming
call per request) and ``proxy`` (``server.direct_ingress: false``: Ray Serve's proxy).
Each round measures TTFT at concurrency 1 (sequential requests; the fake's first token
comes after one token delay, so TTFT - delay is the path's latency) and then a burst of
``2 x concurrency`` streams, during which the CPU time of every process under the server
(proxy, ingress, model replica, Ray's daemons) is read from /proc: reported as CPU-ms per
streamed token, by process. Before the burst the server is left idle for ``--idle-s``
seconds and the same processes' CPU is read again: the serving layer's fixed cost while
nothing is served, in % of one core, which on a small host comes out of the engine's share
whatever the load.

    .venv/bin/python benchmarks/serve_path.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleetserve.serve.control.ports import free_port
from overhead import one_request, process_tree  # same directory: run as a script

MODEL = "fake-model"

#: Serving paths: name -> (table label, the spec's server block).
PATHS = {
    "proxy": ("Serve proxy (direct_ingress: false)", {"direct_ingress": "false"}),
    "direct-serve-relay": (
        "fast path, Serve streaming calls (stream_relay: serve)",
        {"direct_ingress": "true", "stream_relay": "serve"},
    ),
    "direct": (
        "fast path (default: multiplexed relay)",
        {"direct_ingress": "true", "stream_relay": "multiplexed"},
    ),
}


@dataclass
class PathRun:
    """One measured start of the server."""

    ttft_p50_ms: float
    tokens: int
    wall_s: float
    cpu_s: dict[str, float]
    #: Idle CPU by process, in % of one core (``--idle-s`` seconds with no request).
    idle_pct: dict[str, float]


def cpu_by_process(pids: list[int]) -> dict[int, tuple[str, float]]:
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = _label(cmd.strip() or stat[stat.index("(") + 1 : stat.rindex(")")])
        out[pid] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def start_profiles(
    procs: dict[int, tuple[str, float]], out: Path, *, native: bool = False
) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    """py-spy on the ingress and the model replica for the burst (raw folded stacks;
    with ``native``, C/C++ frames too: where uvloop, gRPC and pickling spend)."""
    out.mkdir(parents=True, exist_ok=True)
    spies = []
    for pid, (name, _) in procs.items():
        if name in ("ingress", "model replica"):
            path = out / f"{name.replace(' ', '-')}-{pid}.txt"
            spy = Path(sys.executable).with_name("py-spy")  # installed beside this Python
            argv = [str(spy), "record", "-p", str(pid), "-r", "50", "-f", "raw"]
            # py-spy refuses --native with --nonblocking: native stacks need the process
            # paused while sampled (which inflates the CPU table of a profiled run).
            argv += ["-o", str(path)] + (["--native"] if native else ["--nonblocking"])
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            spies.append((name, proc, path))
    time.sleep(1)  # attached before the burst starts
    return spies


def stop_profiles(spies: list[tuple[str, subprocess.Popen[bytes], Path]]) -> None:
    """Stop py-spy (it writes on SIGINT) and print where each process's samples were."""
    for _, proc, _ in spies:
        proc.send_signal(signal.SIGINT)
    for name, proc, path in spies:
        proc.wait(60)
        if path.exists():
            print(f"  py-spy {name}: {profile_summary(path)}  ({path})")


def profile_summary(path: Path, top: int = 6) -> str:
    """Share of samples with no Python frame below the event loop's thread (time in
    uvloop/gRPC/httptools native code), and the busiest Python functions otherwise."""
    total = native = 0
    funcs: dict[str, int] = defaultdict(int)
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        frames = [f.split(" (")[0] for f in stack.split(";")]
        total += int(n)
        if frames[-1] == "Thread.run":
            native += int(n)
        for f in set(frames) - {"Thread.run", "Thread._bootstrap", "Thread._bootstrap_inner"}:
            funcs[f] += int(n)
    busiest = sorted(funcs.items(), key=lambda kv: -kv[1])[:top]
    return f"{total} samples, {100 * native / max(total, 1):.0f} % native loop; " + ", ".join(
        f"{f} {100 * v / max(total, 1):.0f} %" for f, v in busiest
    )


def _label(cmd: str) -> str:
    if cmd.startswith("ray::ServeReplica"):
        return "ingress" if cmd.rstrip().endswith(":ingress") else "model replica"
    if cmd.startswith("ray::ProxyActor"):
        return "Serve proxy"
    if cmd.startswith("ray::ServeController"):
        return "Serve controller"
    if "fleetserve.cli serve" in cmd:
        return "fleetserve (driver)"
    for needle, label in (
        ("/raylet ", "raylet"),
        ("/gcs_server ", "GCS"),
        ("ray::DashboardAgent", "dashboard agent"),
        ("ray::RuntimeEnvAgent", "runtime-env agent"),
        ("log_monitor.py", "log monitor"),
        ("autoscaler/_private/monitor.py", "autoscaler monitor"),
        ("fleetserve::engine-reaper", "engine watchdog"),
    ):
        if needle in cmd + " ":
            return label
    return "Ray daemons/other"


def cpu_by_label(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU-seconds per process label between two :func:`cpu_by_process` reads."""
    by_name: dict[str, float] = defaultdict(float)
    for pid, (name, t) in after.items():
        by_name[name] += t - before.get(pid, (name, t))[1]
    return dict(by_name)


async def measure(url: str, root: int, args: argparse.Namespace) -> PathRun:
    limits = httpx.Limits(max_connections=4 * args.concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for i in range(3):  # warm-up
            await one_request(client, url, MODEL, i, 4)
        ttfts = [
            (await one_request(client, url, MODEL, 100 + i, 2))[0] for i in range(args.sequential)
        ]
        pids = process_tree(root)
        idle = {}
        if args.idle_s > 0:
            await asyncio.sleep(5)  # let the requests' after-effects settle
            idle_before, t_idle = cpu_by_process(pids), time.perf_counter()
            await asyncio.sleep(args.idle_s)
            elapsed = time.perf_counter() - t_idle
            idle = {
                n: 100 * v / elapsed
                for n, v in cpu_by_label(idle_before, cpu_by_process(pids)).items()
            }
        before = cpu_by_process(pids)
        spies = (
            start_profiles(before, args.py_spy, native=args.py_spy_native) if args.py_spy else []
        )
        t0 = time.perf_counter()
        results = []
        for burst in range(args.bursts):
            results += await asyncio.gather(
                *(
                    one_request(client, url, MODEL, 1000 * (burst + 1) + i, args.max_tokens)
                    for i in range(2 * args.concurrency)
                )
            )
        wall = time.perf_counter() - t0
        after = cpu_by_process(pids)
        stop_profiles(spies)
    tokens = sum(r[1] for r in results)
    return PathRun(statistics.median(ttfts) * 1000, tokens, wall, cpu_by_label(before, after), idle)


def run_server(path: str, args: argparse.Namespace, tmp: Path) -> PathRun:
    spec = tmp / f"fleet-{path}.yaml"
    spec.write_text(
        f"models:\n  - name: {MODEL}\n    source: fake\n    max_model_len: 2048\n"
        # at least the autoscaler's default target (16), which the spec requires
        f"    replicas: {{max_ongoing_requests: {max(16, 4 * args.concurrency)}}}\n"
        "server:\n" + "".join(f"  {k}: {v}\n" for k, v in PATHS[path][1].items())
    )
    port = free_port()
    argv = [sys.executable, "-m", "fleetserve.cli", "serve", str(spec), "--port", str(port)]
    argv += ["--engine", "fake", "--fake-token-delay", str(args.token_delay)]
    log = (tmp / f"serve-{path}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fleetserve did not start; see {log.name}")
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        return asyncio.run(measure(url, proc.pid, args))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=30, help="requests for TTFT at c=1")
    ap.add_argument("--token-delay", type=float, default=0.05, help="fake engine s/token")
    ap.add_argument("--bursts", type=int, default=1, help="bursts of 2 x concurrency streams")
    ap.add_argument(
        "--idle-s", type=float, default=30, help="idle CPU sample before the burst (0: skip)"
    )
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=list(PATHS),
        default=list(PATHS),
        help="which serving paths to start (direct = the default fast path)",
    )
    ap.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="profile the ingress and model replica during the bursts (py-spy raw stacks)",
    )
    ap.add_argument(
        "--py-spy-native", action="store_true", help="with --py-spy: sample native frames too"
    )
    args = ap.parse_args()
    runs: dict[str, list[PathRun]] = {p: [] for p in PATHS}
    with tempfile.TemporaryDirectory(prefix="fs-serve-path-") as tmp:
        for rnd in range(args.rounds):
            order = args.paths if rnd % 2 == 0 else args.paths[::-1]
            for path in order:
                r = run_server(path, args, Path(tmp))
                runs[path].append(r)
                cpu = sum(r.cpu_s.values())
                print(
                    f"round {rnd + 1} {path:<18} ttft p50 "
                    f"{r.ttft_p50_ms:.1f} ms, {r.tokens} tokens, "
                    f"{1000 * cpu / r.tokens:.2f} CPU-ms/token, idle "
                    f"{sum(r.idle_pct.values()):.1f} % of a core",
                    flush=True,
                )
    print()
    names = sorted({n for rs in runs.values() for r in rs for n in r.cpu_s})
    # Marginal: the burst's CPU less what the same processes burn idle over the burst's
    # wall time - the relay's cost per token, apart from the fixed background.
    print(
        "| path | TTFT p50 − delay (ms) | CPU-ms / token | marginal CPU-ms / token | "
        + " | ".join(names)
        + " |"
    )
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for path, (label, _) in PATHS.items():
        rs = runs[path]
        if not rs:
            continue
        tokens = sum(r.tokens for r in rs)
        per = {n: 1000 * sum(r.cpu_s.get(n, 0.0) for r in rs) / tokens for n in names}
        ttft = statistics.median(r.ttft_p50_ms for r in rs) - 1000 * args.token_delay
        idle_cpu_s = sum(sum(r.idle_pct.values()) / 100 * r.wall_s for r in rs)
        marginal = (
            f"{1000 * (sum(sum(r.cpu_s.values()) for r in rs) - idle_cpu_s) / tokens:.2f}"
            if args.idle_s > 0
            else "-"
        )
        print(
            f"| {label} | {ttft:.1f} | {sum(per.values()):.2f} | {marginal} | "
            + " | ".join(f"{per[n]:.2f}" for n in names)
            + " |"
        )
    if args.idle_s > 0:
        idle_names = sorted({n for rs in runs.values() for r in rs for n in r.idle_pct})
        print()
        print("Idle CPU, % of one core (mean over starts):")
        print("| path | total | " + " | ".join(idle_names) + " |")
        print("|---|---:|" + "---:|" * len(idle_names))
        for path, (label, _) in PATHS.items():
            rs = runs[path]
            if not rs:
                continue
            per = {n: statistics.mean(r.idle_pct.get(n, 0.0) for r in rs) for n in idle_names}
            print(
                f"| {label} | {sum(per.values()):.1f} | "
                + " | ".join(f"{per[n]:.1f}" for n in idle_names)
                + " |"
            )


if __name__ == "__main__":
    main()
