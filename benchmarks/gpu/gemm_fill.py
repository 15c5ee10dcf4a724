"""How fast the card runs a prefill's matmuls, by model width (issue #29's 12B TTFT lead).

Times, with CUDA events, the four linear layers of one Gemma 3 decoder layer (q/k/v, o,
gate/up, down) in bf16 at a prefill's token count, for the 1B, 4B and 12B text configs,
and prints each shape's TFLOP/s, the fraction of the card's dense bf16 peak, and the
whole prefill's matmul time (x layers). Needs only torch and a CUDA card (the GPU host has
both; no vLLM):

    python benchmarks/gpu/gemm_fill.py --peak-tflops 989 --out gemm.json

What it answers: whether a small model's matmuls fill the card as well as a large one's
(the simulator's compute term is FLOPs / (peak x one efficiency)), and how long a 512-token
prefill's matmuls take on the card, to set against the measured time to first token.
"""

from __future__ import annotations

import argparse
import json

#: (hidden, intermediate, heads, kv heads, head_dim, layers) of the published text configs
GEMMA3 = {
    "gemma-3-1b": (1152, 6912, 4, 1, 256, 26),
    "gemma-3-4b": (2560, 10240, 8, 4, 256, 34),
    "gemma-3-12b": (3840, 15360, 16, 8, 256, 48),
    "gemma-3-27b": (5376, 21504, 32, 16, 128, 62),
}


def main() -> None:
    import torch  # noqa: PLC0415  (the GPU host's torch; not a project dependency)

    ap = argparse.ArgumentParser()
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--tokens", type=int, nargs="+", default=[522, 2048, 8192])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"{props.name}: {props.multi_processor_count} SMs, torch {torch.__version__}")
    rows = []
    for name, (h, inter, heads, kv, hd, layers) in GEMMA3.items():
        shapes = {
            "qkv": (h, (heads + 2 * kv) * hd),
            "o": (heads * hd, h),
            "gate_up": (h, 2 * inter),
            "down": (inter, h),
        }
        for m in args.tokens:
            total_ms = 0.0
            flops_layer = 0.0
            for part, (k, n) in shapes.items():
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
                for _ in range(5):
                    torch.nn.functional.linear(x, w)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.reps):
                    torch.nn.functional.linear(x, w)
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / args.reps
                flops = 2.0 * m * k * n
                tflops = flops / ms / 1e9
                rows.append(
                    {
                        "model": name,
                        "tokens": m,
                        "part": part,
                        "k": k,
                        "n": n,
                        "ms": ms,
                        "tflops": tflops,
                        "of_peak": tflops / args.peak_tflops,
                    }
                )
                total_ms += ms
                flops_layer += flops
            eff = flops_layer / total_ms / 1e9 / args.peak_tflops
            rows.append(
                {
                    "model": name,
                    "tokens": m,
                    "part": "layer x layers",
                    "ms": total_ms * layers,
                    "of_peak": eff,
                }
            )
            print(
                f"{name:12s} {m:5d} tokens: matmuls {total_ms * layers:7.2f} ms "
                f"({eff:.2f} of peak); "
                + ", ".join(f"{r['part']} {r['of_peak']:.2f}" for r in rows[-5:-1]),
                flush=True,
            )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "device": props.name,
                    "sms": props.multi_processor_count,
                    "peak_tflops": args.peak_tflops,
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
