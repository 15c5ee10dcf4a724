"""One host probe: the planner and the Ray that ``serve`` starts see the same CPUs, in a
container pinned to few CPUs (affinity) or given a CPU quota (cgroup v2 ``cpu.max``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from fleetserve import host
from fleetserve.plan.local import LocalHost
from fleetserve.serve.control import runner
from fleetserve.serve.control.runner import FleetServer, ServeOptions, local_capacity
from fleetserve.spec import default_fleet


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A 64-CPU machine; this process may use CPUs 0-3; no cgroup quota yet; no GPU."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    monkeypatch.setattr(host, "CGROUP_CPU_MAX", cpu_max)
    monkeypatch.setattr(host, "NVIDIA_CONTROL_DEVICE", tmp_path / "no-nvidiactl")
    return cpu_max


def test_affinity_bounds_the_cpus(pinned: Path) -> None:
    assert host.usable_cpus() == 4


@pytest.mark.parametrize(
    ("cpu_max", "cpus"), [("150000 100000", 2), ("50000 100000", 1), ("800000 100000", 4)]
)
def test_the_cgroup_quota_bounds_the_cpus(pinned: Path, cpu_max: str, cpus: int) -> None:
    pinned.write_text(cpu_max + "\n")
    assert host.usable_cpus() == cpus


def test_ray_gets_no_more_cpus_than_the_plan_was_made_for(
    pinned: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned.write_text("200000 100000\n")  # 2 CPUs of quota
    planned = LocalHost.detect()
    assert planned.cpus == 2
    assert local_capacity(planned).cpus == 2

    started: dict[str, Any] = {}
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.update(kwargs))
    # A started Ray answers with its address, which the server prints.
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address="x:1"))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # _start_ray sets Serve env vars
    server = FleetServer(
        ServeOptions(spec=default_fleet(), host="127.0.0.1", port=8000, engine="fake")
    )
    server.check()
    monkeypatch.setattr(runner, "probe", lambda: pytest.fail("Ray must reuse check()'s probe"))
    server._start_ray()
    assert started["num_cpus"] == planned.cpus == 2


def test_a_gpu_host_counts_the_machines_ram_not_numa_node_0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM CPU's budget is node 0; on a GPU host RAM only holds processes, which Ray places
    on the whole machine (a VM's hot-plugged memory can form other nodes)."""
    node0 = tmp_path / "meminfo"
    node0.write_text("Node 0 MemTotal:        8388608 kB\n")
    monkeypatch.setattr(host, "NUMA_NODE0_MEMINFO", node0)
    monkeypatch.setattr(host, "CGROUP_MEMORY_MAX", tmp_path / "no-memory.max")
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    monkeypatch.setattr(host, "gpu_memory_mb", list)
    assert host.probe().memory_mb == 8192  # CPU host: vLLM CPU's node-0 figure
    monkeypatch.setattr(host, "gpu_memory_mb", lambda: [143_155])
    assert host.probe().memory_mb == machine


def test_gpu_probe_reads_the_cards_in_a_child_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The card figures come from a child: CUDA's context (~0.5 GiB of card memory) dies
    with it instead of living in `fleetserve serve` beside the engines it planned."""
    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(host, "NVIDIA_CONTROL_DEVICE", tmp_path / "nvidiactl")
    monkeypatch.setattr(host, "_CUDA_CARDS", "print(150104014848); print(150104014848)")
    assert host.gpu_memory_mb() == [143_150, 143_150]
    monkeypatch.setattr(host, "_CUDA_CARDS", "raise SystemExit(1)")
    assert host.gpu_memory_mb() == []  # a failing child: no cards, as without CUDA


def test_gpu_probe_leaves_torch_out_of_the_probing_process(tmp_path: Path) -> None:
    (tmp_path / "nvidiactl").touch()
    code = (
        "import sys; from pathlib import Path; from fleetserve import host; "
        f"host.NVIDIA_CONTROL_DEVICE = Path({str(tmp_path / 'nvidiactl')!r}); "
        "host.gpu_memory_mb(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
