"""Tenants that cannot hurt each other: a flooding tenant vs a well-behaved one, and recovery.

Design note. One ``fleetserve serve`` (fake engine by default: no model, one SSE event per
token every ``--token-delay`` s, so what is measured is the serving layer - quotas, fair
admission, Serve - not engine batching) with one model and two tenants:

* phase ``b-alone``: tenant B streams ``--b-rate`` requests/s for ``--alone-s`` seconds -
  its TTFT p50 is the baseline;
* phase ``flood``: for ``--flood-s`` (60) seconds tenant A sends 10x its token quota
  (open loop, ``--a-tpm`` tokens/min) while B keeps its rate. Reported: B's TTFT p50
  against the baseline (goal <= 1.2x), and the tokens A was served (sum of the usage of
  A's successful responses) against A's limit + one request's ``max_tokens`` (the
  criterion; LiteLLM let 663 tokens through a 100-TPM limit);
* phase ``kill``: B sends a request every ``--probe-interval`` s; the model's replica
  process is SIGKILLed; reported: seconds from the kill to the first success, and every
  error seen meanwhile by kind.

A's quota window is the sliding minute, so the flood phase lasts exactly one window.
``--engine vllm`` serves the default model (Gemma 3 270M) on the real engine instead:
there A's admitted requests really share the engine with B's, and the replica kill
includes the engine's restart.

    .venv/bin/python benchmarks/guard.py --out /tmp/guard.json
    .venv/bin/python benchmarks/guard.py --engine vllm --a-tpm 600 --b-rate 0.5 \
        --probe-interval 0.5 --b-tpm 200000 --out /tmp/guard-vllm.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fleetserve.serve.control.ports import free_port
from fleetserve.spec import DEFAULT_MODEL_SOURCE
from overhead import Server, percentile  # same directory: run as a script

MODEL = "m"
KEY_A, KEY_B = "sk-bench-flood", "sk-bench-calm"
PROMPT = "tell me a short story about a lighthouse keeper and the sea"


@dataclass
class Shot:
    """One request: when it was sent, how it ended, its TTFT and usage."""

    tenant: str
    sent: float
    status: int | None = None
    kind: str = ""  # "" ok, else the error kind
    ttft: float | None = None
    tokens: int = 0


@dataclass
class Results:
    config: dict[str, Any] = field(default_factory=dict)
    b_alone_ttft_p50_ms: float = 0.0
    b_flood_ttft_p50_ms: float = 0.0
    b_ttft_ratio: float = 0.0
    b_errors_in_flood: int = 0
    a_sent: int = 0
    a_admitted: int = 0
    a_refused_429: int = 0
    a_tokens_served: int = 0
    a_limit: int = 0
    a_bound: int = 0
    recovery_s: float | None = None
    errors_during_recovery: dict[str, int] = field(default_factory=dict)


async def shoot(client: httpx.AsyncClient, tenant: str, key: str, max_tokens: int) -> Shot:
    shot = Shot(tenant, time.monotonic())
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            shot.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                shot.kind = f"http_{r.status_code}"
                return shot
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    shot.kind = f"stream_error_{chunk['error'].get('code')}"
                    return shot
                if shot.ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                    shot.ttft = time.monotonic() - shot.sent
                if chunk.get("usage"):
                    shot.tokens = int(chunk["usage"]["total_tokens"])
    except httpx.HTTPError as e:
        shot.kind = type(e).__name__
    return shot


async def open_loop(
    client: httpx.AsyncClient, tenant: str, key: str, rate: float, seconds: float, max_tokens: int
) -> list[Shot]:
    """Send ``rate`` requests/s for ``seconds`` (fixed spacing), wait for all of them."""
    tasks: list[asyncio.Task[Shot]] = []
    t0 = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(shoot(client, tenant, key, max_tokens)))
    return list(await asyncio.gather(*tasks))


def p50_ms(shots: list[Shot]) -> float:
    return percentile([s.ttft for s in shots if s.ttft is not None], 50) * 1000


def replica_pids(session: int, name: str) -> list[int]:
    """Processes of the server's session whose command line names a Serve replica."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session:
                continue
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"ServeReplica:fleetserve:{name}".encode() in cmd:
            out.append(int(entry.name))
    return out


async def recovery(
    client: httpx.AsyncClient, session: int, interval: float, max_tokens: int, timeout_s: float
) -> tuple[float | None, dict[str, int]]:
    """Kill the model replica while probing; seconds to the first success after the kill."""
    pending: list[asyncio.Task[Shot]] = []
    for _ in range(10):  # a few successes first
        pending.append(asyncio.create_task(shoot(client, "b", KEY_B, max_tokens)))
        await asyncio.sleep(interval)
    pids = replica_pids(session, "model-" + MODEL)
    if not pids:
        raise RuntimeError("no model replica process found")
    killed = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    recovered: float | None = None
    while time.monotonic() - killed < timeout_s:
        pending.append(asyncio.create_task(shoot(client, "b", KEY_B, max_tokens)))
        await asyncio.sleep(interval)
        done = [t.result() for t in pending if t.done()]
        ok = [s for s in done if s.kind == "" and s.sent > killed]
        if ok:
            recovered = min(s.sent + (s.ttft or 0.0) for s in ok) - killed
            break
    shots = list(await asyncio.gather(*pending))
    errors = Counter(s.kind for s in shots if s.kind and s.sent + 0.001 >= killed - 10 * interval)
    return recovered, dict(errors)


