"""PNG plots of a report (``--plots DIR``), matplotlib with the Agg backend (no display).

* ``latency_cdf.png``: CDFs of TTFT, TPOT, ITL and E2E, one line per load point.
* ``throughput.png`` (sweeps of two or more points): output tokens/s and requests/s, and
  p95 TTFT / TPOT / E2E against the swept quantity (concurrency, rate or burst size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fleetserve.bench.report import BenchReport
from fleetserve.errors import BenchError


def _per_point(report: BenchReport, metric: str) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {p.label: [] for p in report.points}
    for r in report.records:
        if r.get("warmup") or not r.get("ok") or r.get("point") not in out:
            continue
        label = r["point"]
        if metric == "itl":
            out[label].extend(r.get("itl") or [])
        elif metric == "tpot":
            ttft, e2e, n = r.get("ttft"), r.get("e2e"), r.get("tokens_out") or 0
            if ttft is not None and e2e is not None and n > 1:
                out[label].append((e2e - ttft) / (n - 1))
        elif r.get(metric) is not None:
            out[label].append(r[metric])
    return {k: np.sort(np.asarray(v)) * 1e3 for k, v in out.items()}


def write_plots(report: BenchReport, directory: Path) -> list[Path]:
    """Write the PNGs; returns their paths."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BenchError(f"--plots {directory}: cannot create: {e.strerror or e}") from e
    written = [_cdf(report, directory / "latency_cdf.png")]
    if len(report.points) >= 2:
        written.append(_sweep(report, directory / "throughput.png"))
    return written


def _cdf(report: BenchReport, path: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, metric, title in zip(
        axes.flat,
        ("ttft", "tpot", "itl", "e2e"),
        ("TTFT", "TPOT", "ITL", "E2E latency"),
        strict=True,
    ):
        for label, values in _per_point(report, metric).items():
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=label)
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of gaps")
        ax.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6))
    fig.suptitle(f"{report.run.label}: latency CDFs ({report.run.workload})")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _sweep(report: BenchReport, path: Path) -> Path:
    points = sorted(report.points, key=lambda p: p.x)
    xs = [p.x for p in points]
    kind = points[0].label.split("=")[0]
    xlabel = {"c": "concurrency", "rate": "request rate (req/s)", "burst": "burst size"}.get(
        kind, kind
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(xs, [p.output_throughput for p in points], "o-", label="output tokens/s")
    left.set_xlabel(xlabel)
    left.set_ylabel("output tokens/s")
    twin: Any = left.twinx()
    twin.plot(xs, [p.request_throughput for p in points], "s--", color="tab:orange", label="req/s")
    twin.set_ylabel("requests/s")
    left.set_title("Throughput")
    left.grid(True, alpha=0.3)
    for name in ("ttft", "tpot", "e2e"):
        right.plot(xs, [getattr(p, name).p95 or np.nan for p in points], "o-", label=f"p95 {name}")
    right.set_xlabel(xlabel)
    right.set_ylabel("ms")
    right.set_yscale("log")
    right.set_title("p95 latency")
    right.legend()
    right.grid(True, alpha=0.3)
    if kind == "c":
        for ax in (left, right):
            ax.set_xscale("log", base=2)
    fig.suptitle(f"{report.run.label}: {report.run.workload}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
