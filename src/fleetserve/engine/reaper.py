"""Engine processes never outlive their replica: a watchdog process per engine.

Design note. vLLM runs its engine core (``VLLM::EngineCore``, and under it
``VLLM::Worker``) in processes spawned by the replica's Ray worker. When that worker ends
without running vLLM's shutdown - SIGKILL, the OOM killer, its raylet dying, a Ray
shutdown that kills workers - the engine core is re-parented to PID 1 and keeps its
memory (a whole GPU) and a core busy; it is not in the server's process group either
(raylet starts workers in their own), so killing the group does not reach it. Nothing
inside the dying worker can help, so the replica starts this small watchdog next to its
engine: ``python -m fleetserve.engine.reaper PARENT PID...``. It polls its parent every
:data:`POLL_S`; once the parent is gone (the watchdog is re-parented) it sends SIGTERM to
the engine processes (vLLM's handler shuts the workers down), waits
:data:`GRACE_S`, then SIGKILLs whatever is left of their trees, and exits. It also exits
when the engine processes are all gone. Processes are identified by PID *and* start time,
so a reused PID is never signalled.

Rejected: ``PR_SET_PDEATHSIG`` inside vLLM's engine process (vLLM spawns it; we cannot run
code there without patching vLLM) and reaping only in ``fleetserve serve`` (it may be the
process that was SIGKILLed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

#: Seconds between checks of the parent.
POLL_S = 0.25
#: Seconds the engine gets to stop on SIGTERM before SIGKILL.
GRACE_S = 5.0

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


def watch(parent: int, roots: list[Ident]) -> None:
    """Until the parent dies (then reap) or the roots are all gone."""
    while any(alive(r) for r in roots):
        if os.getppid() != parent:
            reap(roots)
            return
        time.sleep(POLL_S)


def start_watchdog(pids: Iterable[int]) -> subprocess.Popen[bytes] | None:
    """Start the watchdog of ``pids`` (this process's engine children); None if none."""
    roots = [i for i in map(ident, pids) if i is not None]
    if not roots:
        return None
    argv = [sys.executable, "-m", __name__, str(os.getpid())]
    argv += [f"{pid}:{start}" for pid, start in roots]
    # Its own session: a signal to the replica's process group must not take the
    # watchdog with it before it has done its work.
    return subprocess.Popen(
        argv,
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
    parent = int(argv[0])
    roots = [(int(p), int(s)) for p, s in (a.split(":") for a in argv[1:])]
    with contextlib.suppress(Exception):
        import setproctitle  # noqa: PLC0415 - optional (ships with Ray)

        setproctitle.setproctitle("fleetserve::engine-reaper")

    def on_term(_signum: int, _frame: object) -> None:
        # Terminated (clean engine shutdown, or a signal to everything): if the parent
        # is already gone, the engine goes too.
        if os.getppid() != parent:
            reap(roots)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    watch(parent, roots)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
