"""Disjoint CPU cores for the vLLM CPU engines of one host.

Design note. vLLM's CPU backend pins its worker's OpenMP threads to cores
(``VLLM_CPU_OMP_THREADS_BIND=auto``: the cores of the first NUMA node, less one it
reserves for the engine's scheduler) without knowing about other engines on the host, so
every replica on a host pins to the same cores. Measured on a 2-CPU host: two replicas of
the default model both pinned to core 0 and shared it at ~50 % each while core 1 ran
everything else (docs/benchmarks-log.md, routing). fleetserve packs many models per host, so
each engine claims its own cores before vLLM starts and hands them to vLLM as an explicit
``VLLM_CPU_OMP_THREADS_BIND`` list:

* how many: the replica's CPU share as Ray assigned it (``resources.cpu``), at least one;
* which: the lowest cores of the process's CPU affinity that no live engine holds. A claim
  is an exclusive ``flock`` on one file per core in a host-wide directory; the kernel drops
  the locks of a dead process, so a killed replica's cores are free again without cleanup;
* one core of the affinity is never claimed when there are several (vLLM's auto mode
  keeps it too: the engine's scheduler process, Ray and the serving layer run there);
* when too few cores are free (more engines than cores), the engine is not pinned
  (``nobind``) and runs ``n`` OpenMP threads where the kernel has room, instead of
  doubling up on a core another engine holds.

What must stay true: an explicit ``VLLM_CPU_OMP_THREADS_BIND`` in the environment is the
user's choice and is left alone; engines spanning several processes (tensor or pipeline
parallel) keep vLLM's own binding, which lists one core set per rank.

**The rest of the fleet keeps off the engines' cores.** Pinning the engine is half of it:
Ray's daemons, the Serve controller, the ingress and the replicas' own Python still ran on
every core, the engine's included, and by Ray's default a CPU engine runs at the worker
niceness 15, so each of their wake-ups preempted it (Ray's idle floor is ~11 % of a core
against ~1.4 % for ``vllm serve``). Measured on a 2-CPU host, one server, vLLM's benchmark
client at concurrency 8, phases alternating: the rest on core 1 gave +4 % tok/s on a quiet
host, and on a loaded one +7 % only together with Ray's workers at niceness 0, which
``serve/control/runner.py`` sets for every Ray it starts (docs/benchmarks-log.md, overhead: without
it the split lost ~10 % under load). So when ``fleetserve serve`` starts a
local Ray for CPU engines, it starts Ray on the *serving cores*
(:func:`serving_cores`: the host's cores less those its engines will claim, which are the
lowest claimable ones, since every claim takes the lowest free core), and every Ray process
and worker inherits that affinity.

**An engine's own processes start on its claimed cores** (:func:`engine_cores`,
:func:`spawned_on`), not on the serving cores the replica inherited from Ray: libgomp drops
OpenMP places outside the affinity a process starts with, so vLLM could not pin its threads
to the claimed cores from there. Nor on the host's: vLLM pins only its OpenMP threads, and
the rest of ``VLLM::EngineCore`` (its scheduler loop and socket threads, which busy-poll
while the model steps) would roam every core, the serving layer's and other engines'
included. Measured in place on one 2-CPU server (our client, phases alternating), those
threads on the engine's core against on every core: +2.0 % tok/s loaded at concurrency 8,
+6.6 % quiet at 32; on the serving core instead they lost 23 % (docs/benchmarks-log.md,
overhead). It also puts vLLM's memory-node choice (the node of
the first core the worker may use) on the node of the cores it computes on. An engine that
claimed nothing (``nobind``: more engines than cores) starts on the host's cores
(``FLEETSERVE_HOST_CPUS`` carries them from a driver that narrowed its own), so it can use
every core.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
#: vLLM's value for "do not pin OpenMP threads".
NO_BIND = "nobind"
#: The host's cores (vLLM's list syntax), set by a driver that started Ray on fewer.
HOST_CPUS_ENV = "FLEETSERVE_HOST_CPUS"


def lock_dir() -> Path:
    """Where the per-core claims live: one directory per user, shared by every engine."""
    return Path(tempfile.gettempdir()) / f"fleetserve-cpu-cores-{os.getuid()}"


def cores_wanted(cpu_share: float | None) -> int:
    """Cores for a replica with this Ray CPU share (``None``: unknown, one core)."""
    if cpu_share is None or cpu_share <= 0:
        return 1
    return max(1, math.floor(cpu_share + 1e-9))


def claimable(affinity: list[int]) -> list[int]:
    """The cores engines may claim: all but the last one when there are several."""
    cores = sorted(affinity)
    return cores[:-1] if len(cores) > 1 else cores


def serving_cores(host: list[int], engine_cores: int) -> list[int]:
    """The cores left to everything but the engines, when engines claim ``engine_cores``.

    Claims take the lowest free claimable cores, so engines holding at most
    ``engine_cores`` together hold only the lowest ``engine_cores`` claimable ones. When
    they want more than there are, some run unpinned and only the never-claimed core is
    left to the rest (vLLM's auto binding reserves the same one).
    """
    cores = sorted(host)
    engines = set(claimable(cores)[: max(0, engine_cores)])
    return [c for c in cores if c not in engines] or cores


def host_cores() -> list[int]:
    """The cores engines may claim: the driver's view of the host where it narrowed this
    process's affinity (``HOST_CPUS_ENV``), else this process's affinity."""
    value = os.environ.get(HOST_CPUS_ENV)
    return parse_cores(value) if value else sorted(os.sched_getaffinity(0))


def parse_cores(value: str) -> list[int]:
    """Core ids from vLLM's list syntax (``0-3,6``); ValueError names a bad part."""
    cores: set[int] = set()
    for part in value.split(","):
        first, _, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"not a core list: {value!r} (part {part!r})") from None
        if low < 0 or high < low:
            raise ValueError(f"not a core list: {value!r} (part {part!r})")
        cores.update(range(low, high + 1))
    return sorted(cores)


