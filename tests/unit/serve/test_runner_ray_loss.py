"""A server whose own Ray loses its raylet or GCS stops instead of serving nothing.

Ray's node object is replaced by one holding real child processes (Ray keeps its raylet
and GCS as ``subprocess.Popen`` objects): a SIGKILLed one is a real zombie until polled,
as a SIGKILLed raylet is under ``fleetserve serve``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray import serve
from ray._private import worker

from fleetserve.errors import ServeError
from fleetserve.serve.control.runner import FleetServer, ServeOptions
from fleetserve.spec import default_fleet


class Node:
    """Ray's node, as far as the runner uses it: its processes and ``dead_processes``."""

    def __init__(self) -> None:
        self.processes = {
            kind: subprocess.Popen(["sleep", "600"])
            for kind in ("raylet", "gcs_server", "log_monitor")
        }

    def dead_processes(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        return [(k, p) for k, p in self.processes.items() if p.poll() is not None]

    def kill(self, kind: str) -> None:
        os.kill(self.processes[kind].pid, signal.SIGKILL)
        time.sleep(0.2)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    n = Node()
    monkeypatch.setattr(worker, "_global_node", n)
    yield n
    for p in n.processes.values():
        p.kill()
        p.wait(10)


def started_server(*, running: bool = True) -> FleetServer:
    """A server that started Ray and deployed its application (``running``: which ran)."""
    server = FleetServer(ServeOptions(spec=default_fleet(), host="127.0.0.1", port=8000))
    server._started_ray = True
    server._deployed = True
    if running:
        server._ingress = object()  # taken when the application first runs
    return server


def zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"


@pytest.mark.timeout(60)  # without the check, wait() never returns
def test_a_dead_raylet_ends_the_wait_and_is_reaped(node: Node) -> None:
    server = started_server()
    node.kill("raylet")
    pid = node.processes["raylet"].pid
    assert zombie(pid)  # what Ray's workers take for a live raylet
    with pytest.raises(ServeError, match="raylet exited unexpectedly"):
        server.wait()
    assert not os.path.exists(f"/proc/{pid}")  # reaped: the workers can see it is gone


def test_a_dead_helper_process_does_not_stop_the_server(node: Node) -> None:
    server = started_server()
    node.kill("log_monitor")
    assert server._dead_ray_processes() == []


@pytest.fixture
def stop_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What a stop calls, in order, of the drain, Serve's shutdown and Ray's (recorded, not
    run)."""
    calls: list[str] = []

    def record(name: str) -> Any:
        return lambda *_a, **_k: calls.append(name)

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", record("ray.shutdown"))
    monkeypatch.setattr(serve, "shutdown", record("serve.shutdown"))
    monkeypatch.setattr(FleetServer, "_drain", record("drain"))
    return calls


def quiet(server: FleetServer) -> FleetServer:
    server.console = types.SimpleNamespace(print=lambda *_a, **_k: None)  # type: ignore[assignment]
    return server


def test_stop_after_losing_ray_skips_the_drain_and_serves_shutdown(
    node: Node, stop_calls: list[str]
) -> None:
    calls = stop_calls
    server = quiet(started_server())
    server.stop(drain=True)
    assert calls == ["drain", "serve.shutdown", "ray.shutdown"]  # Ray alive: the full stop
    calls.clear()
    node.kill("gcs_server")
    server.stop(drain=True)
    # serve.shutdown() and the drain would wait on the dead GCS forever.
    assert calls == ["ray.shutdown"]


def test_stop_before_the_application_ran_leaves_the_replicas_to_rays_stop(
    node: Node, stop_calls: list[str]
) -> None:
    # Ctrl-C while an engine loads: serve.shutdown() waited 30 s for the replica still in
    # its constructor ("Controller failed to shut down within 30.0s"), 36 s in all
    quiet(started_server(running=False)).stop(drain=True)
    assert stop_calls == ["ray.shutdown"]
