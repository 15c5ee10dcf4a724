"""Markdown rendering of a report (``--markdown``): settings, one table row per point,
latency percentiles, and errors."""

from __future__ import annotations

from fleetserve.bench.metrics import LatencyStats
from fleetserve.bench.report import BenchReport


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _lat(s: LatencyStats) -> str:
    return f"{_ms(s.mean)} / {_ms(s.p50)} / {_ms(s.p90)} / {_ms(s.p95)} / {_ms(s.p99)}"


def render_markdown(report: BenchReport) -> str:
    run = report.run
    lines = [
        f"# Benchmark: {run.label}",
        "",
        f"- endpoint: `{run.base_url}` ({run.endpoint}), model `{run.model}`",
        f"- workload: {run.workload}; prompt lengths {run.prompt_lengths}",
        f"- tokens counted with: {run.tokens_source}",
        f"- ignore_eos: {'sent' if run.ignore_eos else 'not sent'} {run.ignore_eos_note}".rstrip(),
        "- per point: "
        + (f"{run.num_requests} requests" if run.num_requests else f"{run.duration_s:g} s")
        + f", warm-up {run.warmup} (excluded), seed {run.seed}; SLO: {run.slo}",
        f"- started {run.started_at}, fleetserve {run.version}",
        "",
        "## Throughput",
        "",
        "| point | ok | failed | req/s | out tok/s | total tok/s | goodput req/s "
        "| send lag p50 / p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report.points:
        good = "-" if p.goodput is None else f"{p.goodput:.2f} ({p.slo_attainment:.0%})"
        lines.append(
            f"| {p.label} | {p.succeeded} | {p.failed} | {p.request_throughput:.2f} | "
            f"{p.output_throughput:.1f} | {p.total_throughput:.1f} | {good} | "
            f"{_ms(p.send_lag.p50)} / {_ms(p.send_lag.p99)} |"
        )
    lines += [
        "",
        "## Latency (ms): mean / p50 / p90 / p95 / p99",
        "",
        "| point | TTFT | TPOT | ITL | E2E |",
        "|---|---|---|---|---|",
    ]
    for p in report.points:
        lines.append(
            f"| {p.label} | {_lat(p.ttft)} | {_lat(p.tpot)} | {_lat(p.itl)} | {_lat(p.e2e)} |"
        )
    failed = [p for p in report.points if p.failed]
    if failed:
        lines += [
            "",
            "## Errors",
            "",
            "| point | by status | by type | example |",
            "|---|---|---|---|",
        ]
        for p in failed:
            status = ", ".join(f"{k}: {v}" for k, v in p.errors_by_status.items())
            kinds = ", ".join(f"{k}: {v}" for k, v in p.errors_by_type.items())
            example = next(iter(p.error_examples.values()), "").replace("|", "\\|")
            lines.append(f"| {p.label} | {status} | {kinds} | {example[:160]} |")
    return "\n".join(lines) + "\n"
