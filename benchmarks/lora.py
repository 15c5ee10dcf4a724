"""Many LoRA adapters on one replica vs the base model alone, same load (issue #14).

Design note. Two ``fleetserve serve`` processes on the default model, started one after
the other (engine compilation would otherwise fight for the CPUs): ``base`` without LoRA,
and ``lora`` with ``max_loras`` = the largest N, ``max_cpu_loras`` = N + 1,
``max_lora_rank`` 8 and ``lora_target_modules`` q/v (what the adapters need), and N adapters
made here with ``peft`` (rank 8 on q/v, fixed seeds, no download). Each phase sends the same
load - ``concurrency`` closed-loop clients x ``requests`` streaming completions with
``ignore_eos`` and fixed ``max_tokens`` - to the base server's model, then to the LoRA
server with requests spread round-robin over its first N adapters (N in ``--adapters``).
Reported per phase: output tok/s (from ``usage``) and TTFT p50, as ratios to the base
server's phase. Cold adapter: after the phases, a new adapter directory is copied into
``adapter_dir`` and its first request (vLLM resolves and loads it) is timed against the
next, warm, request of the same adapter.

``--vllm VARIANT...`` adds plain ``vllm serve`` arms started with the flags fleetserve
derives for the LoRA model (``same``) or one of them changed (``all-modules``: no
``--lora-target-modules``, vLLM's default; ``slots1``; ``rank16``), each measured base ->
N adapters -> base again on its own engine: the within-engine ratio tells what LoRA costs
with those flags, independent of fleetserve.

    .venv/bin/python benchmarks/lora.py --adapters 1 4 16 --concurrency 8 --requests 4
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetserve.engine.compile_cache import compile_env
from fleetserve.modelstore.store import ModelStore
from fleetserve.serve.control.ports import free_port
from fleetserve.spec import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE
from overhead import Server  # same directory: run as a script

START_TIMEOUT_S = 1800.0


def make_adapter(base_path: str, out: Path, seed: int) -> None:
    """A rank-8 LoRA on q/v with random non-zero A and B (peft, fixed seed)."""
    import torch  # noqa: PLC0415 - heavy
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out))


def fleetserve_server(spec: dict[str, Any], work: Path, name: str) -> Server:
    """``fleetserve serve SPEC`` in its own process group, launched."""
    spec_file = work / f"{name}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    port = free_port()
    argv = [sys.executable, "-m", "fleetserve.cli", "serve", str(spec_file), "--port", str(port)]
    server = Server(name, argv, port, "/ready", work / f"{name}.log")
    server.launch()
    return server


def vllm_server(spec_model: dict[str, Any], work: Path, name: str) -> Server:
    """Plain ``vllm serve`` with the engine options fleetserve derives for ``spec_model``."""
    port = free_port()
    argv = vllm_argv(spec_model, port)
    server = Server(name, argv, port, "/v1/models", work / f"{name}.log", compile_env())
    server.launch()
    return server


async def one(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int
) -> tuple[float, int]:
    """(TTFT s, output tokens) of one streaming completion."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, out = -1.0, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft < 0 and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                out = int(chunk["usage"]["completion_tokens"])
    return ttft, out


async def phase(
    url: str, models: list[str], concurrency: int, requests: int, tokens: int
) -> dict[str, float]:
    ttfts: list[float] = []
    total = 0

    async def worker(w: int) -> None:
        nonlocal total
        async with httpx.AsyncClient(timeout=600) as client:
            for i in range(requests):
                model = models[(w * requests + i) % len(models)]
                ttft, out = await one(
                    client, url, model, f"Request {w}-{i}: tell me a story about", tokens
                )
                ttfts.append(ttft)
                total += out

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"tok_s": total / wall, "ttft_p50_s": statistics.median(ttfts), "wall_s": wall}


#: Plain ``vllm serve`` arms: fleetserve's flags, or a variant of them (see :func:`vllm_argv`);
#: each answers "does this setting cost throughput, and does fleetserve add any?".
VLLM_VARIANTS: dict[str, dict[str, Any]] = {
    "same": {},  # exactly the flags the fleetserve replica runs with
    "all-modules": {"lora_target_modules": None},  # LoRA on every module (vLLM's default)
    "slots1": {"max_loras": 1},
    "rank16": {"max_lora_rank": 16},
    "no-prefix-cache": {"engine_args": {"enable_prefix_caching": False}},
    "no-chunked-prefill": {"engine_args": {"enable_chunked_prefill": False}},
}


def vllm_argv(spec_model: dict[str, Any], port: int) -> list[str]:
    """``vllm serve`` with the engine options fleetserve gives ``spec_model`` (one source:
    :meth:`EngineConfig.vllm_cli_args`, as the engine parity test does)."""
    from fleetserve.engine.config import EngineConfig, vllm_server_argv  # noqa: PLC0415 - imports vLLM config
    from fleetserve.host import probe  # noqa: PLC0415
    from fleetserve.plan.local import local_deployment  # noqa: PLC0415
    from fleetserve.spec import parse_spec  # noqa: PLC0415

    spec = parse_spec({"models": [spec_model]}, "lora bench")
    model = spec.models[0]
    settings = local_deployment(spec, probe()).models[model.name].engine
    path = ModelStore().resolve(DEFAULT_MODEL_SOURCE)
    config = EngineConfig.from_spec(model, model_path=path, settings=settings)
    return vllm_server_argv(config.vllm_cli_args(), host="127.0.0.1", port=port)


