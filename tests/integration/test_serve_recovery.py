"""Recovery of Serve's control plane and of the ingress, on real Ray (fake engine) with
direct ingress - the default, where the ingress replica itself listens on the port.

* The Serve controller killed under load: requests keep being served by the replicas
  already running (Serve's handles route on their cached tables) and readiness holds.
* The ingress replica killed under load: until its replacement listens, connections are
  refused at once (never a hang), then requests succeed again - and the tenant's quota
  counters, kept in the ``quota`` deployment, are the same.

Every process of a test server carries a marker in its environment (Ray's workers
inherit the environment of the process that starts Ray), which is how they are found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from .conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KEY = "sk-recovery"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: A second tenant, with a daily token budget that never binds: its counter is checked
#: across the ingress restart (only its own requests move it; the load is the other's).
COUNTED = {"Authorization": "Bearer sk-counted"}
DAY_TOKENS = 10_000_000
SPEC = f"""
models:
  - name: m
    source: fake
    max_model_len: 4096
    resources: {{cpu: 0.5}}
tenants:
  - name: t
    api_keys: ["${{FS_RECOVERY_KEY}}"]
  - name: u
    api_keys: ["${{FS_RECOVERY_COUNTED}}"]
    quota: {{tokens_per_day: {DAY_TOKENS}}}
server:
  drain_timeout_s: 5
