"""Routing benchmark: fleetserve's prefix router vs Ray Serve's default (power of two
choices) vs Ray Serve LLM's PrefixCacheAffinityRouter, two replicas of the default model.

Design note. Each arm is the same Serve application (``fleetserve.serve.control.app:build_app``
from a Serve config, as a RayService runs it) whose model deployment differs only in
``request_router_config``: fleetserve's ``FleetRouter`` (policy prefix), Serve's
``PowerOfTwoChoicesRequestRouter``, or Ray Serve LLM's router (``benchmarks/
rayllm_router.py`` adapts its text extraction to fleetserve's raw request bodies). Arms run
one after another in one invocation (a Ray Serve router cannot be swapped under running
replicas, and six CPU engines at once do not fit beside other work on this host), each
with a fresh ``serve run`` and the same seeded workloads:

* ``shared``: ``--groups`` long system prompts (built like ``fleetserve bench``'s
  shared-prefix workload), ``--users`` users each holding a ``--turns``-turn conversation
  on one of them (the assistant's streamed replies become history), all users at once;
* ``unique``: the same number of single-turn requests with no shared prefix at all.

Measured per arm and workload: TTFT p50/p99 (first streamed content), request throughput,
output tokens/s, and vLLM's prefix-cache hit rate (hit / queried prompt tokens, summed over
both replicas' scheduler stats, read from the replicas over Ray). Start-up (``serve run``
to both replicas ready) is reported too.

    flock /tmp/fleetserve-heavy.lock .venv/bin/python benchmarks/routing.py \\
        --arms fleetserve pow2 rayllm --json /tmp/routing.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from fleetserve.bench.workload.text import PromptText
from fleetserve.plan.deployment import ROUTER_CLASS, request_router_options
from fleetserve.spec import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE, ModelSpec

ROUTERS = {
    "fleetserve": ROUTER_CLASS,
    "pow2": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    "rayllm": "rayllm_router:RayLLMPrefixRouter",
}
#: One deployment serving every arm (``--interleave``): the arm is read from each request.
ARM_ROUTER = "rayllm_router:ArmRouter"
DEPLOYMENT = "model-" + DEFAULT_MODEL_NAME
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_config(arm: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    engine_args: dict[str, Any] = {"kv_cache_memory_bytes": args.kv_cache_mib * 2**20}
    if args.eager:
        engine_args["enforce_eager"] = True
    model: dict[str, Any] = {
        "name": DEFAULT_MODEL_NAME,
        "source": DEFAULT_MODEL_SOURCE,
        "max_model_len": args.max_model_len,
        "concurrency": 4,
        "max_num_seqs": 16,
        "resources": {"cpu": 0.5},
        "replicas": {"min": 2, "max": 2, "max_ongoing_requests": 16},
        "engine_args": engine_args,
    }
    if args.max_num_batched_tokens is not None:
        model["max_num_batched_tokens"] = args.max_num_batched_tokens
    router: dict[str, Any] = {}  # fleetserve: the app's own options (FleetRouter, spec knobs)
    if arm == "interleaved":
        # FleetRouter's knobs exactly as the app passes them; only the class differs.
        own = request_router_options(ModelSpec.model_validate(model))["request_router_config"]
        router = {**own, "request_router_class": ARM_ROUTER}
    elif arm != "fleetserve":
        router = {"request_router_class": ROUTERS[arm]}
    app: dict[str, Any] = {
        "name": "fleetserve",
        "route_prefix": "/",
        "import_path": "fleetserve.serve.control.app:build_app",
        "args": {"spec": {"models": [model]}, "engine": args.engine},
    }
    if router:
        app["deployments"] = [{"name": DEPLOYMENT, "request_router_config": router}]
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [app],
    }


# --------------------------------------------------------------------------- workloads


@dataclass
class Sample:
    ttft_s: float
    e2e_s: float
    tokens: int
    ok: bool
    turn: int = 0


@dataclass
class Phase:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    hits: float = 0.0
    queries: float = 0.0

    def extend(self, other: Phase) -> None:
        self.samples += other.samples
        self.wall_s += other.wall_s
        self.hits += other.hits
        self.queries += other.queries

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.samples if s.ok]
        ttft = sorted(s.ttft_s for s in ok)

        def pct(p: float) -> float:
            return ttft[min(len(ttft) - 1, int(p * len(ttft)))] if ttft else float("nan")

        later = [s.ttft_s for s in ok if s.turn > 0]
        first = [s.ttft_s for s in ok if s.turn == 0]
        return {
            "requests": len(self.samples),
            "failed": len(self.samples) - len(ok),
            "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
            # In a closed-loop multi-turn phase the p50 falls among the later turns and the
            # long first-turn prefills only show in the tail; the mean weighs both.
            "ttft_mean_s": round(statistics.fmean(ttft), 3) if ttft else None,
            "ttft_p99_s": round(pct(0.99), 3),
            "ttft_p50_first_turns_s": round(statistics.median(first), 3) if first else None,
            "ttft_p50_later_turns_s": round(statistics.median(later), 3) if later else None,
            "req_per_s": round(len(ok) / self.wall_s, 3) if self.wall_s else None,
            "out_tok_per_s": round(sum(s.tokens for s in ok) / self.wall_s, 2)
            if self.wall_s
            else None,
            "prefix_hit_rate": round(self.hits / self.queries, 3) if self.queries else None,
        }


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    tag: str,
) -> tuple[Sample, str]:
    body = {
        "model": DEFAULT_MODEL_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "user": tag,  # the arm (ArmRouter) and who/which turn (the routing log)
    }
    start = time.perf_counter()
    ttft = None
    text: list[str] = []
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return Sample(0, 0, 0, False), ""
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        text.append(piece)
    except httpx.HTTPError:
        return Sample(0, 0, 0, False), ""
    e2e = time.perf_counter() - start
    return Sample(ttft if ttft is not None else e2e, e2e, max_tokens, ttft is not None), "".join(
        text
    )


def shared_conversations(args: argparse.Namespace, seed: int) -> list[list[str]]:
    """Per user: its system prompt, then one user message per turn."""
    rng = np.random.default_rng(seed)
    text = PromptText(None)
    systems = [text.build(args.prefix_tokens, rng)[0] for _ in range(args.groups)]
    out = []
    for user in range(args.users):
        turns = [text.build(args.turn_tokens, rng)[0] for _ in range(args.turns)]
        out.append([systems[user % args.groups], *turns])
    return out


async def run_shared(url: str, args: argparse.Namespace, seed: int, arm: str) -> Phase:
    phase = Phase()
    convs = shared_conversations(args, seed)
    async with httpx.AsyncClient(timeout=600) as client:

        async def user(u: int, conv: list[str]) -> None:
            messages: list[dict[str, str]] = []
            for i, turn in enumerate(conv[1:]):
                content = f"{conv[0]}\n\n{turn}" if i == 0 else turn
                messages.append({"role": "user", "content": content})
                tag = f"arm={arm};seed={seed};u={u};t={i}"
                sample, reply = await stream_chat(client, url, messages, args.max_tokens, tag)
                sample.turn = i
                phase.samples.append(sample)
                messages.append({"role": "assistant", "content": reply or "ok"})

        start = time.perf_counter()
        await asyncio.gather(*(user(u, c) for u, c in enumerate(convs)))
        phase.wall_s = time.perf_counter() - start
    return phase


async def run_unique(url: str, args: argparse.Namespace, seed: int, arm: str) -> Phase:
    phase = Phase()
    rng = np.random.default_rng(seed + 1)
    text = PromptText(None)
    n = args.users * args.turns
    tokens = args.prefix_tokens // 2 + args.turn_tokens
    prompts = [text.build(tokens, rng)[0] for _ in range(n)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    async with httpx.AsyncClient(timeout=600) as client:

        async def worker() -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                msgs = [{"role": "user", "content": prompt}]
                tag = f"arm={arm};seed={seed};unique"
                sample, _ = await stream_chat(client, url, msgs, args.max_tokens, tag)
                phase.samples.append(sample)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.users)))
        phase.wall_s = time.perf_counter() - start
    return phase


# --------------------------------------------------------------------------- replicas


def prefix_counters() -> tuple[float, float]:
    """vLLM prefix-cache hit and query tokens, summed over the model's live replicas."""
    import ray  # noqa: PLC0415

    hits = queries = 0.0
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == "serve" and f"#{DEPLOYMENT}#" in actor["name"]:
            ref: Any = ray.get_actor(actor["name"], namespace="serve").record_routing_stats.remote()
            stats: dict[str, Any] = ray.get(ref, timeout=60)
            hits += float(stats.get("prefix_cache_hits", 0.0))
            queries += float(stats.get("prefix_cache_queries", 0.0))
    return hits, queries


