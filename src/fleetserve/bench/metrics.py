"""Reduce request records to the numbers a report shows.

Definitions (what must stay true; they match vLLM's ``bench serve`` where both define one):

* TTFT: send -> first streamed content chunk. E2E: send -> end of the response.
* TPOT (per request): ``(e2e - ttft) / (tokens_out - 1)``; ITL: every gap between
  consecutive content chunks, pooled over requests.
* Window: first measured send -> last measured end. Throughputs divide by it: requests/s
  counts successful requests, output tokens/s their generated tokens, total tokens/s adds
  their prompt tokens. Goodput: successful requests meeting the SLO, per second.
* Warm-up records are excluded everywhere; failed requests count in ``failed`` and in the
  error tables, never in latency statistics.
* Percentiles: ``numpy.percentile`` (linear interpolation).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fleetserve.bench.record import RequestRecord
from fleetserve.bench.slo import Slo

PERCENTILES = (50, 90, 95, 99)


class LatencyStats(BaseModel):
    """Distribution of one latency metric, in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=0, description="Samples.")
    mean: float | None = Field(default=None, description="Mean (ms).")
    std: float | None = Field(default=None, description="Standard deviation (ms).")
    min: float | None = Field(default=None, description="Minimum (ms).")
    p50: float | None = Field(default=None, description="Median (ms).")
    p90: float | None = Field(default=None, description="90th percentile (ms).")
    p95: float | None = Field(default=None, description="95th percentile (ms).")
    p99: float | None = Field(default=None, description="99th percentile (ms).")
    max: float | None = Field(default=None, description="Maximum (ms).")

    @classmethod
    def of(cls, seconds: Sequence[float] | np.ndarray) -> LatencyStats:
        values = np.asarray(seconds, dtype=np.float64) * 1e3
        if values.size == 0:
            return cls(count=0)
        p = np.percentile(values, PERCENTILES)
        return cls(
            count=int(values.size),
            mean=float(values.mean()),
            std=float(values.std()),
            min=float(values.min()),
            p50=float(p[0]),
            p90=float(p[1]),
            p95=float(p[2]),
            p99=float(p[3]),
            max=float(values.max()),
        )


