"""The ``fleetserve top`` screen: a :class:`FleetView` as rich renderables (pure).

Two tables, models (a summary row per model, then one indented row per replica) and
tenants, under a header naming the source and the interval. Unknown values print "-".
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fleetserve.top.model import FleetView

DASH = "-"


def _num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return DASH if value is None else f"{value * 1000:.0f}"


def _pct(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.0f}%"


def render(view: FleetView, source: str, status: str = "") -> RenderableType:
    """The whole screen for one refresh."""
    interval = f"last {view.interval_s:.1f} s" if view.interval_s is not None else "first sample"
    header = Text.assemble(
        ("fleetserve top", "bold"),
        f"  {source}  ({interval})  ",
        (status, "yellow"),
        ("  q: quit", "dim"),
    )
    models = Table(title="models and replicas", title_justify="left", expand=True)
    for column, justify in (
        ("model / replica", "left"),
        ("state", "left"),
        ("in flight", "right"),
        ("queued", "right"),
        ("tokens/s", "right"),
        ("TTFT p50 ms", "right"),
        ("TTFT p99 ms", "right"),
        ("KV cache", "right"),
        ("5xx/s", "right"),
    ):
        models.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in view.models:
        models.add_row(
            Text(row.model, style="bold"),
            f"{row.healthy}/{len(row.replicas)} up",
            _num(row.in_flight, 0),
            _num(row.queued, 0),
            _num(row.tokens_per_s),
            _ms(row.ttft_p50),
            _ms(row.ttft_p99),
            _pct(row.kv_cache),
            _num(row.errors_per_s, 2),
        )
        for replica in row.replicas:
            models.add_row(
                f"  {replica.replica}",
                Text(replica.state, style="green" if replica.state == "healthy" else "red"),
                _num(replica.processing, 0),
                _num(replica.waiting, 0),
                _num(replica.tokens_per_s),
                _ms(replica.ttft_p50),
                _ms(replica.ttft_p99),
                _pct(replica.kv_cache),
                "",
            )
    if not view.models:
        models.add_row("(no models seen yet)", "", "", "", "", "", "", "", "")
    tenants = Table(title="tenants", title_justify="left", expand=True)
    for column, justify in (
        ("tenant", "left"),
        ("requests/s", "right"),
        ("tokens/s", "right"),
        ("rejections/s", "right"),
        ("by reason", "left"),
    ):
        tenants.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for t in view.tenants:
        reasons = ", ".join(f"{k} {v:.2f}" for k, v in t.rejections.items())
        tenants.add_row(
            t.tenant,
            _num(t.requests_per_s, 2),
            _num(t.tokens_per_s),
            _num(t.rejections_per_s, 2),
            reasons,
        )
    return Group(header, models, tenants)
