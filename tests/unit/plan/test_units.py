"""One unit for every ``memory_gb`` (issue #12): plan and render read the same spec the same.

Plans a spec with fractional GiB figures (where 10^9-byte and 2^30-byte readings differ by
7 %), renders it with those plans, and compares the numbers each side derived: card memory,
node RAM, a replica's host RAM.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetserve.k8s.render import RenderOptions, manifest_files, render
from fleetserve.plan import plan_fleet
from fleetserve.plan.planner import host_ram_mb, resolve_pool
from fleetserve.spec import FleetSpec, parse_spec
from fleetserve.units import gib_ceil, gib_to_bytes, gib_to_mib_ceil, gib_to_mib_floor

SPEC: dict[str, Any] = {
    "models": [
        {
            "name": "qwen",
            "source": "Qwen/Qwen2.5-0.5B-Instruct",
            "config": "qwen2.5-0.5b",
            "max_model_len": 2048,
            "concurrency": 4,
            "replicas": {"min": 1, "max": 2},
            "resources": {"cpu": 2, "memory_gb": 6.5},
        }
    ],
    "pools": [
        {
            "name": "custom",
            "gpu": {"count": 2, "memory_gb": 22.5},  # a card known only by its memory
            "cpu": 16,
            "memory_gb": 61.5,
            "max_nodes": 2,
        }
    ],
}


def _spec() -> FleetSpec:
    return parse_spec(SPEC)


def _requirement(nodepool: dict[str, Any], key: str) -> int:
    for req in nodepool["spec"]["template"]["spec"]["requirements"]:
        if req["key"] == key:
            return int(req["values"][0])
    raise KeyError(key)


def test_helpers_are_binary_units() -> None:
    assert gib_to_mib_floor(22.5) == 23040
    assert gib_to_mib_ceil(6.5) == 6656
    assert gib_to_bytes(1) == 2**30
    assert gib_ceil(6.5) == 7
    assert gib_to_mib_floor(0.1) == 102  # capacities round down
    assert gib_to_mib_ceil(0.1) == 103  # requests round up


def test_plan_and_render_read_memory_gb_as_the_same_gib() -> None:
    spec = _spec()
    low, high = plan_fleet(spec, scenario="min"), plan_fleet(spec, scenario="max")
    assert low.feasible
    assert high.feasible
    files = manifest_files(render(spec, low, high, RenderOptions(with_nodepools=True)))
    nodepool = yaml.safe_load(files["nodepool-custom.yaml"])

    # card memory: the plan's card and Karpenter's instance-gpu-memory floor (MiB)
    placement = low.replicas[0]
    assert placement.card_memory_mb == 22.5 * 1024
    assert _requirement(nodepool, "karpenter.k8s.aws/instance-gpu-memory") + 1 == (
        placement.card_memory_mb
    )
    # node RAM: the plan's node shape and Karpenter's instance-memory floor (MiB)
    shape = resolve_pool(spec.pools[0]).shape
    assert shape is not None
    assert shape.ram_mb == 61.5 * 1024
    assert _requirement(nodepool, "karpenter.k8s.aws/instance-memory") + 1 == shape.ram_mb
    # a replica's host RAM: what the plan reserves fits the pod's memory request (Gi)
    rayservice = yaml.safe_load(files[next(n for n in files if n.startswith("rayservice-"))])
    (group,) = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    resources = group["template"]["spec"]["containers"][0]["resources"]
    pod_gib = int(resources["requests"]["memory"].removesuffix("Gi"))
    assert pod_gib == 7
    assert host_ram_mb(spec.models[0], 1) == 6.5 * 1024 <= pod_gib * 1024
    # the HAMi slice is carved from the card as the plan sized it
    assert int(resources["limits"]["nvidia.com/gpumem"]) == placement.memory_mb
    assert placement.memory_mb <= placement.card_memory_mb


@pytest.mark.parametrize("gib", [0.25, 1, 22.5, 80, 141])
def test_card_memory_round_trip(gib: float) -> None:
    pool = parse_spec(
        {
            "models": [{"name": "q", "source": "q"}],
            "pools": [{"name": "p", "gpu": {"count": 1, "memory_gb": gib}}],
        }
    ).pools[0]
    shape = resolve_pool(pool).shape
    assert shape is not None
    assert shape.card_mb == gib_to_mib_floor(gib) == int(gib * 1024)