class PointSummary(BaseModel):
    """Everything measured at one load point."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(description="Load point label (c=16, rate=5...).")
    x: float = Field(description="Swept quantity: concurrency, rate or burst size.")
    requests: int = Field(ge=0, description="Measured requests sent (warm-up excluded).")
    succeeded: int = Field(ge=0, description="Requests that streamed to completion.")
    failed: int = Field(ge=0, description="Requests that failed (see errors).")
    warmup: int = Field(ge=0, description="Warm-up requests (excluded from statistics).")
    duration_s: float = Field(ge=0, description="Window: first send to last end (s).")
    request_throughput: float = Field(ge=0, description="Successful requests/s.")
    output_throughput: float = Field(ge=0, description="Generated tokens/s.")
    total_throughput: float = Field(ge=0, description="Prompt + generated tokens/s.")
    goodput: float | None = Field(default=None, description="Requests/s meeting the SLO.")
    slo_attainment: float | None = Field(
        default=None, description="Share of measured requests meeting the SLO (0-1)."
    )
    mean_tokens_in: float | None = Field(default=None, description="Mean prompt tokens.")
    mean_tokens_out: float | None = Field(default=None, description="Mean generated tokens.")
    total_tokens_out: int = Field(ge=0, description="Generated tokens (successful requests).")
    max_in_flight: int = Field(ge=0, description="Most requests in flight at once.")
    mean_in_flight: float | None = Field(
        default=None,
        ge=0,
        description="Requests in flight on average over the point's window: the "
        "concurrency the server saw (None in reports written before it existed).",
    )
    send_lag: LatencyStats = Field(description="Actual send minus scheduled send (ms).")
    ttft: LatencyStats = Field(description="Time to first token (ms).")
    tpot: LatencyStats = Field(description="Time per output token after the first (ms).")
    itl: LatencyStats = Field(description="Inter-token (chunk) latency (ms).")
    e2e: LatencyStats = Field(description="End-to-end latency (ms).")
    errors_by_status: dict[str, int] = Field(
        default_factory=dict, description="Failed requests by HTTP status ('none' = no reply)."
    )
    errors_by_type: dict[str, int] = Field(
        default_factory=dict, description="Failed requests by error type."
    )
    error_examples: dict[str, str] = Field(
        default_factory=dict, description="First message seen for each error type."
    )


#: Error statuses whose meaning the report spells out (error type ``http_<status>_<meaning>``).
HTTP_MEANING = {429: "rate_limited", 503: "overloaded"}


def summarize(
    label: str, x: float, records: Sequence[RequestRecord], slo: Slo | None
) -> PointSummary:
    """Summary of one point's records (warm-up excluded)."""
    warm = sum(1 for r in records if r.warmup)
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    if measured:
        begin = min(r.start for r in measured)
        end = max(r.end for r in measured)
        window = max(end - begin, 0.0)
    else:
        window = 0.0
    tokens_out = sum(r.tokens_out or 0 for r in ok)
    tokens_in = sum(r.tokens_in or 0 for r in ok)

    def per_s(n: float) -> float:
        return n / window if window > 0 else 0.0

    goodput = attainment = None
    if slo is not None and not slo.empty:
        good = sum(1 for r in measured if slo.met_by(r))
        goodput = per_s(good)
        attainment = good / len(measured) if measured else 0.0
    by_status: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for r in failed:
        by_status["none" if r.status is None else str(r.status)] += 1
        kind = r.error_type or "client_error"
        if kind == "http_error":
            # 429 (a tenant over its quota) and 503 (the server over capacity) mean
            # different things; the report names them.
            kind = f"http_{r.status}" + (
                f"_{HTTP_MEANING[r.status]}" if r.status in HTTP_MEANING else ""
            )
        by_type[kind] += 1
        examples.setdefault(kind, r.error or "")
    ins = [r.tokens_in for r in ok if r.tokens_in is not None]
    outs = [r.tokens_out for r in ok if r.tokens_out is not None]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    itls = [g for r in ok for g in r.itl]
    return PointSummary(
        label=label,
        x=x,
        requests=len(measured),
        succeeded=len(ok),
        failed=len(failed),
        warmup=warm,
        duration_s=window,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(tokens_out),
        total_throughput=per_s(tokens_out + tokens_in),
        goodput=goodput,
        slo_attainment=attainment,
        mean_tokens_in=float(np.mean(ins)) if ins else None,
        mean_tokens_out=float(np.mean(outs)) if outs else None,
        total_tokens_out=tokens_out,
        max_in_flight=_max_in_flight(measured),
        mean_in_flight=mean_in_flight(measured),
        send_lag=LatencyStats.of([max(r.start - r.scheduled, 0.0) for r in measured]),
        ttft=LatencyStats.of([r.ttft for r in ok if r.ttft is not None]),
        tpot=LatencyStats.of(tpots),
        itl=LatencyStats.of(itls),
        e2e=LatencyStats.of([r.e2e for r in ok if r.e2e is not None]),
        errors_by_status=dict(by_status.most_common()),
        errors_by_type=dict(by_type.most_common()),
        error_examples=examples,
    )


def mean_in_flight(records: Sequence[RequestRecord]) -> float:
    """Requests in flight on average over the window of ``records`` (warm-up excluded):
    their summed latencies over the window, the concurrency the server saw - the batch
    its engine ran, while requests do not queue before it. 0.0 without a window."""
    measured = [r for r in records if not r.warmup]
    if not measured:
        return 0.0
    window = max(r.end for r in measured) - min(r.start for r in measured)
    # fsum: exact, so the simulator's columns (sim.columns) sum to the same float
    return math.fsum(r.end - r.start for r in measured) / window if window > 0 else 0.0


def _max_in_flight(records: Sequence[RequestRecord]) -> int:
    events = sorted(
        [(r.start, 1) for r in records] + [(r.end, -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    best = level = 0
    for _, step in events:
        level += step
        best = max(best, level)
    return best
