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

    .venv/bin/python benchmarks/overhead.py --rounds 2 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fleetserve.engine.config import EngineConfig
from fleetserve.modelstore.store import ModelStore
from fleetserve.serve.settings import engine_settings
from fleetserve.spec import default_fleet

PROMPT = (
    "You are a helpful assistant. Write a detailed, well structured essay about the history "
    "of the printing press, its inventors, how it changed science, religion and politics in "
    "Europe, and what it teaches us about new information technologies today."
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        if self.external:
            return 0.0
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
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


def engine_config() -> EngineConfig:
    spec = default_fleet()
    model = spec.models[0]
    settings = engine_settings(spec)[model.name]
    path = ModelStore().resolve(model.source)
    return EngineConfig.from_spec(model, model_path=path, settings=settings)


def make_servers(
    config: EngineConfig, targets: list[str], logs: Path, vllm_nice: int = 0
) -> list[Server]:
    servers = []
    for target in targets:
        port = free_port()
        if target == "vllm":
            # Ray starts its workers - engines included - at niceness 15 (RAY_worker_niceness);
            # --vllm-nice 15 puts `vllm serve` on the same footing against the load client.
            argv = [
                *(["nice", "-n", str(vllm_nice)] if vllm_nice else []),
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                *config.vllm_cli_args(),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--disable-uvicorn-access-log",
            ]
            servers.append(Server("vllm serve", argv, port, "/v1/models", logs / "vllm.log"))
        elif target == "fleetserve":
            argv = [sys.executable, "-m", "fleetserve.cli", "serve", "--port", str(port)]
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
        accelerator_config={"kind": "cpu"},
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
    serve.shutdown()
    ray.shutdown()


# --------------------------------------------------------------------------- load


@dataclass
class Phase:
    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    errors: int = 0


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


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--targets", nargs="+", default=["vllm", "fleetserve", "rayllm"])
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
    ap.add_argument("--start-timeout", type=float, default=1800)
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
    ap.add_argument("--serve-rayllm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--engine-config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_rayllm:
        serve_rayllm(args.port, args.engine_config)
        return

    args.out.mkdir(parents=True, exist_ok=True)
    config = engine_config()
    print(f"engine options (all servers): {' '.join(config.vllm_cli_args())}")
    servers = make_servers(config, args.targets, args.out, args.vllm_nice)
    given = dict(u.split("=", 1) for u in args.url)
    for server in servers:
        target = {"vllm serve": "vllm", "fleetserve": "fleetserve"}.get(server.name, "rayllm")
        if target in given:
            server.port = int(given[target].rsplit(":", 1)[1].strip("/"))
            server.external = True
    results: dict[str, dict[int, Phase]] = {s.name: {} for s in servers}
    try:
        for server in servers:
            print(f"starting {server.name} ...", flush=True)
            took = server.start(args.start_timeout)
            print(f"  {server.name} ready in {took:.0f} s", flush=True)
            # Warm-up, discarded: one phase per concurrency, so the batch shapes each
            # server meets first (vLLM CPU compiles some on first sight) are not timed.
            for c in args.concurrency:
                asyncio.run(run_phase(server.url, config.name, c, 1, args.max_tokens))
        for rnd in range(args.rounds):
            order = servers[rnd % len(servers) :] + servers[: rnd % len(servers)]
            for c in args.concurrency:
                for server in order:
                    p = asyncio.run(
                        run_phase(
                            server.url,
                            config.name,
                            c,
                            args.requests_per_client,
                            args.max_tokens,
                            args.min_requests,
                        )
                    )
                    agg = results[server.name].setdefault(c, Phase())
                    agg.tokens += p.tokens
                    agg.wall_s += p.wall_s
                    agg.ttft_s += p.ttft_s
                    agg.errors += p.errors
                    print(
                        f"round {rnd + 1} c={c:<3} {server.name:<14} "
                        f"{p.tokens / p.wall_s:8.1f} tok/s  ttft p50 "
                        f"{percentile(p.ttft_s, 50) * 1000:7.0f} ms  errors {p.errors}",
                        flush=True,
                    )
    finally:
        for server in servers:
            server.stop()

    base = "vllm serve"
    rows = []
    for name, by_c in results.items():
        for c, p in sorted(by_c.items()):
            tps = p.tokens / p.wall_s if p.wall_s else float("nan")
            row = {
                "server": name,
                "concurrency": c,
                "tok_s": tps,
                "ttft_p50_ms": percentile(p.ttft_s, 50) * 1000,
                "ttft_p99_ms": percentile(p.ttft_s, 99) * 1000,
                "requests": len(p.ttft_s),
                "errors": p.errors,
            }
            rows.append(row)
    by_key = {(r["server"], r["concurrency"]): r for r in rows}
    for r in rows:
        b = by_key.get((base, r["concurrency"]))
        if b:
            r["tok_s_ratio"] = r["tok_s"] / b["tok_s"]
            r["ttft_p50_ratio"] = r["ttft_p50_ms"] / b["ttft_p50_ms"]
            r["ttft_p99_ratio"] = r["ttft_p99_ms"] / b["ttft_p99_ms"]
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    print()
    print(
        "| server | conc. | output tok/s | × vllm | TTFT p50 ms | × vllm "
        "| TTFT p99 ms | × vllm | req | err |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["server"])):
        print(
            f"| {r['server']} | {r['concurrency']} | {r['tok_s']:.1f} "
            f"| {r.get('tok_s_ratio', float('nan')):.3f} "
            f"| {r['ttft_p50_ms']:.0f} | {r.get('ttft_p50_ratio', float('nan')):.3f} "
            f"| {r['ttft_p99_ms']:.0f} | {r.get('ttft_p99_ratio', float('nan')):.3f} "
            f"| {r['requests']} | {r['errors']} |"
        )


if __name__ == "__main__":
    main()
