"""Engine processes never outlive their replica: a watchdog process per engine.

Design note. vLLM runs its engine core (``VLLM::EngineCore``, and under it
``VLLM::Worker``) in processes spawned by the replica's Ray worker. When that worker ends
without running vLLM's shutdown - SIGKILL, the OOM killer, a Ray shutdown that kills
workers - the engine core is re-parented to PID 1 and keeps its memory (a whole GPU) and
a core busy; it is not in the server's process group either (raylet starts each worker in
its own), so killing the server's group does not reach it. Nothing inside the dying
worker can help, so the replica starts this small watchdog next to its engine:
``python -m fleetserve.engine.reaper GUARDS ROOT...``.

What it watches, and why. The *guards* are the replica's Ray worker (the watchdog's
parent) and that worker's raylet (``RAY_RAYLET_PID``, set by Ray in every worker). The
worker alone is not enough: measured on Ray 2.60, a worker whose raylet was SIGKILLed
keeps running (10+ minutes seen) as long as the raylet is an unreaped zombie - which it
stays while ``fleetserve serve``, its parent, runs - so an engine watching only its
worker outlived the raylet by minutes. A zombie counts as dead here (``/proc`` state
``Z``). Every :data:`POLL_S` the watchdog checks its guards; once one is gone it sends
SIGTERM to the engine processes (vLLM's handler shuts the workers down), waits
:data:`GRACE_S`, then SIGKILLs whatever is left of their trees, and exits. It also exits
when the engine processes are all gone. Above the raylet nothing needs watching: Ray
starts its raylet fate-shared with the process that started Ray (``PR_SET_PDEATHSIG``),
so the server's death is the raylet's. Processes are identified by PID *and* start time,
so a reused PID is never signalled.

Rejected: ``PR_SET_PDEATHSIG`` inside vLLM's engine process (vLLM spawns it; we cannot run
code there without patching vLLM, and it would only cover the worker, not the raylet) and
reaping only in ``fleetserve serve`` (it may be the process that was SIGKILLed).

The same watchdog keeps Ray's node agents from outliving the ``fleetserve serve`` that
started Ray (``serve/control/runner.py``, guard: the server; roots: the raylet's children
once Ray is up). The raylet starts its dashboard and runtime-env agents, and they are not
fate-shared with it: once the server is SIGKILLed (the OOM killer), its raylet and GCS go
at once, and each agent, finding its raylet dead, first publishes the error to the GCS
with Ray's fixed 60 s timeout - to a GCS that is gone - and only then exits. Measured on Ray
2.60: both agents lived 61 s after the server, and a server restarted at once with the same
``--metrics-export-port`` could not start Ray (its node timed out, both tries: 76 s) - what
a supervisor restarting it after an OOM kill does. Each watchdog gives itself a title
naming what it guards (``TITLES``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

#: Seconds between checks of the guards (the replica and its raylet).
POLL_S = 0.25
#: Seconds the engine gets to stop on SIGTERM before SIGKILL.
GRACE_S = 5.0
#: What a watchdog guards -> the process title it gives itself (``ps`` and the tests tell
#: an engine's watchdog from the Ray agents' by it).
TITLES = {"engine": "fleetserve::engine-reaper", "ray-agents": "fleetserve::ray-agent-reaper"}

Ident = tuple[int, int]  # (pid, start time in clock ticks)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":  # a zombie is already dead
        return None
    return int(fields[1]), int(fields[19])


def ident(pid: int) -> Ident | None:
    st = _stat(pid)
    return None if st is None else (pid, st[1])


def alive(proc: Ident) -> bool:
    st = _stat(proc[0])
    return st is not None and st[1] == proc[1]


def children(pid: int) -> set[int]:
    """Direct children of ``pid``."""
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] == pid:
                out.add(int(entry))
    return out


def descendants(roots: Iterable[int]) -> set[int]:
    """Every process under ``roots`` (not the roots themselves)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents[int(entry)] = st[0]
    found: set[int] = set()
    frontier = set(roots)
    while frontier:
        nxt = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= nxt
        frontier = nxt
    return found


