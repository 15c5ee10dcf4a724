"""`fleetserve serve` through real Ray Serve with the fake engine: routing and tenants across
two model deployments, and SIGTERM draining in-flight streams before exiting 0 - after
which no engine process (the fake engine's cores), watchdog or Ray process of the server is
left (the SIGTERM-to-the-server case of test_serve_chaos.py's stop paths)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.engine.fake_engine import FAKE_CORE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = """
models:
  - name: open-model
    source: fake
    max_model_len: 512
    resources: {cpu: 0.5}
  - name: b-model
    source: fake
    tenant: team-b
    max_model_len: 512
    resources: {cpu: 0.5}
tenants:
  - name: team-a
    api_keys: ["${FS_TEST_KEY_A}"]
  - name: team-b
    api_keys: ["${FS_TEST_KEY_B}"]
server:
  drain_timeout_s: 60
"""
ENV = {"FS_TEST_KEY_A": "sk-test-a", "FS_TEST_KEY_B": "sk-test-b"}
A = {"Authorization": "Bearer sk-test-a"}
B = {"Authorization": "Bearer sk-test-b"}


class FakeFleet:
    def __init__(self, server: Any, url: str, mark: str, servers: Any) -> None:
        self.server = server
        self.url = url
        self.mark = mark
        self.servers = servers

    def processes(self) -> dict[int, str]:
        """PID -> command line of every live process of this server."""
        processes: dict[int, str] = self.servers.marked_processes(self.mark)
        return processes

    def engines(self) -> list[int]:
        """The fake engine cores of this server."""
        core = FAKE_CORE.splitlines()[0]
        return [pid for pid, cmd in self.processes().items() if core in cmd]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, servers: Any) -> Iterator[FakeFleet]:
    tmp = tmp_path_factory.mktemp("fake-fleet")
    mark = uuid.uuid4().hex[:12]
    env = {**ENV, servers.mark_var: mark}
    started = servers.start_fleetserve(tmp, SPEC, "fake engine", fake_token_delay=0.05, env=env)
    f = FakeFleet(started.server, started.url, mark, servers)
    yield f
    started.server.stop()
    for pid in f.processes():  # only if the test failed before its process check
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def chat(model: str, max_tokens: int = 2) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }


def test_routes_to_each_model_deployment_with_tenant_rules(fleet: FakeFleet) -> None:
    url = f"{fleet.url}/v1/chat/completions"
    assert httpx.post(url, json=chat("open-model")).status_code == 401
    ok_a = httpx.post(url, json=chat("open-model"), headers=A, timeout=30)
    assert ok_a.status_code == 200
    assert ok_a.json()["model"] == "open-model"
    hidden = httpx.post(url, json=chat("b-model"), headers=A, timeout=30)
    assert hidden.status_code == 404
    assert hidden.json()["error"]["message"] == "The model `b-model` does not exist."
    ok_b = httpx.post(url, json=chat("b-model"), headers=B, timeout=30)
    assert ok_b.status_code == 200
    assert ok_b.json()["model"] == "b-model"
    listed = httpx.get(f"{fleet.url}/v1/models", headers=B, timeout=30).json()
    assert sorted(m["id"] for m in listed["data"]) == ["b-model", "open-model"]


def test_sigterm_drains_in_flight_streams_then_exits_zero(fleet: FakeFleet) -> None:
    """Runs last in this module: it stops the module's fleet."""
    body = {**chat("open-model", max_tokens=80), "stream": True}
    events: list[str] = []
    first = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with httpx.stream(
                "POST", f"{fleet.url}/v1/chat/completions", json=body, headers=A, timeout=120
            ) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first.set()
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)
            first.set()

    # One engine core per model, each guarded by its watchdog (engine/reaper.py).
    assert len(fleet.engines()) == 2, fleet.processes()
    assert len(fleet.servers.reapers(fleet.processes())) == 2, fleet.processes()
    reader = threading.Thread(target=consume)
    reader.start()
    assert first.wait(60)
    fleet.server.proc.send_signal(signal.SIGTERM)

    # While draining, new requests are refused with 503 + Retry-After.
    refused = None
    deadline = time.monotonic() + 30
    while refused is None and time.monotonic() < deadline and reader.is_alive():
        r = httpx.post(
            f"{fleet.url}/v1/chat/completions", json=chat("open-model"), headers=A, timeout=30
        )
        if r.status_code == 503:
            refused = r
        time.sleep(0.2)
    reader.join(120)
    assert not errors, errors
    assert refused is not None, "no request was refused while draining"
    assert "retry-after" in refused.headers
    # The in-flight stream ran to its end.
    assert events[-1] == "[DONE]"
    tokens = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in tokens if c["choices"])
    assert text.split() == [f"tok{i}" for i in range(80)]
    assert fleet.server.proc.wait(120) == 0
    log = Path(fleet.server.log).read_text()
    # At least the stream; the probe loop above may have one more request in flight.
    assert re.search(r"draining [12] in-flight requests? \(up to", log), log
    assert "fleetserve: stopped" in log
    # Nothing of the server is left: no engine core, watchdog, replica or other Ray process.
    # Generous waits (a loaded 2-core host); the outcome is what is asserted.
    deadline = time.monotonic() + 90
    while fleet.processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not fleet.engines(), fleet.processes()
    assert not fleet.processes()
