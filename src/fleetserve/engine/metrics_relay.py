"""The engine metrics of a ``vllm serve`` beside the replica, recorded on Ray's metrics.

Design note. In the replica, vLLM logs through ``RayPrometheusStatLogger``
(:mod:`fleetserve.engine.ray_stats`): the node's metrics agent exports its series as
``ray_vllm_*``, tagged with the Serve ``ReplicaId``, and the dashboards, the alerts and
``fleetserve top`` read those. A ``frontend: process`` replica's engine logs to its own
server's Prometheus registry instead, behind a Unix socket no Prometheus scrapes. The
replica already reads that ``/metrics`` every second for its routing signals
(:mod:`fleetserve.engine.vllm_process`); :class:`MetricsRelay` takes every ``vllm:``
family of the same text and turns it into what vLLM's Ray logger would have recorded,
under the same name and labels plus ``ReplicaId``, so the exported series are the ones the
in-replica engine gives:

- a gauge: its value, set at every read (so it never ages out of Ray's exposition while
  the server answers, which :mod:`fleetserve.observe.keeper` does for the in-replica one);
- a counter: its increase since the last read (a lower value means the server started
  again, counting from 0);
- a histogram: each bucket's increase, as that many observations inside the bucket. The
  counts are exact. The values are placed at one common position in every finite bucket
  chosen so the observations add up to the increase of ``_sum`` (possible whenever each
  observation really fell in its bucket); the +Inf bucket's take what is left, at least
  its lower bound.

The core (:meth:`MetricsRelay.read`) is pure: text in, :class:`Record` out.
:class:`RaySink` is the shell that records them with ``ray.util.metrics``; each
observation costs what vLLM's own Ray logger pays per observation in the replica.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from fleetserve.observe.metrics import ray_metric_name

log = logging.getLogger(__name__)

#: The families relayed: vLLM's own (the server's process and HTTP series stay there).
PREFIX = "vllm:"

Kind = Literal["gauge", "counter", "histogram"]
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Series:
    """One metric as Ray records it: its name, kind, tag keys (``ReplicaId`` last) and,
    for a histogram, its finite bucket bounds."""

    name: str
    kind: Kind
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


@dataclass(frozen=True)
class Record:
    """What to record for one labelled series: a gauge's value (``value``), a counter's
    increase (``value``) or a histogram's observations (``observations``: value, count)."""

    series: Series
    tags: Labels
    value: float = 0.0
    observations: tuple[tuple[float, int], ...] = ()


def place(
    bounds: tuple[float, ...], increases: tuple[int, ...], sum_increase: float
) -> tuple[tuple[float, int], ...]:
    """Observations for a histogram's bucket increases (module note): ``bounds`` the
    finite upper bounds, ``increases`` one per bucket with the +Inf bucket last."""
    lows = (0.0, *bounds)
    finite = [(lows[i], bounds[i], n) for i, n in enumerate(increases[:-1]) if n > 0]
    beyond = increases[-1]
    low_total = sum(lo * n for lo, _, n in finite)
    span = sum((hi - lo) * n for lo, hi, n in finite)
    if beyond:  # the finite buckets at their middles, the rest beyond the last bound
        t = 0.5
    elif span > 0:
        t = min(1.0, max(1e-9, (sum_increase - low_total) / span))
    else:
        t = 1.0
    out = [(lo + t * (hi - lo), n) for lo, hi, n in finite]
    if beyond:
        rest = sum_increase - sum(v * n for v, n in out)
        out.append((max(lows[-1], rest / beyond), beyond))
    return tuple(out)


