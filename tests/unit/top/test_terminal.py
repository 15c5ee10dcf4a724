"""``fleetserve top`` in a real terminal (tmux): refreshes in place, quits on q and Ctrl-C.

A local HTTP server plays a Ray metrics endpoint whose counters grow on every scrape; the
command runs in a detached tmux pane (its own tmux server socket), the pane is captured,
and keys are sent as a user would type them.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(TMUX is None, reason="tmux not installed (.ci/run installs it)"),
]


@pytest.fixture
def metrics_url(ray_exposition: Callable[..., str]) -> Iterator[str]:
    scrapes = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            scrapes["n"] += 1
            body = ray_exposition(scrapes["n"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


class Pane:
    """One tmux session on a private server socket."""

    def __init__(self, socket: str, name: str) -> None:
        self.base = [str(TMUX), "-L", socket]
        self.name = name

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            [*self.base, *args], capture_output=True, text=True, timeout=20, check=False
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def history(self) -> str:
        return self.tmux("capture-pane", "-p", "-S", "-1000", "-t", self.name)


def _rows(screen: str) -> dict[str, list[str]]:
    """Table rows of a captured frame by their first cell (cells stripped)."""
    rows: dict[str, list[str]] = {}
    for line in screen.splitlines():
        cells = [c.strip() for c in line.split("\u2502")]
        if len(cells) > 2 and cells[1]:
            rows.setdefault(cells[1], cells[1:])
    return rows


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


Start = Callable[[str, str], tuple["Pane", Path]]


@pytest.fixture
def pane_factory(tmp_path: Path) -> Iterator[Start]:
    socket = f"fleetserve-top-{tmp_path.name}"

    def start(url: str, name: str) -> tuple[Pane, Path]:
        exit_file = tmp_path / f"{name}.exit"
        command = (
            f"{sys.executable} -m fleetserve.cli top --metrics {url} --interval 0.5; "
            f"echo $? > {exit_file}; sleep 30"
        )
        pane = Pane(socket, name)
        pane.tmux("new-session", "-d", "-s", name, "-x", "150", "-y", "45", command)
        return pane, exit_file

    yield start
    with contextlib.suppress(subprocess.SubprocessError):
        subprocess.run([str(TMUX), "-L", socket, "kill-server"], timeout=20, check=False)


def test_top_refreshes_in_place_and_quits_on_q(metrics_url: str, pane_factory: Start) -> None:
    pane, exit_file = pane_factory(metrics_url, "q")
    # Rates need two samples: wait for a frame with the interval in its header.
    _wait("a full frame", lambda: "last 0.5 s" in pane.screen() or "last 0." in pane.screen())
    screen = pane.screen()
    assert "models and replicas" in screen
    assert "overload" in screen
    # The columns an operator reads carry numbers, not "-": per model and replica the
    # KV-cache usage and TTFT p50/p99, per tenant requests/s, tokens/s and rejections/s.
    rows = _rows(screen)
    alpha, r1, r2, team_a = rows["alpha"], rows["r1"], rows["r2"], rows["team-a"]
    # model / replica, state, in flight, queued, tokens/s, TTFT p50, TTFT p99, KV cache, 5xx/s
    assert (r1[7], r2[7], alpha[7]) == ("25%", "50%", "50%"), screen
    for row in (alpha, r1, r2):
        p50, p99 = float(row[5]), float(row[6])
        assert 0 < p50 <= p99, screen
    assert float(alpha[4]) > 0, screen
    # tenant, requests/s, tokens/s, rejections/s, by reason
    assert all(float(cell) > 0 for cell in team_a[1:4]), screen
    # In place: one frame on the (alternate) screen, nothing scrolled into history.
    time.sleep(1.5)
    assert pane.screen().count("fleetserve top") == 1
    assert pane.history().count("fleetserve top") == 1
    pane.tmux("send-keys", "-t", "q", "q")
    _wait("top to exit on q", exit_file.exists, 20)
    assert exit_file.read_text().strip() == "0"
    # The terminal is restored: the frame is gone from the normal screen.
    assert "models and replicas" not in pane.screen()


def test_top_quits_on_ctrl_c(metrics_url: str, pane_factory: Start) -> None:
    pane, exit_file = pane_factory(metrics_url, "c")
    _wait("a frame", lambda: "models and replicas" in pane.screen())
    pane.tmux("send-keys", "-t", "c", "C-c")
    _wait("top to exit on Ctrl-C", exit_file.exists, 20)
    assert exit_file.read_text().strip() == "0"
