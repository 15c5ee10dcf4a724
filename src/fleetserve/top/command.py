"""``fleetserve top``: a live terminal view of a running fleet, refreshed in place.

Reads a Ray metrics endpoint (``--metrics``, what ``fleetserve serve --metrics-export-port``
or KubeRay's port 8080 expose) or a Prometheus server (``--prometheus``), every
``--interval`` seconds, and redraws one screen (rich's Live on the alternate screen: no
scrolling, no flicker). ``q`` or Ctrl-C quits and restores the terminal. ``--once`` prints a
single frame (two samples ``--interval`` apart) and exits - for scripts and pipes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.live import Live

from fleetserve.errors import MetricsSourceError, UsageError
from fleetserve.observe.command import parse_selector
from fleetserve.top.model import Snapshot, build_view
from fleetserve.top.source import ExpositionSource, MetricsSource, PrometheusSource
from fleetserve.top.view import render

DEFAULT_METRICS = "http://127.0.0.1:8080/metrics"


def _metrics_url(value: str) -> str:
    url = value if "://" in value else f"http://{value}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def _source(args: argparse.Namespace) -> MetricsSource:
    if args.prometheus and args.metrics:
        raise UsageError("give --metrics or --prometheus, not both")
    if args.interval <= 0 or args.interval > 3600:
        raise UsageError(f"--interval {args.interval:g}: expected 0 < seconds <= 3600")
    if args.prometheus:
        url = args.prometheus if "://" in args.prometheus else f"http://{args.prometheus}"
        return PrometheusSource(url, parse_selector(args.selector) or None)
    if args.selector:
        raise UsageError("--selector applies to --prometheus only")
    return ExpositionSource(_metrics_url(args.metrics or DEFAULT_METRICS))


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """stdin in cbreak mode (keys without Enter, no echo) while inside; restored after."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios  # noqa: PLC0415 - POSIX terminals only
    import tty  # noqa: PLC0415

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_for_quit(fd: Any, seconds: float) -> bool:
    """Wait ``seconds``; True when the user pressed q."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if fd is None:
            time.sleep(left)
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 32).lower().startswith(b"q"):
            return True
    return False


def _fetch(source: MetricsSource) -> tuple[Snapshot | None, str]:
    try:
        return source.fetch(), ""
    except MetricsSourceError as e:
        return None, str(e)


def _handle(args: argparse.Namespace) -> int:
    source = _source(args)
    console = Console()
    if args.once:
        first = source.fetch()
        time.sleep(args.interval)
        console.print(render(build_view(first, source.fetch()), source.description))
        return 0
    prev: Snapshot | None = None
    cur, status = _fetch(source)
    with (
        _keys() as fd,
        Live(
            render(build_view(None, cur or Snapshot(0.0, ())), source.description, status),
            console=console,
            screen=True,
            auto_refresh=False,
            transient=True,
        ) as live,
        contextlib.suppress(KeyboardInterrupt),
    ):
        while not _wait_for_quit(fd, args.interval):
            snapshot, status = _fetch(source)
            if snapshot is not None:
                prev, cur = cur, snapshot
            view = build_view(prev, cur or Snapshot(0.0, ()))
            live.update(render(view, source.description, status), refresh=True)
    return 0


def register(subparsers: Any) -> None:
    """Add ``top`` to the CLI."""
    parser = subparsers.add_parser(
        "top",
        help="live view of a running fleet: models, replicas, tenants",
        description=__doc__,
    )
    parser.add_argument(
        "--metrics",
        metavar="URL",
        help=f"a Ray metrics endpoint, HOST:PORT or URL (default {DEFAULT_METRICS}; "
        "fleetserve serve --metrics-export-port PORT)",
    )
    parser.add_argument("--prometheus", metavar="URL", help="read a Prometheus server instead")
    parser.add_argument(
        "--selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="with --prometheus: only series with this label (repeatable), e.g. namespace=llm",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between refreshes (default 2)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.set_defaults(handler=_handle)