class MetricsRelay:
    """Records for each read of a server's ``/metrics`` (module note). Not thread-safe:
    one reader at a time."""

    def __init__(self, replica_id: str = "") -> None:
        self._replica_id = replica_id
        self._series: dict[str, Series] = {}
        self._counters: dict[tuple[str, Labels], float] = {}
        self._histograms: dict[tuple[str, Labels], tuple[tuple[int, ...], float]] = {}
        self._skipped: set[str] = set()

    def read(self, text: str) -> list[Record]:
        """The records of one exposition ``text`` (unparseable text: none)."""
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:
            log.warning("the engine's /metrics could not be parsed; not relayed this time")
            return []
        out: list[Record] = []
        for family in families:
            if not family.name.startswith(PREFIX) or family.name.endswith("_created"):
                continue
            if family.type in ("gauge", "counter"):
                out.extend(self._scalars(family))
            elif family.type == "histogram":
                out.extend(self._histogram(family))
        return out

    # -- per kind -------------------------------------------------------------------------

    def _known(
        self, family: Any, kind: Kind, keys: Iterable[str], bounds: tuple[float, ...]
    ) -> Series | None:
        """The family's series as first seen; None (logged once) when its labels or bounds
        changed since: Ray fixes a metric's tag keys and buckets when it is made."""
        tag_keys = (*sorted(set(keys) - {"ReplicaId"}), "ReplicaId")
        known = self._series.get(family.name)
        if known is None:
            known = Series(
                ray_metric_name(family.name), kind, family.documentation, tag_keys, bounds
            )
            self._series[family.name] = known
        if (known.kind, known.tag_keys, known.boundaries) != (kind, tag_keys, bounds):
            if family.name not in self._skipped:
                self._skipped.add(family.name)
                log.warning("%s changed its labels or buckets; no longer relayed", family.name)
            return None
        return known

    def _tags(self, labels: dict[str, str], series: Series) -> Labels:
        merged = {**labels, "ReplicaId": self._replica_id}
        return tuple((k, merged.get(k, "")) for k in series.tag_keys)

    def _scalars(self, family: Any) -> list[Record]:
        kind: Kind = "counter" if family.type == "counter" else "gauge"
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        if not samples:  # labelled, no child yet: its labels are not known until one is
            return []
        keys = {k for s in samples for k in s.labels}
        series = self._known(family, kind, keys, ())
        if series is None:
            return []
        out = []
        for s in samples:
            tags = self._tags(s.labels, series)
            value = float(s.value)
            if kind == "gauge":
                out.append(Record(series, tags, value))
                continue
            last = self._counters.get((family.name, tags), 0.0)
            self._counters[(family.name, tags)] = value
            increase = value - last if value >= last else value  # restarted: from 0
            if increase > 0:
                out.append(Record(series, tags, increase))
        return out

    def _histogram(self, family: Any) -> list[Record]:
        buckets: dict[Labels, dict[float, float]] = {}
        sums: dict[Labels, float] = {}
        plain: dict[Labels, dict[str, str]] = {}
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            key = tuple(sorted(labels.items()))
            plain[key] = labels
            if s.name.endswith("_bucket"):
                buckets.setdefault(key, {})[float(s.labels["le"])] = float(s.value)
            elif s.name.endswith("_sum"):
                sums[key] = float(s.value)
        if not buckets:
            return []
        bounds = tuple(
            sorted({b for per in buckets.values() for b in per if math.isfinite(b) and b > 0})
        )
        series = self._known(family, "histogram", {k for p in plain.values() for k in p}, bounds)
        if series is None or not bounds:  # Ray makes no histogram without a finite bound
            return []
        out = []
        for key, per in buckets.items():
            # cumulative counts at each bound (+Inf last), then per bucket
            cumulative = (*(per.get(b, 0.0) for b in bounds), per.get(math.inf, 0.0))
            counts = tuple(
                round(c - (cumulative[i - 1] if i else 0.0)) for i, c in enumerate(cumulative)
            )
            total = sums.get(key, 0.0)
            tags = self._tags(plain[key], series)
            last_counts, last_sum = self._histograms.get((family.name, tags), ((), 0.0))
            self._histograms[(family.name, tags)] = (counts, total)
            if len(last_counts) == len(counts) and all(
                c >= p for c, p in zip(counts, last_counts, strict=True)
            ):
                increases = tuple(c - p for c, p in zip(counts, last_counts, strict=True))
                grown = total - last_sum
            else:  # first read, or the server started again: all of it is new
                increases, grown = counts, total
            if any(increases):
                out.append(Record(series, tags, observations=place(bounds, increases, grown)))
        return out


class RaySink:
    """Records :class:`Record` values with ``ray.util.metrics`` (the metrics made once per
    series). A failing record is logged once per series, never raised: metrics must not
    take the replica down."""

    def __init__(self) -> None:
        self._metrics: dict[str, Any] = {}
        self._failed: set[str] = set()

    def apply(self, records: Iterable[Record]) -> None:
        for record in records:
            try:
                self._apply(record)
            except Exception:
                if record.series.name not in self._failed:
                    self._failed.add(record.series.name)
                    log.warning("cannot record %s on Ray's metrics", record.series.name)

    def _apply(self, record: Record) -> None:
        series = record.series
        metric: Any = self._metrics.get(series.name)
        if metric is None:
            from ray.util import metrics  # noqa: PLC0415 - only inside Ray

            if series.kind == "gauge":
                metric = metrics.Gauge(series.name, series.description, series.tag_keys)
            elif series.kind == "counter":
                metric = metrics.Counter(series.name, series.description, series.tag_keys)
            else:
                metric = metrics.Histogram(
                    series.name, series.description, list(series.boundaries), series.tag_keys
                )
            self._metrics[series.name] = metric
        tags = dict(record.tags)
        if series.kind == "gauge":
            metric.set(record.value, tags=tags)
        elif series.kind == "counter":
            metric.inc(record.value, tags=tags)
        else:
            for value, count in record.observations:
                for _ in range(count):
                    metric.observe(value, tags=tags)
