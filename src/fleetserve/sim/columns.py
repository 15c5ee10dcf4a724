"""Finished requests kept as columns, and a load point's summary computed from them.

Design note. A fleet-hour finishes tens of millions of requests. Keeping each one as a
:class:`~fleetserve.sim.engine.SimRequest` until the end (hundreds of bytes apiece) and
then building a :class:`~fleetserve.bench.record.RequestRecord` per request for
:func:`fleetserve.bench.metrics.summarize` costs more than simulating it. When a run keeps
no records (the reports then hold only summaries, :data:`fleetserve.sim.run.RECORDS_LIMIT`),
each finished request is appended as a handful of numbers to typed arrays instead (tens of
bytes), and :func:`summarize_columns` computes the same :class:`PointSummary` with numpy,
once per point: the same definitions (bench's, restated in :mod:`fleetserve.bench.metrics`),
the same order of values (by request id, as the record path sorts them) so that every
float sums and rounds identically - tests/unit/sim checks it field by field against
``summarize`` of the records. Inter-token gaps are not columns: runs without records keep
none (``keep_itl`` is off with them).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter

import numpy as np

from fleetserve.bench.metrics import HTTP_MEANING, LatencyStats, PointSummary
from fleetserve.sim.engine import REJECTED, TIMEOUT, SimRequest

#: HTTP status of a rejected request (the ingress answers 503 when a model is full).
REJECTED_STATUS = 503


def failure_status(failed: str) -> int | None:
    """The HTTP status of a simulated failure (None: no response)."""
    return REJECTED_STATUS if failed == REJECTED else None


def failure_type(failed: str) -> str:
    """The error type a failed simulated request's record carries."""
    return failed or TIMEOUT


def failure_message(failed: str) -> str:
    """The error text a failed simulated request's record carries."""
    return f"simulated: {failure_type(failed)}"


class FinishedColumns:
    """A stream's finished requests, one typed array per field the summary reads."""

    __slots__ = (
        "_codes",
        "arrival",
        "done",
        "end",
        "failed",
        "first",
        "ids",
        "names",
        "prompt",
        "scheduled",
    )

    def __init__(self) -> None:
        self.ids = array("q")
        self.arrival = array("d")
        self.scheduled = array("d")
        self.first = array("d")
        self.end = array("d")
        self.prompt = array("q")
        self.done = array("q")
        self.failed = array("b")
        """The request's ``failed`` as its index in :attr:`names` (0: none); a warm-up
        request's as ``-1 - index``."""
        self.names: list[str] = [""]
        self._codes: dict[str, int] = {"": 0}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, r: SimRequest) -> None:
        self.ids.append(r.id)
        self.arrival.append(r.arrival)
        self.scheduled.append(r.scheduled)
        self.first.append(r.first)
        self.end.append(r.end)
        self.prompt.append(r.prompt)
        self.done.append(r.done)
        code = self._codes.get(r.failed)
        if code is None:  # a handful of distinct values: "", rejected, timeout
            code = self._codes[r.failed] = len(self.names)
            self.names.append(r.failed)
        self.failed.append(-1 - code if r.warmup else code)


def summarize_columns(label: str, x: float, cols: FinishedColumns) -> PointSummary:
    """``summarize(label, x, [to_record(r) ...], None)`` of the requests in ``cols``
    (see the module note; no SLO, no inter-token gaps)."""
    order = np.argsort(np.frombuffer(cols.ids, dtype=np.int64), kind="stable")
    code = np.frombuffer(cols.failed, dtype=np.int8)[order].astype(np.int64)
    warm = code < 0
    code = np.where(warm, -1 - code, code)
    start = np.frombuffer(cols.arrival, dtype=np.float64)[order]
    scheduled = np.frombuffer(cols.scheduled, dtype=np.float64)[order]
    first = np.frombuffer(cols.first, dtype=np.float64)[order]
    end = np.frombuffer(cols.end, dtype=np.float64)[order]
    tokens_in = np.frombuffer(cols.prompt, dtype=np.int64)[order]
    tokens_out = np.frombuffer(cols.done, dtype=np.int64)[order]

    measured = ~warm
    ok = measured & (code == 0) & (first >= 0)
    failed = measured & ~ok
    # A record's e2e: max(end - start, 0) when the request ended, else none; its end is
    # start + (e2e or 0).
    ended = end >= 0
    e2e = np.where(ended, np.maximum(end - start, 0.0), 0.0)
    rec_end = start + e2e
    if measured.any():
        window = max(float(rec_end[measured].max()) - float(start[measured].min()), 0.0)
    else:
        window = 0.0
    out_ok = tokens_out[ok]
    in_ok = tokens_in[ok]
    n_out = int(out_ok.sum())
    n_in = int(in_ok.sum())

    def per_s(n: float) -> float:
        return n / window if window > 0 else 0.0

    by_status: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    examples: dict[str, str] = {}
    failed_codes = code[failed]
    if failed_codes.size:
        # Counters fill in order of first occurrence (most_common breaks ties by it).
        seen, first_at, counts = np.unique(failed_codes, return_index=True, return_counts=True)
        for i in np.argsort(first_at, kind="stable"):
            name = cols.names[int(seen[i])]
            status = failure_status(name)
            kind = failure_type(name)
            if kind == REJECTED:
                kind = f"http_{status}" + (
                    f"_{HTTP_MEANING[status]}" if status in HTTP_MEANING else ""
                )
            by_status["none" if status is None else str(status)] += int(counts[i])
            by_type[kind] += int(counts[i])
            examples.setdefault(kind, failure_message(name))
    ttft = first[ok] - start[ok]
    e2e_ok = e2e[ok & ended]
    many = ok & ended & (tokens_out >= 2)
    tpot = (e2e[many] - (first[many] - start[many])) / (tokens_out[many] - 1)
    return PointSummary(
        label=label,
        x=x,
        requests=int(measured.sum()),
        succeeded=int(ok.sum()),
        failed=int(failed.sum()),
        warmup=int(warm.sum()),
        duration_s=window,
        request_throughput=per_s(int(ok.sum())),
        output_throughput=per_s(n_out),
        total_throughput=per_s(n_out + n_in),
        goodput=None,
        slo_attainment=None,
        mean_tokens_in=float(np.mean(in_ok)) if in_ok.size else None,
        mean_tokens_out=float(np.mean(out_ok)) if out_ok.size else None,
        total_tokens_out=n_out,
        max_in_flight=_max_in_flight(start[measured], rec_end[measured]),
        # as bench.metrics.mean_in_flight sums the records: the same floats, exactly
        mean_in_flight=(
            math.fsum((rec_end[measured] - start[measured]).tolist()) / window
            if window > 0
            else 0.0
        ),
        send_lag=LatencyStats.of(np.maximum(start[measured] - scheduled[measured], 0.0)),
        ttft=LatencyStats.of(ttft),
        tpot=LatencyStats.of(tpot),
        itl=LatencyStats.of([]),
        e2e=LatencyStats.of(e2e_ok),
        errors_by_status=dict(by_status.most_common()),
        errors_by_type=dict(by_type.most_common()),
        error_examples=examples,
    )


def _max_in_flight(start: np.ndarray, end: np.ndarray) -> int:
    """Most requests between their start and end at once (an end at the same moment as a
    start counts first, as ``bench.metrics`` sorts them)."""
    if not start.size:
        return 0
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones(start.size, np.int64), -np.ones(end.size, np.int64)])
    level = np.cumsum(steps[np.lexsort((steps, times))])
    return max(0, int(level.max()))