def _signal(procs: Iterable[Ident], signum: int) -> None:
    for proc in procs:
        if alive(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc[0], signum)


def reap(roots: list[Ident], grace_s: float = GRACE_S) -> None:
    """SIGTERM the live roots, wait up to ``grace_s``, SIGKILL their whole trees."""
    live = [r for r in roots if alive(r)]
    tree = live + [i for i in map(ident, descendants(r[0] for r in live)) if i is not None]
    _signal(live, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.1)
    # Children started meanwhile count too.
    tree += [i for i in map(ident, descendants(p[0] for p in tree if alive(p))) if i]
    _signal(tree, signal.SIGKILL)


def watch(guards: list[Ident], roots: list[Ident]) -> None:
    """Until a guard dies (then reap) or the roots are all gone."""
    while any(alive(r) for r in roots):
        if not all(alive(g) for g in guards):
            reap(roots)
            return
        time.sleep(POLL_S)


def guards(raylet: bool = True) -> list[Ident]:
    """What the engine of this process must not outlive: this process and (``raylet``) its
    raylet."""
    out = [ident(os.getpid())]
    pid = os.environ.get("RAY_RAYLET_PID", "") if raylet else ""
    if pid.isdigit():
        out.append(ident(int(pid)))
    return [g for g in out if g is not None]


def _arg(procs: Iterable[Ident]) -> str:
    return ",".join(f"{pid}:{start}" for pid, start in procs)


def _parse(arg: str) -> list[Ident]:
    return [(int(p), int(s)) for p, s in (a.split(":") for a in arg.split(",") if a)]


def start_watchdog(pids: Iterable[int], what: str = "engine") -> subprocess.Popen[bytes] | None:
    """Start the watchdog of ``pids`` (this process's engine children, guarded by
    :func:`guards`; or - ``what`` "ray-agents" - the agents of the Ray node this process
    started, guarded by this process alone: a ``RAY_RAYLET_PID`` it inherited, started
    from inside some Ray job, names another node's raylet); None if none is alive."""
    if what not in TITLES:
        raise ValueError(f"unknown watchdog {what!r}: one of {', '.join(TITLES)}")
    roots = [i for i in map(ident, pids) if i is not None]
    if not roots:
        return None
    guard = _arg(guards(raylet=what == "engine"))
    argv = [sys.executable, "-m", __name__, what, guard, *(_arg([r]) for r in roots)]
    # Its own session: a signal to the replica's process group must not take the
    # watchdog with it before it has done its work. SPT_NOENV: its title (main) must not
    # overwrite its environment in /proc, which is how ``ps e`` and the tests' process
    # marks read it (setproctitle clobbers it otherwise; the title fits the command line).
    return subprocess.Popen(
        argv,
        env={**os.environ, "SPT_NOENV": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


class EngineProcesses:
    """Finds the processes an engine start created and guards them with a watchdog."""

    def __init__(self) -> None:
        self._before = children(os.getpid())
        self.watchdog: subprocess.Popen[bytes] | None = None

    def guard(self) -> list[int]:
        """Start the watchdog over the children that appeared since construction."""
        new = sorted(children(os.getpid()) - self._before)
        self.watchdog = start_watchdog(new)
        return new

    def stop(self) -> None:
        """The engine shut down cleanly: the watchdog has nothing left to guard."""
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(5)


def main(argv: list[str]) -> int:
    """``WHAT GUARDS ROOT...`` (:func:`start_watchdog`'s command line)."""
    title = TITLES[argv[0]]
    watched = _parse(argv[1])
    roots = [r for a in argv[2:] for r in _parse(a)]
    with contextlib.suppress(Exception):
        import setproctitle  # noqa: PLC0415 - a title only: never worth failing the reaper

        setproctitle.setproctitle(title)

    def on_term(_signum: int, _frame: object) -> None:
        # Terminated (clean engine shutdown, or a signal to everything): if a guard is
        # already gone, the engine goes too.
        if not all(alive(g) for g in watched):
            reap(roots)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    watch(watched, roots)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
