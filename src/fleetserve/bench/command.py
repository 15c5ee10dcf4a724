"""``fleetserve bench``: load-test any OpenAI-compatible endpoint; ``fleetserve bench
compare a.json b.json``: two runs side by side with ratios.

Thin shell: flags become :class:`BenchSettings` (bad values -> :class:`UsageError` naming the
flag), then :func:`run_benchmark` does the work.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from fleetserve.bench.compare import ReportComparison
from fleetserve.bench.console import comparison_table
from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.report import BenchReport
from fleetserve.bench.settings import BenchSettings
from fleetserve.bench.slo import Slo, parse_duration
from fleetserve.errors import UsageError
from fleetserve.inputfile import first_problem


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint (fleetserve, vllm serve, Ray Serve LLM...)",
        description=(
            "Measure TTFT, TPOT, ITL, latency, throughput and goodput of any OpenAI-compatible "
            "endpoint. Example: fleetserve bench --base-url http://127.0.0.1:8000 --model "
            "gemma-3-270m --concurrency 1,4,16 --num-requests 100 --output run.json"
        ),
    )
    target = p.add_argument_group("target")
    target.add_argument("--base-url", help="endpoint, e.g. http://127.0.0.1:8000 (/v1 optional)")
    target.add_argument("--model", help="model id to request (a local dir also gives a tokenizer)")
    target.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    target.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY if set)")
    target.add_argument("--header", action="append", default=[], metavar="K=V", help="extra header")
    target.add_argument(
        "--extra-body", metavar="JSON", help="merged into every request, e.g. '{\"temperature\":0}'"
    )
    target.add_argument("--timeout", default="600s", help="per-request timeout (default 600s)")

    work = p.add_argument_group("workload (default: synthetic)")
    src = work.add_mutually_exclusive_group()
    src.add_argument("--prompts", type=Path, metavar="FILE", help="one prompt per line")
    src.add_argument("--sharegpt", type=Path, metavar="FILE", help="ShareGPT-format JSON")
    src.add_argument(
        "--shared-prefix",
        metavar="GROUPS:TOKENS",
        help="N groups sharing a system prompt of TOKENS tokens, e.g. 4:1024",
    )
    work.add_argument(
        "--input-len", default="128", help="prompt tokens: N, uniform:LO-HI, normal:MEAN,STD"
    )
    work.add_argument("--output-len", help="tokens to generate (same forms; default 128)")
    work.add_argument("--results", type=Path, metavar="FILE", help="write prompts and responses")
    work.add_argument("--tokenizer", type=Path, metavar="DIR", help="local tokenizer directory")
    work.add_argument(
        "--ignore-eos",
        choices=("auto", "on", "off"),
        default="auto",
        help="send ignore_eos so outputs have the asked length (auto: if the server accepts it)",
    )

    load = p.add_argument_group("load (default: --concurrency 1)")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", metavar="N[,N...]", help="closed loop; a list sweeps")
    shape.add_argument("--rate", metavar="R[,R...]", help="open loop arrivals, requests/s")
    shape.add_argument("--burst", metavar="SIZE@INTERVAL", help="e.g. 32@5s: 32 at once every 5 s")
    load.add_argument(
        "--arrival", choices=("poisson", "constant", "gamma"), default="poisson", help="--rate"
    )
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (--arrival gamma)")
    load.add_argument("--max-concurrency", type=int, help="in-flight cap for --rate / --burst")
    stop = load.add_mutually_exclusive_group()
    stop.add_argument("--num-requests", type=int, help="measured requests per point (default 200)")
    stop.add_argument("--duration", help="time per point, e.g. 60s")
    load.add_argument("--warmup", type=int, default=0, help="requests excluded per point")
    load.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of prompts and arrivals (each load point draws its own prompts from it)",
    )
    load.add_argument("--slo", help="goodput bounds, e.g. ttft=500ms,tpot=50ms,e2e=10s")

    out = p.add_argument_group("output")
    out.add_argument("--output", type=Path, metavar="FILE", help="JSON with every record")
    out.add_argument("--markdown", type=Path, metavar="FILE", help="Markdown report")
    out.add_argument("--plots", type=Path, metavar="DIR", help="PNG plots")
    out.add_argument("--label", help="run name in reports (default: the model)")
    out.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.set_defaults(handler=_run)

    sub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    c = sub.add_parser("compare", help="compare two bench JSON reports (ratios b/a)")
    c.add_argument("a", type=Path, help="baseline report")
    c.add_argument("b", type=Path, help="report to compare")
    c.add_argument("--markdown", type=Path, metavar="FILE", help="also write Markdown")
    c.add_argument("--tolerance", type=float, default=0.05, help="|b/a-1| called 'same'")
    c.set_defaults(handler=_compare)


def _split(text: str, flag: str, cast: type[int] | type[float]) -> list[Any]:
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise UsageError(f"{flag}: cannot read {text!r} (a comma-separated list of numbers)") from e
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"{flag}: values must be > 0, got {text!r}")
    return values


def _points(args: argparse.Namespace) -> list[dict[str, Any]]:
    cap = args.max_concurrency
    if cap is not None and cap < 1:
        raise UsageError(f"--max-concurrency must be >= 1, got {cap}")
    if args.rate:
        return [
            {
                "kind": "rate",
                "rate": r,
                "arrival": args.arrival,
                "burstiness": args.burstiness,
                "concurrency": cap,
            }
            for r in _split(args.rate, "--rate", float)
        ]
    if args.burst:
        size, sep, interval = args.burst.partition("@")
        if not sep:
            raise UsageError(f"--burst: cannot read {args.burst!r}", hint="e.g. --burst 32@5s")
        return [
            {
                "kind": "burst",
                "burst_size": _split(size, "--burst size", int)[0],
                "burst_interval": parse_duration(interval, flag="--burst interval"),
                "concurrency": cap,
            }
        ]
    if cap is not None:
        raise UsageError("--max-concurrency applies to --rate and --burst (use --concurrency)")
    return [
        {"kind": "concurrency", "concurrency": c}
        for c in _split(args.concurrency or "1", "--concurrency", int)
    ]


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Flags -> :class:`BenchSettings`; every error names the flag."""
    if not args.base_url or not args.model:
        raise UsageError(
            "fleetserve bench needs --base-url and --model",
            hint="e.g. fleetserve bench --base-url http://127.0.0.1:8000 --model gemma-3-270m",
        )
    workload: dict[str, Any] = {
        "kind": "synthetic",
        "input_len": LengthDistribution.parse(args.input_len, flag="--input-len"),
        "output_len": (
            LengthDistribution.parse(args.output_len, flag="--output-len")
            if args.output_len
            else None
        ),
    }
    if args.prompts:
        workload.update(kind="prompts", prompts=args.prompts)
    elif args.sharegpt:
        workload.update(kind="sharegpt", sharegpt=args.sharegpt)
    elif args.shared_prefix:
        groups, sep, tokens = args.shared_prefix.partition(":")
        try:
            workload.update(kind="shared-prefix", prefix_groups=int(groups), prefix_len=int(tokens))
        except ValueError as e:
            raise UsageError(
                f"--shared-prefix: cannot read {args.shared_prefix!r}", hint="e.g. 4:1024"
            ) from e
    headers: dict[str, str] = {}
    for h in args.header:
        key, sep, value = h.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--header: cannot read {h!r}", hint="write KEY=VALUE")
        headers[key.strip()] = value
    extra: dict[str, Any] = {}
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as e:
            raise UsageError(f"--extra-body: not JSON: {e.msg} at column {e.colno}") from e
        if not isinstance(extra, dict):
            raise UsageError("--extra-body: must be a JSON object")
    raw = {
        "base_url": args.base_url,
        "model": args.model,
        "endpoint": args.endpoint,
        "label": args.label,
        "workload": workload,
        "points": _points(args),
        "num_requests": args.num_requests,
        "duration_s": parse_duration(args.duration, flag="--duration") if args.duration else None,
        "warmup": args.warmup,
        "seed": args.seed,
        "tokenizer": args.tokenizer,
        "ignore_eos": args.ignore_eos,
        "slo": Slo.parse(args.slo) if args.slo else None,
        "timeout_s": parse_duration(args.timeout, flag="--timeout"),
        "api_key": args.api_key or os.environ.get("OPENAI_API_KEY") or None,
        "headers": headers,
        "extra_body": extra,
        "output": args.output,
        "markdown": args.markdown,
        "plots": args.plots,
        "results": args.results,
        "progress": not args.no_progress,
    }
    try:
        return BenchSettings.model_validate(raw)
    except ValidationError as e:
        raise UsageError(f"bench: {first_problem(e)}") from e


def _run(args: argparse.Namespace) -> int:
    # Lazy: the session pulls in aiohttp; `fleetserve --help` should not pay for it.
    from fleetserve.bench.session import run_benchmark  # noqa: PLC0415

    run_benchmark(settings_from_args(args))
    return 0


def _compare(args: argparse.Namespace) -> int:
    cmp = ReportComparison.of(BenchReport.load(args.a), BenchReport.load(args.b))
    console = Console()
    console.print(comparison_table(cmp, args.tolerance))
    for note in cmp.differences_in_setup():
        console.print(f"[yellow]setup differs:[/] {note}")
    if cmp.only_a or cmp.only_b:
        console.print(f"unmatched points: a only {list(cmp.only_a)}, b only {list(cmp.only_b)}")
    if not cmp.deltas:
        raise UsageError(f"{args.a} and {args.b} have no load point in common")
    if args.markdown:
        try:
            args.markdown.write_text(cmp.to_markdown(args.tolerance), encoding="utf-8")
        except OSError as e:
            raise UsageError(f"--markdown {args.markdown}: cannot write: {e.strerror}") from e
    return 0
