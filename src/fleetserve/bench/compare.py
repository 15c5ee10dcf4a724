"""``fleetserve bench compare a.json b.json``: the same metrics side by side with ratios.

Points are matched by label (``c=16`` with ``c=16``); unmatched points are listed. For each
metric the ratio is ``b / a`` and the verdict says whether b is better, given the metric's
direction (throughput: higher is better; latency: lower). Changes within ``tolerance``
(default 5 %) are called "same": benchmark noise is rarely smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.bench.metrics import PointSummary
from fleetserve.bench.report import BenchReport

#: (name, accessor path, higher is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("req/s", "request_throughput", True),
    ("output tok/s", "output_throughput", True),
    ("total tok/s", "total_throughput", True),
    ("goodput req/s", "goodput", True),
    ("failed", "failed", False),
    ("TTFT p50 ms", "ttft.p50", False),
    ("TTFT p95 ms", "ttft.p95", False),
    ("TTFT p99 ms", "ttft.p99", False),
    ("TPOT p50 ms", "tpot.p50", False),
    ("TPOT p95 ms", "tpot.p95", False),
    ("ITL p50 ms", "itl.p50", False),
    ("ITL p95 ms", "itl.p95", False),
    ("E2E p50 ms", "e2e.p50", False),
    ("E2E p95 ms", "e2e.p95", False),
    ("E2E p99 ms", "e2e.p99", False),
)


@dataclass(frozen=True, slots=True)
class MetricDelta:
    """One metric of one point in both runs."""

    point: str
    metric: str
    a: float | None
    b: float | None
    higher_is_better: bool

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    def verdict(self, tolerance: float) -> str:
        if self.a is None or self.b is None:
            return "n/a"
        if self.a == self.b:
            return "same"
        ratio = self.ratio
        if ratio is not None and abs(ratio - 1) <= tolerance:
            return "same"
        b_higher = self.b > self.a
        return "better" if b_higher == self.higher_is_better else "worse"


def _get(summary: PointSummary, path: str) -> float | None:
    value: object = summary
    for part in path.split("."):
        value = getattr(value, part)
    return None if value is None else float(value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ReportComparison:
    """Two runs matched point by point."""

    a: BenchReport
    b: BenchReport
    deltas: tuple[MetricDelta, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]

    @classmethod
    def of(cls, a: BenchReport, b: BenchReport) -> ReportComparison:
        a_points = {p.label: p for p in a.points}
        b_points = {p.label: p for p in b.points}
        common = [label for label in a_points if label in b_points]
        deltas = tuple(
            MetricDelta(label, name, _get(a_points[label], path), _get(b_points[label], path), hib)
            for label in common
            for name, path, hib in METRICS
        )
        return cls(
            a=a,
            b=b,
            deltas=deltas,
            only_a=tuple(label for label in a_points if label not in b_points),
            only_b=tuple(label for label in b_points if label not in a_points),
        )

    def differences_in_setup(self) -> list[str]:
        """Settings that differ between the runs (they make the comparison less fair)."""
        out = []
        for field in ("model", "endpoint", "workload", "seed", "tokens_source", "ignore_eos"):
            va, vb = getattr(self.a.run, field), getattr(self.b.run, field)
            if va != vb:
                out.append(f"{field}: {va!r} vs {vb!r}")
        return out

    def to_markdown(self, tolerance: float = 0.05) -> str:
        lines = [
            f"# Compare: a = {self.a.run.label}, b = {self.b.run.label}",
            "",
            "| point | metric | a | b | b/a | |",
            "|---|---|---:|---:|---:|---|",
        ]
        for d in self.deltas:
            ratio = "-" if d.ratio is None else f"{d.ratio:.3f}"
            lines.append(
                f"| {d.point} | {d.metric} | {_fmt(d.a)} | {_fmt(d.b)} | {ratio} | "
                f"{d.verdict(tolerance)} |"
            )
        for note in self.differences_in_setup():
            lines.append(f"\nsetup differs: {note}")
        if self.only_a or self.only_b:
            lines.append(
                f"\nunmatched points: a only {list(self.only_a)}, b only {list(self.only_b)}"
            )
        return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.2f}"
