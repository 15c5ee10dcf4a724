"""Gauges that stay exported while their process lives.

Why this exists. Ray's metrics path (core worker -> metrics agent -> Prometheus exposition)
exports a gauge value after it is set and then forgets it: the agent evicts a gauge series
that has not been reported again within two report intervals (``_gauge_metric_ttl_s`` in
``ray._private.telemetry.open_telemetry_metric_recorder``). Measured with Ray 2.60 here: a
gauge set once leaves the exposition about 30 s later, a counter incremented once stays.
Whoever sets a gauge only when its value changes - vLLM's stat logger after each engine step
(running/waiting requests, KV-cache usage), the gateway's in-flight count - loses the series
as soon as the fleet goes idle, which is exactly when "0 running, KV cache empty" is the
answer a dashboard should show (Prometheus then marks the series stale: panels go blank,
``fleetserve top`` shows "-").

:class:`GaugeKeeper` remembers the last value of each (gauge, tag set) it was asked to set
and sets it again every :data:`REFRESH_S` from one daemon thread per process, so a series
lives exactly as long as the process that owns it (a dead replica's series still age out).

What must stay true: a refresh never changes a value (it replays the last one, under the same
lock as :meth:`GaugeKeeper.set`, so it cannot overwrite a newer value with an older one), and
it never raises into the caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Protocol

log = logging.getLogger(__name__)

#: Seconds between replays: half of Ray's default metrics report interval (10 s), so each
#: report carries a fresh value even when one replay is late.
REFRESH_S = 5.0


class Gauge(Protocol):
    """What :class:`GaugeKeeper` needs of a gauge (``ray.util.metrics.Gauge``'s ``set``)."""

    def set(self, value: float, tags: dict[str, str]) -> None: ...


_Key = tuple[int, tuple[tuple[str, str], ...]]


class GaugeKeeper:
    """Sets gauges and replays their last values every ``period_s`` (see module doc)."""

    def __init__(self, period_s: float = REFRESH_S, background: bool = True) -> None:
        self._period_s = period_s
        self._background = background
        self._lock = threading.Lock()
        self._last: dict[_Key, tuple[Gauge, dict[str, str], float]] = {}
        self._thread: threading.Thread | None = None

    def set(self, gauge: Gauge, value: float, tags: Mapping[str, str]) -> None:
        """``gauge.set(value, tags=tags)``, remembered for replays (errors propagate)."""
        tag_dict = dict(tags)
        key = (id(gauge), tuple(sorted(tag_dict.items())))
        with self._lock:
            gauge.set(value, tags=tag_dict)
            self._last[key] = (gauge, tag_dict, value)
            if self._background and self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="fleetserve-gauge-keeper", daemon=True
                )
                self._thread.start()

    def refresh(self) -> int:
        """Set every remembered gauge to its last value again; returns how many."""
        with self._lock:
            for gauge, tags, value in self._last.values():
                try:
                    gauge.set(value, tags=tags)
                except Exception:  # a failing metric loses a refresh, never the thread
                    log.debug("gauge refresh failed", exc_info=True)
            return len(self._last)

    def last_values(self) -> list[tuple[dict[str, str], float]]:
        """(tags, value) of every remembered gauge series, in the order first set."""
        with self._lock:
            return [(dict(tags), value) for _gauge, tags, value in self._last.values()]

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(self._period_s):
            self.refresh()


#: The process's keeper (one thread per process, started by the first ``set``).
KEEPER = GaugeKeeper()
