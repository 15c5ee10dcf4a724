"""Which dtype should the prepared default model be stored in? bfloat16 vs float32 on vLLM CPU.

Serves the prepared Gemma 3 270M directory with vLLM's offline ``LLM`` once per dtype (the
float32 run upcasts the same weights, which is exactly what a float32-prepared directory
would hold up to bf16 rounding), alternating the order per round so machine noise hits both,
and reports side-by-side ratios: batch decode throughput (32 prompts x 128 tokens), single
stream tok/s, and whether greedy outputs agree.

    .venv/bin/python benchmarks/model_dtype.py [--rounds 1] [--enforce-eager] [--model-dir DIR]
    .venv/bin/python benchmarks/model_dtype.py --engine transformers [--rounds 4]

Each engine runs in its own subprocess (a fresh engine per measurement; vLLM's engine core
does not release everything on ``del``). ``--enforce-eager`` skips torch.compile, which takes
5-15 minutes per dtype on a busy 2-CPU host. ``--engine transformers`` is the quick proxy: the
same weights in transformers (eager, 1 thread, batch 8 x 24 greedy tokens), both dtypes in one
process, alternating per round. Numbers land in docs/decisions.md (Default model preparation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fleetserve.modelstore import ModelStore
from fleetserve.spec import DEFAULT_MODEL_SOURCE

PROMPTS = [
    "Once upon a time,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
]
BATCH = 32
MAX_TOKENS = 128


def measure_transformers(model_dir: str, rounds: int) -> None:
    """Quick proxy: both dtypes in one process, alternating order per round."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    models = {
        name: AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, name))
        for name in ("bfloat16", "float32")
    }
    batch = tok([f"Write a story about dragon number {i}." for i in range(8)], return_tensors="pt")
    speeds: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds):
        for name in ("bfloat16", "float32") if r % 2 == 0 else ("float32", "bfloat16"):
            t0 = time.perf_counter()
            models[name].generate(**batch, max_new_tokens=24, min_new_tokens=24, do_sample=False)
            speeds[name].append(8 * 24 / (time.perf_counter() - t0))
    for name, values in speeds.items():
        print(name, [round(v, 1) for v in values], f"median {statistics.median(values):.1f} tok/s")
    ratio = statistics.median(speeds["bfloat16"]) / statistics.median(speeds["float32"])
    print(f"bf16 / fp32 decode throughput: {ratio:.2f}")


def measure(model_dir: str, dtype: str, enforce_eager: bool = False) -> dict[str, object]:
    """One engine, one dtype: start-up, throughput, single-stream speed, greedy texts."""
    from vllm import LLM, SamplingParams  # noqa: PLC0415 (only the engine child needs vLLM)

    t0 = time.monotonic()
    llm = LLM(
        model=model_dir,
        dtype=dtype,
        max_model_len=2048,
        kv_cache_memory_bytes=512 * 2**20,
        enforce_eager=enforce_eager,
        seed=0,
    )
    start_s = time.monotonic() - t0
    greedy = SamplingParams(temperature=0, max_tokens=32)
    texts = [o.outputs[0].text for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    fixed = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    batch = [f"Write a story about dragon number {i}." for i in range(BATCH)]
    llm.generate(batch[:2], fixed, use_tqdm=False)  # warm-up
    t0 = time.monotonic()
    outs = llm.generate(batch, fixed, use_tqdm=False)
    batch_tps = sum(len(o.outputs[0].token_ids) for o in outs) / (time.monotonic() - t0)
    t0 = time.monotonic()
    one = llm.generate(batch[:1], fixed, use_tqdm=False)[0]
    single_tps = len(one.outputs[0].token_ids) / (time.monotonic() - t0)
    return {
        "dtype": dtype,
        "start_s": start_s,
        "batch_tok_s": batch_tps,
        "single_tok_s": single_tps,
        "texts": texts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--engine", choices=("vllm", "transformers"), default="vllm")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without compile")
    parser.add_argument("--child", nargs=2, metavar=("DIR", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = measure(*args.child, enforce_eager=args.enforce_eager)
        print("RESULT " + json.dumps(result), flush=True)
        return

    model_dir = args.model_dir or ModelStore().resolve(DEFAULT_MODEL_SOURCE)
    if args.engine == "transformers":
        measure_transformers(model_dir, max(2, args.rounds))
        return
    results: dict[str, list[dict[str, object]]] = {"bfloat16": [], "float32": []}
    for r in range(args.rounds):
        order = ["bfloat16", "float32"] if r % 2 == 0 else ["float32", "bfloat16"]
        for dtype in order:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    model_dir,
                    dtype,
                    *(["--enforce-eager"] if args.enforce_eager else []),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{dtype} run failed:\n{proc.stderr[-4000:]}")
            results[dtype].append(json.loads(line.removeprefix("RESULT ")))
            print(dtype, {k: v for k, v in results[dtype][-1].items() if k != "texts"})

    def med(dtype: str, key: str) -> float:
        return statistics.median(float(str(x[key])) for x in results[dtype])

    print(f"\nmodel: {model_dir}  rounds: {args.rounds}")
    print("| metric | bfloat16 | float32 | bf16 / fp32 |")
    print("|---|---|---|---|")
    for key in ("batch_tok_s", "single_tok_s", "start_s"):
        bf, fp = med("bfloat16", key), med("float32", key)
        print(f"| {key} | {bf:.1f} | {fp:.1f} | {bf / fp:.2f} |")
    bf_texts = [str(t) for t in results["bfloat16"][0]["texts"]]  # type: ignore[attr-defined]
    fp_texts = [str(t) for t in results["float32"][0]["texts"]]  # type: ignore[attr-defined]
    same = sum(a == b for a, b in zip(bf_texts, fp_texts, strict=True))
    print(f"greedy outputs identical: {same}/{len(PROMPTS)}")
    for a, b in zip(bf_texts, fp_texts, strict=True):
        print(f"  bf16: {a!r}\n  fp32: {b!r}")
    print(f"disk: bfloat16 {Path(model_dir, 'model.safetensors').stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
