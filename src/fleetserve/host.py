"""This machine, measured once: the CPUs, RAM and GPUs a local fleet may use.

Design note. ``fleetserve serve`` plans on this machine (:mod:`fleetserve.plan.local`) and
then starts Ray here (:mod:`fleetserve.serve.control.runner`). Both must see the same machine, or
Ray is given more CPUs than the planner planned for (a container pinned to 2 CPUs of a
64-CPU host: ``os.cpu_count()`` says 64). So every host fact comes from :func:`probe`:

* CPUs: the CPUs this process may run on (``sched_getaffinity``), capped by the cgroup v2
  CPU quota (``cpu.max``: quota / period, rounded up to a whole CPU).
* memory: on a CPU host, RAM as vLLM CPU measures it, because its ``gpu_memory_utilization``
  is a fraction of that figure: NUMA node 0's MemTotal clamped to the cgroup limit (mirrors
  vllm/utils/cpu_resource_utils.py ``get_memory_node_info``); else physical RAM. On a GPU
  host the engines' budget is card memory and host RAM only holds processes, which Ray
  places on the whole machine: physical RAM clamped to the cgroup limit (node 0 alone can
  be a fraction of it - a VM whose hot-plugged memory forms other nodes).
* GPUs: each visible CUDA card's total memory (MiB), from torch when CUDA is available
  (it honours CUDA_VISIBLE_DEVICES, as Ray and vLLM do), read in a child process: asking
  CUDA creates a context (~0.5 GiB of card memory on an H200) that lives as long as its
  process, and the process that probes (``fleetserve serve``) lives as long as the fleet,
  on the card the engines were planned to fill.

Paths are module constants so tests can point them at fixtures.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: cgroup v2 files (the unified hierarchy as mounted in a container).
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
NUMA_NODE0_MEMINFO = Path("/sys/devices/system/node/node0/meminfo")
#: Present wherever the NVIDIA driver is loaded (also inside GPU containers).
NVIDIA_CONTROL_DEVICE = Path("/dev/nvidiactl")

_MiB = 2**20


@dataclass(frozen=True)
class HostFacts:
    """What a fleet on this machine may use."""

    cpus: int
    """Logical CPUs this process may use (affinity, cgroup quota)."""
    memory_mb: int
    """RAM a fleet may use (MiB): vLLM CPU's measure on a CPU host, else the machine's."""
    gpu_memory_mb: list[int] = field(default_factory=list)
    """Total memory of each visible CUDA card (MiB); empty without CUDA."""

    @classmethod
    def detect(cls) -> HostFacts:
        """Probe this machine (:func:`probe`)."""
        return probe()


def usable_cpus() -> int:
    """CPUs this process may run on, capped by the cgroup CPU quota (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, quota)
    return max(1, cpus)


def _cgroup_cpu_quota() -> int | None:
    """``cpu.max`` as whole CPUs ("max 100000": no quota -> None)."""
    try:
        parts = CGROUP_CPU_MAX.read_text().split()
    except OSError:
        return None
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def engine_visible_memory() -> int:
    """Host RAM (bytes) as vLLM CPU measures it (see the module note)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        for line in NUMA_NODE0_MEMINFO.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "MemTotal:":
                total = int(parts[3]) * 1024
    except (OSError, ValueError):
        pass
    return _cgroup_clamped(total)


def host_memory() -> int:
    """The machine's RAM (bytes), clamped to the cgroup limit (see the module note)."""
    return _cgroup_clamped(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cgroup_clamped(total: int) -> int:
    try:
        limit = CGROUP_MEMORY_MAX.read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return int(total)


def gpu_memory_mb() -> list[int]:
    """Total memory (MiB) of each visible CUDA card; empty without torch or CUDA."""
    if not NVIDIA_CONTROL_DEVICE.exists():
        return []  # no NVIDIA driver: skip importing torch (seconds) on CPU hosts
    try:
        found = subprocess.run(
            [sys.executable, "-c", _CUDA_CARDS],
            capture_output=True,
            text=True,
            timeout=GPU_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = found.stdout.split()
    return [int(n) // _MiB for n in lines if n.isdigit()] if found.returncode == 0 else []


#: The child's program: each visible card's total bytes, one per line (none without CUDA).
_CUDA_CARDS = """
try:
    import torch
except ImportError:
    raise SystemExit(0)
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        print(torch.cuda.get_device_properties(i).total_memory)
"""
#: torch's import plus CUDA's initialisation take seconds, not minutes.
GPU_PROBE_TIMEOUT_S = 120.0


def probe() -> HostFacts:
    """This machine's CPUs, RAM and GPUs (the one measurement every command uses)."""
    gpus = gpu_memory_mb()
    memory = host_memory() if gpus else engine_visible_memory()
    return HostFacts(cpus=usable_cpus(), memory_mb=memory // _MiB, gpu_memory_mb=gpus)


__all__ = [
    "HostFacts",
    "engine_visible_memory",
    "gpu_memory_mb",
    "host_memory",
    "probe",
    "usable_cpus",
]