def measure_engine(
    server: Server,
    label: str,
    names: list[str],
    counts: list[int],
    load: tuple[int, int, int],
    results: dict[str, Any],
) -> None:
    """Base model then N-adapter phases on one engine; ratios within the engine too."""
    results[f"{label}_start_s"] = server.wait_ready(START_TIMEOUT_S)
    asyncio.run(phase(server.url, [DEFAULT_MODEL_NAME], 2, 1, 8))  # warm-up
    base = asyncio.run(phase(server.url, [DEFAULT_MODEL_NAME], *load))
    rows: dict[str, dict[str, float]] = {}
    for n in counts:
        asyncio.run(phase(server.url, names[:n], 1, n, 2))  # each adapter loaded once
        rows[f"adapters_{n}"] = asyncio.run(phase(server.url, names[:n], *load))
    # the base again after the adapters: the host's drift shows as base vs base_after
    after = asyncio.run(phase(server.url, [DEFAULT_MODEL_NAME], *load))
    results[f"{label}/base"], results[f"{label}/base_after"] = base, after
    mean_base = (base["tok_s"] + after["tok_s"]) / 2
    for key, row in rows.items():
        row["ratio_to_base_on_same_engine"] = round(row["tok_s"] / mean_base, 3)
        results[f"{label}/{key}"] = row


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client per phase")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument(
        "--vllm",
        nargs="*",
        default=[],
        choices=sorted(VLLM_VARIANTS),
        help="also run plain vllm serve with fleetserve's flags (same) or a variant",
    )
    ap.add_argument("--no-fleetserve", action="store_true", help="only the --vllm arms")
    ap.add_argument(
        "--no-base-server",
        action="store_true",
        help="skip the LoRA-less fleetserve (ratios then only within each engine)",
    )
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fleetserve-lora-bench"))
    args = ap.parse_args()
    work: Path = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    (work / "dir").mkdir(parents=True)
    base_path = ModelStore().resolve(DEFAULT_MODEL_SOURCE)
    n_max = max(args.adapters)
    names = [f"ad-{i}" for i in range(n_max)]
    t0 = time.monotonic()
    make_adapter(base_path, work / "seed", 1000)
    for name in names:  # the same weights under N ids: vLLM loads each as its own adapter
        shutil.copytree(work / "seed", work / name)
    print(f"adapters made in {time.monotonic() - t0:.1f} s", flush=True)
    model: dict[str, Any] = {
        "name": DEFAULT_MODEL_NAME,
        "source": DEFAULT_MODEL_SOURCE,
        "max_model_len": 1024,
        "concurrency": args.concurrency,
        "max_num_seqs": max(args.concurrency, 8),
    }
    lora_model = {
        **model,
        "max_loras": n_max,
        "max_cpu_loras": n_max + 1,
        "max_lora_rank": 8,
        # what the adapters target; with an adapter_dir fleetserve cannot derive it
        "lora_target_modules": ["q_proj", "v_proj"],
        "adapter_dir": str(work / "dir"),
        "adapters": [{"name": n, "source": str(work / n)} for n in names],
    }
    load = (args.concurrency, args.requests, args.max_tokens)
    results: dict[str, Any] = {
        "load": dict(zip(("concurrency", "requests", "max_tokens"), load, strict=True))
    }
    arms: list[tuple[str, dict[str, Any]]] = []
    if not args.no_fleetserve:
        if not args.no_base_server:
            arms.append(("base", model))
        arms.append(("lora", lora_model))
    for variant in args.vllm:
        changed = {**lora_model, **VLLM_VARIANTS[variant]}
        arms.append((f"vllm-{variant}", {k: v for k, v in changed.items() if v is not None}))
    for label, spec_model in arms:
        if label.startswith("vllm-"):
            server = vllm_server(spec_model, work, label)
            try:
                counts = args.adapters if label == "vllm-same" else [1, n_max]
                if spec_model["max_loras"] < n_max:
                    counts = [1]  # N adapters in one batch need N slots
                measure_engine(server, label, names, counts, load, results)
            finally:
                server.stop()
            (work / "partial.json").write_text(json.dumps(results, indent=2))
            continue
        server = fleetserve_server({"models": [spec_model]}, work, label)
        try:
            results[f"{label}_start_s"] = server.wait_ready(START_TIMEOUT_S)
            asyncio.run(phase(server.url, [DEFAULT_MODEL_NAME], 2, 1, 8))  # warm-up
            if label == "base":
                results["base"] = asyncio.run(phase(server.url, [DEFAULT_MODEL_NAME], *load))
                continue
            on_engine = asyncio.run(phase(server.url, [DEFAULT_MODEL_NAME], *load))
            results["base_on_lora_engine"] = on_engine
            for n in args.adapters:
                asyncio.run(phase(server.url, names[:n], 1, n, 2))  # each adapter loaded once
                row = asyncio.run(phase(server.url, names[:n], *load))
                row["ratio_to_base_on_same_engine"] = round(row["tok_s"] / on_engine["tok_s"], 3)
                results[f"adapters_{n}"] = row
            shutil.copytree(work / "seed", work / "dir" / "cold")
            cold = asyncio.run(phase(server.url, ["cold"], 1, 1, 1))
            warm = asyncio.run(phase(server.url, ["cold"], 1, 1, 1))
            results["cold_first_request_s"] = cold["wall_s"]
            results["warm_request_s"] = warm["wall_s"]
        finally:
            server.stop()
        (work / "partial.json").write_text(json.dumps(results, indent=2))  # a cut run keeps it
    base = results.get("base")
    for row in list(results.values()):
        if base is not None and isinstance(row, dict) and "tok_s" in row:
            row["throughput_ratio"] = round(row["tok_s"] / base["tok_s"], 3)
            row["ttft_ratio"] = round(row["ttft_p50_s"] / base["ttft_p50_s"], 3)
    digest = hashlib.sha256(json.dumps(results["load"]).encode()).hexdigest()[:8]
    (work / f"result-{digest}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
