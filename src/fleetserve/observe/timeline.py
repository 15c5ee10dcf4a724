"""Per-request timelines of the serving path, for finding where a request's latency goes.

Design note. A benchmark that says fleetserve's TTFT is 5 ms or 400 ms behind `vllm serve`
says nothing about where the time went: HTTP in the ingress, the gateway, Serve's router,
the gRPC hop, vLLM's app in the replica, the engine's queue, the relay back. With
``FLEETSERVE_TIMELINE_DIR`` set in the environment ``fleetserve serve`` starts in (Ray's
workers inherit it), every process on the path appends one line per point a request
passes - ``<relay stream id> <point> <CLOCK_MONOTONIC ns>`` - to ``timeline-<pid>.tsv`` in
that directory. CLOCK_MONOTONIC is one clock for every process of a Linux host, and the
one ``time.perf_counter`` reads, so the ingress's, the replica's and vLLM's benchmark
client's timestamps line up (``benchmarks/gpu/timeline.py`` joins them). The relay stream
id names a request in the ingress and in its replica alike (one ingress process per run).

What must stay true: off (the variable unset, which is how users run) a point costs one
attribute read and does nothing else; on, a point appends a line to a list under a lock,
and a daemon thread writes the list out every :data:`FLUSH_S` (and at interpreter exit),
so the event loop never waits on a write. A process killed hard loses its last second.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import threading
import time
from pathlib import Path

#: The environment variable that turns timelines on: the directory they go to.
ENV = "FLEETSERVE_TIMELINE_DIR"
#: How often a process's points are written out (one write per process per second; Ray's
#: workers are stopped by signals that skip ``atexit``).
FLUSH_S = 1.0


class Timeline:
    """One process's timeline writer (``enabled`` False: every call returns at once)."""

    def __init__(self, directory: str | None) -> None:
        self.enabled = bool(directory)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._path = Path(directory) / f"timeline-{os.getpid()}.tsv" if directory else None

    def point(self, stream: int, name: str, ns: int | None = None) -> None:
        """Note that request ``stream`` passed ``name`` now (or at ``ns``)."""
        if not self.enabled:
            return
        line = f"{stream}\t{name}\t{time.monotonic_ns() if ns is None else ns}\n"
        with self._lock:
            self._lines.append(line)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_on, name="timeline", daemon=True)
                self._writer.start()
                atexit.register(self.flush)

    def _write_on(self) -> None:
        while self.enabled:
            time.sleep(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if not lines or self._path is None:
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with self._path.open("a") as f:
                f.writelines(lines)
        except OSError:
            self.enabled = False  # a diagnostic never breaks serving


#: This process's timeline, configured from the environment once.
TIMELINE = Timeline(os.environ.get(ENV))

#: When the ingress received the request being handled (ns), for the point written once
#: the request has a stream id.
RECEIVED_NS: contextvars.ContextVar[int] = contextvars.ContextVar("fleetserve_received_ns")
