"""How a vocabulary sort's time grows with the vocabulary (issue #29).

Design note. The performance model prices top-p sampling's sort of a sequence's logits as
``sort_s_per_compare x V log2 V`` (``fleetserve.sampling``, ``Calibration``), a constant
fitted on one vocabulary (Gemma 3's 262,144). Whether the form carries to other
vocabularies is a property of the sort, not of vLLM: this times ``torch.sort`` of a batch of
float32 logit rows (what vLLM's CPU sampler sorts) on one thread, for the vocabularies of
common model families, and prints the time per row over ``V log2 V`` and over ``V``: the
form that holds is the one whose constant stays put.

    taskset -c 1 .venv/bin/python benchmarks/vocab_sort.py
"""

from __future__ import annotations

import argparse
import math
import time


def main() -> None:
    import torch  # noqa: PLC0415 - only where the benchmark runs

    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--vocab",
        type=int,
        nargs="+",
        default=[32_000, 128_256, 151_936, 262_144],
        help="vocabularies (Llama 2, Llama 3, Qwen 2.5, Gemma 3)",
    )
    ap.add_argument("--rows", type=int, default=16, help="sequences sorted at once")
    ap.add_argument("--rounds", type=int, default=5, help="best of")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| V | ms a row | ns per compare (V log2 V) | ns per logit (V) |")
    print("|---:|---:|---:|---:|")
    for v in args.vocab:
        x = torch.randn(args.rows, v)
        torch.sort(x, dim=-1)  # warm-up
        best = math.inf
        for _ in range(args.rounds):
            t = time.perf_counter()
            torch.sort(x, dim=-1)
            best = min(best, time.perf_counter() - t)
        row = best / args.rows
        per_compare, per_logit = row / (v * math.log2(v)), row / v
        print(f"| {v:,} | {row * 1e3:.2f} | {per_compare * 1e9:.2f} | {per_logit * 1e9:.1f} |")


if __name__ == "__main__":
    main()