async def measured(run: Any, url: str, args: argparse.Namespace, seed: int, arm: str) -> Phase:
    h0, q0 = prefix_counters()
    phase: Phase = await run(url, args, seed, arm)
    await asyncio.sleep(2)  # vLLM's stat loggers record after the last step
    h1, q1 = prefix_counters()
    phase.hits, phase.queries = h1 - h0, q1 - q0
    return phase


@contextlib.contextmanager
def served(arm: str, args: argparse.Namespace, address: str) -> Iterator[str]:
    """``serve run`` of the arm's Serve config on the benchmark's own Ray cluster; its URL."""
    port = free_port()
    config = args.workdir / f"serve-{arm}.yaml"
    config.write_text(yaml.safe_dump(serve_config(arm, port, args)))
    log = (args.workdir / f"serve-{arm}.log").open("wb")
    # The cluster was started by this process with token auth: a joining driver opts in.
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    serve_cli = str(Path(sys.executable).parent / "serve")
    start = time.monotonic()
    proc = subprocess.Popen(
        [serve_cli, "run", "--address", address, str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve run exited {proc.returncode}; see {log.name}")
            if time.monotonic() - start > args.start_timeout:
                raise RuntimeError(f"not ready after {args.start_timeout} s; see {log.name}")
            # /ready answers once one replica runs (a load balancer's readiness); an arm is
            # measured with both (on the GPU host the second replica once joined mid-run)
            if _ready(url) and _all_running("fleetserve"):
                break
            time.sleep(2)
        print(f"[{arm}] ready in {time.monotonic() - start:.1f} s", file=sys.stderr)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # serve run deletes its application
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _all_running(app: str) -> bool:
    """Every deployment of Serve application ``app`` at its target replica count."""
    from ray import serve  # noqa: PLC0415
    from ray.serve.schema import ApplicationStatus  # noqa: PLC0415

    status = serve.status().applications.get(app)
    return status is not None and status.status == ApplicationStatus.RUNNING


WORKLOADS = {"shared": run_shared, "unique": run_unique}


def run_arm(arm: str, args: argparse.Namespace, address: str) -> dict[str, Any]:
    """One arm on its own ``serve run`` (its router class in the Serve config)."""
    result: dict[str, Any] = {"arm": arm}
    with served(arm, args, address) as url:
        for workload in args.workloads:
            run = WORKLOADS[workload]
            # Warm-up on other prompts (engine graphs, router state), then the measurement.
            asyncio.run(run(url, argparse.Namespace(**{**vars(args), "users": 2}), 999, arm))
            phase = asyncio.run(measured(run, url, args, args.seed, arm))
            result[workload] = phase.summary()
            print(f"[{arm}] {workload}: {result[workload]}", file=sys.stderr)
    return result


def run_interleaved(args: argparse.Namespace, address: str) -> list[dict[str, Any]]:
    """Every arm on one ``serve run`` (``ArmRouter``), phases alternating arm by arm.

    Round ``r`` runs each arm once, in an order rotated by ``r`` so no arm always follows
    the same one; every phase has its own seed (fresh prompts: nothing an earlier phase
    cached is reused), so arms differ only in routing and share the host's noise.
    """

    def arms_of(workload: str) -> list[str]:
        return list(args.unique_arms or args.arms) if workload == "unique" else list(args.arms)

    phases = {(arm, w): Phase() for w in args.workloads for arm in arms_of(w)}
    rounds: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in phases}
    with served("interleaved", args, address) as url:
        for workload in args.workloads:
            run = WORKLOADS[workload]
            arms = arms_of(workload)
            # Warm-up (engine graphs, first-request costs) once: the engines are shared.
            asyncio.run(run(url, argparse.Namespace(**{**vars(args), "users": 2}), 999, arms[0]))
            for r in range(args.interleave):
                for k in range(len(arms)):
                    i = (r + k) % len(arms)
                    arm = arms[i]
                    seed = args.seed + 1000 * r + 10 * i
                    phase = asyncio.run(measured(run, url, args, seed, arm))
                    phases[arm, workload].extend(phase)
                    rounds[arm, workload].append(phase.summary())
                    print(f"[{arm}] {workload} round {r}: {phase.summary()}", file=sys.stderr)
    results = []
    for arm in dict.fromkeys(arm for arm, _ in phases):
        result: dict[str, Any] = {"arm": arm}
        for workload in args.workloads:
            if (arm, workload) in phases:
                result[workload] = phases[arm, workload].summary()
                result[workload + "_rounds"] = rounds[arm, workload]
        results.append(result)
    return results


def routing_log_summary(path: Path) -> dict[str, dict[str, int]]:
    """Per arm, from ArmRouter's log: later turns routed to another replica than their
    conversation's previous turn (``moved``), of all later turns (``later_turns``), and
    first turns per replica (``first:<replica>``).

    Judged by where the previous turn went, not by fleetserve's index: the router counts
    its own choice as cached there at once, so the index cannot tell a move afterwards.
    """
    out: dict[str, dict[str, int]] = {}
    last: dict[tuple[str, str, str], str] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        tag = dict(p.split("=", 1) for p in record["tag"].split(";") if "=" in p)
        if "u" not in tag:
            continue  # the unique workload has no conversations
        arm = out.setdefault(record["arm"], {"later_turns": 0, "moved": 0})
        conversation = (record["arm"], tag.get("seed", ""), tag["u"])
        if int(tag.get("t", "0")) == 0:
            first = "first:" + record["replica"]
            arm[first] = arm.get(first, 0) + 1
        else:
            arm["later_turns"] += 1
            if last.get(conversation) not in (None, record["replica"]):
                arm["moved"] += 1
        last[conversation] = record["replica"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arms",
        nargs="+",
        choices=[*ROUTERS, "fleetserve-bound"],
        default=list(ROUTERS),
        help="fleetserve-bound (fleetserve with the old hard load bound): --interleave only",
    )
    p.add_argument(
        "--unique-arms",
        nargs="+",
        choices=[*ROUTERS, "fleetserve-bound"],
        help="--interleave: arms of the unique workload (default: --arms)",
    )
    p.add_argument(
        "--workloads", nargs="+", choices=["shared", "unique"], default=["shared", "unique"]
    )
    p.add_argument("--engine", choices=["vllm", "fake"], default="vllm")
    p.add_argument("--groups", type=int, default=4, help="shared system prompts")
    p.add_argument("--users", type=int, default=8, help="concurrent conversations")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--turn-tokens", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-mib", type=int, default=256)
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="vLLM's token budget per scheduler step (default: fleetserve's, 2048 on CPUs); "
        "a smaller one shortens the CPU engine's prefill steps, so fewer requests share one",
    )
    p.add_argument("--eager", action="store_true", help="vLLM --enforce-eager (no compile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="run every arm on one deployment (ArmRouter), ROUNDS phases each, alternating",
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/fleetserve-routing-bench"))
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    # `timeout` and job control send SIGTERM: unwind like ^C so serve run and Ray are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.interleave and "fleetserve-bound" in args.arms:
        p.error("fleetserve-bound is an arm of --interleave (ArmRouter) only")
    args.workdir.mkdir(parents=True, exist_ok=True)
    import ray  # noqa: PLC0415 - Ray is slow to import

    # This process starts (and owns) the cluster every arm's ``serve run`` joins, by its
    # exact address - never address="auto", which picks any cluster on the host. Serve's
    # processes inherit this environment (the benchmark's routers are on PYTHONPATH).
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    ray.init(log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    try:
        if args.interleave:
            results = run_interleaved(args, address)
        else:
            results = [run_arm(arm, args, address) for arm in args.arms]
    finally:
        ray.shutdown()
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    out["results"] = results
    log = os.environ.get("FLEETSERVE_ROUTING_LOG")
    if log and Path(log).exists():
        out["routing_log"] = routing_log_summary(Path(log))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