@contextlib.contextmanager
def spawned_on(cores: list[int]) -> Iterator[None]:
    """Processes started inside run on ``cores``; this process's threads are left alone.

    ``sched_setaffinity(0, ...)`` sets the calling thread only (Linux), and a child
    inherits the affinity of the thread that starts it.
    """
    before = os.sched_getaffinity(0)
    if set(cores) == before:
        yield
        return
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def engine_cores(claim: CoreClaim | None, host: list[int]) -> list[int]:
    """The cores an engine's processes start on: the cores it claimed, else (vLLM's own
    binding, or ``nobind``) the host's."""
    return list(claim.cores) if claim is not None and claim.cores else list(host)


def format_cores(cores: list[int]) -> str:
    """vLLM's list syntax (``0-3,6``) for sorted core ids."""
    parts: list[str] = []
    start = prev = cores[0]
    for core in cores[1:]:
        if core == prev + 1:
            prev = core
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = core
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


@dataclass
class CoreClaim:
    """Cores held by this process for one engine (released on :meth:`release` or exit)."""

    cores: list[int]
    env: dict[str, str]
    _files: list[IO[bytes]] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()


def claim_cores(
    n: int, affinity: list[int] | None = None, directory: Path | None = None
) -> CoreClaim:
    """Claim ``n`` free cores (see the module note); the environment for vLLM's engine."""
    cores = claimable(affinity if affinity is not None else host_cores())
    where = directory or lock_dir()
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    held: list[int] = []
    files: list[IO[bytes]] = []
    for core in cores:
        if len(held) == n:
            break
        f: IO[bytes] = (where / f"core-{core}.lock").open("ab")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()  # another live engine holds it
            continue
        held.append(core)
        files.append(f)
    if len(held) < n:
        for f in files:
            f.close()
        logger.warning(
            "only %d of the %d CPU cores this engine wants are free (cores %s are held by "
            "other engines or reserved): running %d unpinned OpenMP threads",
            len(held),
            n,
            format_cores(cores) if cores else "none",
            n,
        )
        return CoreClaim([], {BIND_ENV: NO_BIND, "OMP_NUM_THREADS": str(n)})
    return CoreClaim(held, {BIND_ENV: format_cores(held)}, files)