async def run(url: str, session: int, args: argparse.Namespace, res: Results) -> None:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await open_loop(client, "b", KEY_B, args.b_rate, 3, args.max_tokens)  # warm-up
        alone = await open_loop(client, "b", KEY_B, args.b_rate, args.alone_s, args.max_tokens)
        res.b_alone_ttft_p50_ms = p50_ms(alone)
        # A floods at 10x its quota, in requests/s of its real per-request usage.
        per_request = max(s.tokens for s in alone if s.tokens) or args.max_tokens
        a_rate = 10 * args.a_tpm / per_request / 60
        print(f"flood: A at {a_rate:.1f} req/s (10x {args.a_tpm} TPM), B at {args.b_rate}/s")
        flood_a, flood_b = await asyncio.gather(
            open_loop(client, "a", KEY_A, a_rate, args.flood_s, args.max_tokens),
            open_loop(client, "b", KEY_B, args.b_rate, args.flood_s, args.max_tokens),
        )
        res.b_flood_ttft_p50_ms = p50_ms(flood_b)
        res.b_ttft_ratio = res.b_flood_ttft_p50_ms / res.b_alone_ttft_p50_ms
        res.b_errors_in_flood = sum(1 for s in flood_b if s.kind)
        res.a_sent = len(flood_a)
        res.a_admitted = sum(1 for s in flood_a if s.kind == "")
        res.a_refused_429 = sum(1 for s in flood_a if s.status == 429)
        res.a_tokens_served = sum(s.tokens for s in flood_a if s.kind == "")
        res.a_limit = args.a_tpm
        res.a_bound = args.a_tpm + args.max_tokens
        res.recovery_s, res.errors_during_recovery = await recovery(
            client, session, args.probe_interval, args.max_tokens, args.kill_timeout
        )


def write_spec(path: Path, args: argparse.Namespace) -> None:
    # The fake engine takes half a CPU; vLLM gets what fleetserve plans for this host.
    source = "fake\n    resources: {cpu: 0.5}" if args.engine == "fake" else DEFAULT_MODEL_SOURCE
    path.write_text(
        f"""models:
  - name: {MODEL}
    source: {source}
    max_model_len: 1024
    replicas: {{max_ongoing_requests: {args.capacity}, max_queued_requests: 256,
                target_ongoing_requests: {max(1, args.capacity // 2)}}}
tenants:
  - name: flood
    api_keys: ["${{BENCH_KEY_A}}"]
    quota: {{tokens_per_minute: {args.a_tpm}}}
  - name: calm
    api_keys: ["${{BENCH_KEY_B}}"]
    quota: {{tokens_per_minute: {args.b_tpm}}}
"""
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--engine", choices=["fake", "vllm"], default="fake")
    ap.add_argument("--token-delay", type=float, default=0.02, help="fake engine s/token")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--capacity", type=int, default=8, help="max_ongoing_requests")
    ap.add_argument("--a-tpm", type=int, default=3000, help="tenant A's tokens per minute")
    ap.add_argument("--b-tpm", type=int, default=20000, help="tenant B's tokens per minute")
    ap.add_argument("--b-rate", type=float, default=2.0, help="B's requests per second")
    ap.add_argument("--alone-s", type=float, default=30.0)
    ap.add_argument("--flood-s", type=float, default=60.0)
    ap.add_argument("--probe-interval", type=float, default=0.1)
    ap.add_argument("--kill-timeout", type=float, default=180.0)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetserve-guard-"))
    spec = tmp / "fleet.yaml"
    write_spec(spec, args)
    port = free_port()
    argv = [sys.executable, "-m", "fleetserve.cli", "serve", str(spec), "--port", str(port)]
    argv += ["--engine", args.engine]
    if args.engine == "fake":
        argv += ["--fake-token-delay", str(args.token_delay)]
    server = Server(
        "fleetserve",
        argv,
        port,
        "/ready",
        tmp / "serve.log",
        env={"BENCH_KEY_A": KEY_A, "BENCH_KEY_B": KEY_B},
    )
    res = Results(config={k: str(v) for k, v in vars(args).items()})
    try:
        started = server.start(900)
        print(f"fleetserve up in {started:.0f} s (log {server.log})")
        assert server.proc is not None
        asyncio.run(run(server.url, server.proc.pid, args, res))
    finally:
        server.stop()
    text = json.dumps(asdict(res), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    ok_ttft = res.b_ttft_ratio <= 1.2
    ok_tokens = res.a_tokens_served <= res.a_bound
    print(
        f"B TTFT p50 {res.b_alone_ttft_p50_ms:.1f} ms alone, {res.b_flood_ttft_p50_ms:.1f} ms "
        f"under A's flood: x{res.b_ttft_ratio:.2f} ({'ok' if ok_ttft else 'MISSED'} <= 1.2)"
    )
    print(
        f"A served {res.a_tokens_served} tokens in {args.flood_s:.0f} s (limit {res.a_limit}, "
        f"bound {res.a_bound}: {'ok' if ok_tokens else 'MISSED'}); {res.a_admitted}/"
        f"{res.a_sent} admitted, {res.a_refused_429} got 429"
    )
    # recovery_s is None when no request succeeded within --kill-timeout.
    recovered = (
        f"first success after {res.recovery_s:.1f} s"
        if res.recovery_s is not None
        else f"no success within {args.kill_timeout:.0f} s (MISSED)"
    )
    print(f"replica kill: {recovered}; errors {res.errors_during_recovery}")


if __name__ == "__main__":
    main()