"""


class Fleet:
    def __init__(
        self, server: Any, url: str, mark: str, marked: Callable[[str], dict[int, str]]
    ) -> None:
        self.server = server
        self.url = url
        self.mark = mark
        self._marked = marked  # servers.marked_processes

    def processes(self) -> dict[int, str]:
        """PID -> command line of every live process of this server."""
        return self._marked(self.mark)

    def find(self, text: str) -> list[int]:
        return [pid for pid, cmd in self.processes().items() if text in cmd]

    def post(self, timeout: float = 30, headers: dict[str, str] = AUTH) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/chat/completions", json=chat(2), headers=headers, timeout=timeout
        )

    def kill_everything(self) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        **extra,
    }


@dataclass
class Outcome:
    status: int | None  # None: no HTTP answer (connection error)
    complete: bool  # a 200 stream that ended with [DONE] and no error event
    detail: str


class Load:
    """Clients streaming completions in a loop, each outcome recorded."""

    def __init__(self, fleet: Fleet, clients: int = 3) -> None:
        self.fleet = fleet
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _client(self) -> None:
        while not self._stop.is_set():
            outcome = self._one()
            self.outcomes.append(outcome)
            if outcome.status is None:
                time.sleep(0.1)  # refused while the ingress is away: no busy loop

    def _one(self) -> Outcome:
        try:
            with httpx.stream(
                "POST",
                f"{self.fleet.url}/v1/chat/completions",
                json=chat(20, stream=True),
                headers=AUTH,
                timeout=60,
            ) as r:
                if r.status_code != 200:
                    r.read()
                    return Outcome(r.status_code, False, r.text[:300])
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as e:
            return Outcome(None, False, f"{type(e).__name__}: {e}")
        ok = len(events) >= 2 and events[-1] == "[DONE]" and '"error"' not in events[-2]
        return Outcome(200, ok, "" if ok else str(events[-2:]))

    def served(self) -> int:
        return sum(1 for o in self.outcomes if o.complete)

    def wait_served(self, more: int, timeout_s: float) -> None:
        target = self.served() + more
        wait_until(lambda: self.served() >= target, timeout_s, f"{more} more streams served")


def day_tokens_used(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return DAY_TOKENS - int(r.headers["x-ratelimit-remaining-tokens"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, servers: Any) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("recovery")
    mark = uuid.uuid4().hex[:12]
    env = {servers.mark_var: mark, "FS_RECOVERY_KEY": KEY, "FS_RECOVERY_COUNTED": "sk-counted"}
    started = servers.start_fleetserve(tmp, SPEC, "recovery", fake_token_delay=0.02, env=env)
    f = Fleet(started.server, started.url, mark, servers.marked_processes)
    yield f
    f.server.stop()
    f.kill_everything()


def test_requests_are_served_while_the_serve_controller_restarts(fleet: Fleet) -> None:
    controller = fleet.find("ServeController")
    assert len(controller) == 1, fleet.processes()
    ready: list[tuple[int, str]] = []
    with Load(fleet) as load:
        load.wait_served(6, 120)
        os.kill(controller[0], signal.SIGKILL)
        # Ray restarts the controller; it then recovers the replicas it finds alive.
        wait_until(
            lambda: fleet.find("ServeController") not in ([], controller),
            180,
            "a new Serve controller",
        )
        # Through its recovery (replicas RECOVERING, then RUNNING again): every request
        # is served, none refused for want of a replica, readiness never drops.
        for _ in range(3):
            load.wait_served(10, 180)
            r = httpx.get(f"{fleet.url}/ready", headers=AUTH, timeout=30)
            ready.append((r.status_code, r.text))
    failed = [o for o in load.outcomes if not o.complete]
    assert not failed, failed[:5]
    assert all(code == 200 for code, _ in ready), ready
    assert fleet.post().status_code == 200


def test_a_killed_ingress_replica_refuses_at_once_then_serves_with_its_counters(
    fleet: Fleet,
) -> None:
    for _ in range(3):
        before = day_tokens_used(fleet.post(headers=COUNTED))
    ingress = fleet.find("ServeReplica:fleetserve:ingress")
    assert len(ingress) == 1, fleet.processes()
    with Load(fleet) as load:
        # Killed with clients connected: their connections linger in TIME_WAIT on the
        # port, which once kept the replacement from binding it (NoAvailablePortError).
        load.wait_served(3, 120)
        os.kill(ingress[0], signal.SIGKILL)
        killed_at = len(load.outcomes)
        gap: list[str] = []
        while True:
            try:
                r = fleet.post(timeout=60, headers=COUNTED)
                break
            except httpx.TransportError as e:
                # Nothing listens on the port during the gap: refused at once, not held.
                gap.append(repr(e))
            assert len(gap) < 2000, "the ingress did not come back"
            time.sleep(0.1)
        load.wait_served(6, 180)
    assert not [e for e in gap if "Timeout" in e], gap
    # The counters were never in the ingress: the three requests before the kill still
    # count (a fresh ledger would show one request's usage, less than before).
    after = day_tokens_used(r)
    assert after > before, (before, after)
    assert set(fleet.find("ServeReplica:fleetserve:ingress")).isdisjoint(ingress)
    # Requests that were cut or refused by the kill ended with a connection error, never
    # a hang; every request the new replica took was served whole.
    for o in load.outcomes[killed_at:]:
        assert o.complete or o.status is None, o
        assert "Timeout" not in o.detail, o


def test_a_killed_quota_keeper_comes_back_with_its_counters(fleet: Fleet) -> None:
    for _ in range(3):
        before = day_tokens_used(fleet.post(headers=COUNTED))
    keeper = fleet.find("ServeReplica:fleetserve:quota")
    assert len(keeper) == 1, fleet.processes()
    with Load(fleet) as load:
        # The keeper checkpoints a change within a second (CHECKPOINT_S); 30 streams of
        # 20 fake tokens at 20 ms each take longer than that on any host.
        load.wait_served(30, 180)
        os.kill(keeper[0], signal.SIGKILL)
        # Meanwhile quota requests are served without a reservation (fail open, no
        # x-ratelimit headers); once the new keeper answers, the headers are back.
        while True:
            r = fleet.post(headers=COUNTED)
            assert r.status_code == 200, r.text
            if "x-ratelimit-remaining-tokens" in r.headers:
                break
            time.sleep(0.2)
        load.wait_served(3, 180)
    assert set(fleet.find("ServeReplica:fleetserve:quota")).isdisjoint(keeper)
    # The new keeper started from the checkpoint: the usage before the kill still counts
    # (an empty ledger would show this one request's usage, less than before).
    after = day_tokens_used(r)
    assert after > before, (before, after)
    assert all(o.complete for o in load.outcomes), [o for o in load.outcomes if not o.complete]
