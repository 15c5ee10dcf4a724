"""Terminal output with rich: the live progress line during a run, the summary table after
it, and the comparison table of ``bench compare``.

The live display is refreshed by its own asyncio task a few times a second from the runner's
counters (never per request), so it costs the event loop almost nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from time import perf_counter

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fleetserve.bench.compare import ReportComparison
from fleetserve.bench.report import BenchReport
from fleetserve.bench.runner import RunCounters

_REFRESH_S = 0.5


def _progress_text(c: RunCounters, started: float) -> Text:
    elapsed = perf_counter() - started
    if c.target is not None:
        goal = f"{c.sent}/{c.target}"
    elif c.measure_start is not None and c.duration_s:
        goal = f"{min(perf_counter() - c.measure_start, c.duration_s):.0f}/{c.duration_s:g}s"
    else:
        goal = f"{c.sent} sent (warm-up)"
    rate = c.done / elapsed if elapsed > 0 else 0.0
    chunks = c.chunks / elapsed if elapsed > 0 else 0.0
    text = Text.assemble(
        (f"{c.point:>14} ", "bold cyan"),
        f"{goal}  done {c.done}  in flight {c.in_flight}  ",
        (f"failed {c.failed}  ", "bold red" if c.failed else "dim"),
        f"{rate:.1f} req/s  {chunks:.0f} chunks/s",
    )
    return text


@contextlib.asynccontextmanager
async def live_progress(
    counters: RunCounters, console: Console, enabled: bool
) -> AsyncIterator[None]:
    """Show a one-line live status while the body runs (no-op when disabled)."""
    if not enabled:
        yield
        return
    started = perf_counter()
    with Live(
        _progress_text(counters, started), console=console, auto_refresh=False, transient=True
    ) as live:

        async def refresh() -> None:
            while True:
                await asyncio.sleep(_REFRESH_S)
                live.update(_progress_text(counters, started), refresh=True)

        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def summary_table(report: BenchReport) -> Table:
    run = report.run
    table = Table(
        title=f"{run.label}: {run.workload}",
        caption=f"tokens: {run.tokens_source}; latencies in ms (p50 / p95 / p99)",
    )
    for name, justify in (
        ("point", "left"),
        ("ok", "right"),
        ("failed", "right"),
        ("req/s", "right"),
        ("out tok/s", "right"),
        ("goodput", "right"),
        ("TTFT", "right"),
        ("TPOT", "right"),
        ("ITL", "right"),
        ("E2E", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for p in report.points:
        good = "-" if p.goodput is None else f"{p.goodput:.2f} ({p.slo_attainment:.0%})"
        table.add_row(
            p.label,
            str(p.succeeded),
            Text(str(p.failed), style="bold red" if p.failed else ""),
            f"{p.request_throughput:.2f}",
            f"{p.output_throughput:.1f}",
            good,
            *(
                f"{_ms(s.p50)} / {_ms(s.p95)} / {_ms(s.p99)}"
                for s in (p.ttft, p.tpot, p.itl, p.e2e)
            ),
        )
    return table


def error_table(report: BenchReport) -> Table | None:
    rows = [(p, k, n) for p in report.points for k, n in p.errors_by_type.items()]
    if not rows:
        return None
    table = Table(title="Failed requests", title_style="bold red")
    table.add_column("point")
    table.add_column("error")
    table.add_column("count", justify="right")
    table.add_column("example")
    for p, kind, n in rows:
        table.add_row(p.label, kind, str(n), p.error_examples.get(kind, "")[:120])
    return table


def comparison_table(cmp: ReportComparison, tolerance: float) -> Table:
    table = Table(title=f"a = {cmp.a.run.label}   b = {cmp.b.run.label}")
    for name in ("point", "metric", "a", "b", "b/a", ""):
        table.add_column(name, justify="left" if name in ("point", "metric", "") else "right")
    styles = {"better": "green", "worse": "bold red", "same": "dim", "n/a": "dim"}
    for d in cmp.deltas:
        verdict = d.verdict(tolerance)
        table.add_row(
            d.point,
            d.metric,
            "-" if d.a is None else f"{d.a:.2f}",
            "-" if d.b is None else f"{d.b:.2f}",
            "-" if d.ratio is None else f"{d.ratio:.3f}",
            Text(verdict, style=styles[verdict]),
        )
    return table
