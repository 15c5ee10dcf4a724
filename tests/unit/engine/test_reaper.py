"""The engine watchdog: an engine process dies with its replica, however the replica ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetserve.engine import reaper

# A stand-in replica: starts an "engine core" that does not watch its parent (as
# vLLM's does), guards it with the watchdog, prints both PIDs, then idles.
REPLICA = """
import subprocess, sys, time
from fleetserve.engine.reaper import EngineProcesses
procs = EngineProcesses()
core = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
procs.guard()
print(core.pid, procs.watchdog.pid, flush=True)
time.sleep(600)
"""


def _start_replica(raylet: int | None = None) -> tuple[subprocess.Popen[str], int, int]:
    env = dict(os.environ)
    env.pop("RAY_RAYLET_PID", None)
    if raylet is not None:
        env["RAY_RAYLET_PID"] = str(raylet)  # as Ray sets it in every worker
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLICA],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    assert proc.stdout is not None
    core, watchdog = map(int, proc.stdout.readline().split())
    return proc, core, watchdog


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if reaper.ident(pid) is None:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_engine_dies_when_its_replica_dies(signum: int) -> None:
    replica, core, watchdog = _start_replica()
    try:
        time.sleep(0.5)
        assert reaper.ident(core) is not None
        replica.send_signal(signum)
        replica.wait(10)
        assert _gone(core), "the engine core outlived its replica"
        assert _gone(watchdog)
    finally:
        for pid in (core, watchdog):
            if reaper.ident(pid) is not None:
                os.kill(pid, signal.SIGKILL)


def test_engine_dies_when_the_raylet_dies_though_its_replica_lives() -> None:
    # A stand-in raylet whose parent (this test, as `fleetserve serve` is the raylet's)
    # does not reap it: once killed it stays a zombie, as a SIGKILLed raylet does - and Ray
    # 2.60 workers keep running then, so the replica alone is no signal.
    raylet = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    replica, core, watchdog = _start_replica(raylet=raylet.pid)
    try:
        time.sleep(0.5)
        assert reaper.ident(core) is not None
        os.kill(raylet.pid, signal.SIGKILL)
        assert _gone(core), "the engine core outlived its raylet"
        assert _gone(watchdog)
        assert replica.poll() is None  # not what killed the engine
    finally:
        replica.kill()
        replica.wait(10)
        raylet.wait(10)
        for pid in (core, watchdog):
            if reaper.ident(pid) is not None:
                os.kill(pid, signal.SIGKILL)


def test_guards_are_this_process_and_its_raylet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_RAYLET_PID", str(os.getppid()))
    assert reaper.guards() == [reaper.ident(os.getpid()), reaper.ident(os.getppid())]
    monkeypatch.delenv("RAY_RAYLET_PID")
    assert reaper.guards() == [reaper.ident(os.getpid())]


def test_watchdog_leaves_a_live_replica_alone_and_exits_after_a_clean_stop() -> None:
    replica, core, watchdog = _start_replica()
    try:
        time.sleep(1.0)
        assert reaper.ident(core) is not None
        assert reaper.ident(watchdog) is not None
        os.kill(core, signal.SIGKILL)  # the engine stopped by itself
        assert _gone(watchdog), "the watchdog should exit once its engine is gone"
    finally:
        replica.kill()
        replica.wait(10)


def test_identity_includes_start_time() -> None:
    me = reaper.ident(os.getpid())
    assert me is not None
    assert reaper.alive(me)
    assert not reaper.alive((me[0], me[1] + 1))  # a reused PID is another process


def test_a_watchdog_names_what_it_guards_and_keeps_its_environment_readable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The server's watchdog of Ray's agents (serve/control/runner.py) beside the engines':
    # its title tells them apart, and its environment stays readable in /proc - how ``ps
    # e`` and the tests' process marks find a server's processes (setproctitle overwrote
    # it before SPT_NOENV).
    monkeypatch.setenv("FLEETSERVE_REAPER_TEST", "marked")
    # a raylet PID inherited from some Ray job names another node's raylet: its end is not
    # this server's, so it is no guard of the agents
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.setenv("RAY_RAYLET_PID", str(other.pid))
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        watchdog = reaper.start_watchdog([agent.pid], "ray-agents")
        assert watchdog is not None
        deadline = time.monotonic() + 10
        cmdline = b""
        while time.monotonic() < deadline and reaper.TITLES["ray-agents"].encode() not in cmdline:
            time.sleep(0.05)
            cmdline = Path(f"/proc/{watchdog.pid}/cmdline").read_bytes()
        assert cmdline.startswith(reaper.TITLES["ray-agents"].encode()), cmdline
        assert (
            b"FLEETSERVE_REAPER_TEST=marked" in Path(f"/proc/{watchdog.pid}/environ").read_bytes()
        )
        other.kill()
        other.wait(10)
        time.sleep(1.0)  # four of its polls: the agent is left alone while this process lives
        assert agent.poll() is None
        agent.kill()
        agent.wait(10)
        watchdog.wait(10)  # its roots gone, it ends by itself
    finally:
        agent.kill()
        other.kill()
    with pytest.raises(ValueError, match="unknown watchdog 'vllm'"):
        reaper.start_watchdog([os.getpid()], "vllm")
