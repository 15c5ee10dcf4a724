"""Logical resources: ingress + proxy + min replicas must fit, or the arithmetic is shown."""

from __future__ import annotations

import pytest

from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import CapacityError
from fleetserve.plan.deployment import INGRESS_CPUS, FleetDeployment, node_deployment
from fleetserve.plan.local import plan_unsized
from fleetserve.serve.control.resources import ClusterCapacity, fit_resources
from fleetserve.spec import FleetSpec, default_fleet, parse_spec

S = EngineSettings(
    gpu_memory_utilization=0.3, max_num_seqs=8, max_model_len=256, max_num_batched_tokens=256
)
TWO_CPUS = ClusterCapacity(cpus=2, node_cpus=2, description="this host")


def fleet(*models: dict[str, object]) -> FleetSpec:
    return parse_spec({"models": [{"source": "x", **m} for m in models]})


def settings(spec: FleetSpec, *, gpu: bool = False) -> FleetDeployment:
    given = {m.name: S for m in spec.models}
    return node_deployment(spec, plan_unsized(spec, gpu=gpu, settings=given))


def test_default_fleet_fits_two_cpus_and_leaves_room_for_the_ingress() -> None:
    spec = default_fleet()
    plan = settings(spec)
    fit_resources(spec, plan, TWO_CPUS)
    assert plan.ingress.num_cpus == INGRESS_CPUS < 1
    assert plan.models[spec.models[0].name].ray.ray_actor_options() == {"num_cpus": 1}
    total = plan.ingress.num_cpus + sum(m.ray.num_cpus for m in plan.models.values())
    assert total <= 2


def test_replicas_taking_every_cpu_are_refused_with_the_sum() -> None:
    spec = fleet({"name": "a"}, {"name": "b"})
    with pytest.raises(CapacityError) as err:
        fit_resources(spec, settings(spec), TWO_CPUS)
    msg = str(err.value)
    assert "needs 2.1 logical CPUs at min replicas but this host has 2" in msg
    assert "ingress 0.1 + proxy 0 + a 1 x 1 + b 1 x 1 = 2.1 > 2" in msg
    assert CapacityError.exit_code == 2


def test_fractional_replicas_fit_and_max_beyond_the_cluster_is_a_warning() -> None:
    spec = fleet(
        {"name": "a", "resources": {"cpu": 0.5}, "replicas": {"min": 1, "max": 4}},
        {"name": "b", "resources": {"cpu": 0.5}},
    )
    plan = settings(spec)
    warnings = fit_resources(spec, plan, TWO_CPUS)
    assert plan.models["a"].ray.num_cpus == 0.5
    assert len(warnings) == 1
    assert "at max replicas the fleet needs 2.6 logical CPUs" in warnings[0]


def test_a_replica_larger_than_any_node_is_refused() -> None:
    spec = fleet({"name": "big", "resources": {"cpu": 3}})
    cluster = ClusterCapacity(cpus=8, node_cpus=2, description="the Ray cluster (4 nodes)")
    with pytest.raises(CapacityError, match="a replica of 'big' needs 3 CPUs but the largest node"):
        fit_resources(spec, settings(spec), cluster)


def test_gpu_replicas_reserve_their_memory_fraction_or_whole_gpus() -> None:
    spec = fleet({"name": "small"}, {"name": "tp", "tensor_parallel": 2})
    # Unsized (no slice planned): a one-card replica reserves its engine's fraction.
    plan = settings(spec, gpu=True)
    assert plan.models["small"].ray.num_gpus == pytest.approx(0.3)
    assert plan.models["tp"].ray.num_gpus == 2
    cpu_plan = settings(spec, gpu=False)
    assert cpu_plan.models["tp"].ray.num_gpus == 0


def test_gpus_at_min_replicas_must_fit() -> None:
    spec = fleet({"name": "tp", "tensor_parallel": 4, "replicas": {"min": 2, "max": 2}})
    cluster = ClusterCapacity(cpus=64, gpus=4, node_cpus=64, node_gpus=4)
    with pytest.raises(CapacityError, match=r"needs 8 GPUs .* tp 4 x 2 = 8 > 4"):
        fit_resources(spec, settings(spec, gpu=True), cluster)


def test_memory_reservations_must_fit() -> None:
    spec = fleet({"name": "a", "resources": {"memory_gb": 30}})
    cluster = ClusterCapacity(cpus=8, memory_gb=16, node_cpus=8)
    with pytest.raises(CapacityError, match="reserves 30 GiB of memory"):
        fit_resources(spec, settings(spec), cluster)


def test_capacity_from_ray_uses_alive_nodes() -> None:
    cap = ClusterCapacity.from_ray(
        {"CPU": 6.0, "GPU": 1.0, "memory": 8 * 2**30},  # Ray counts bytes; memory_gb is GiB
        [
            {"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}},
            {"Alive": True, "Resources": {"CPU": 2.0}},
            {"Alive": False, "Resources": {"CPU": 64.0}},
        ],
    )
    assert (cap.cpus, cap.gpus, cap.node_cpus, cap.node_gpus) == (6.0, 1.0, 4.0, 1.0)
    assert cap.memory_gb == pytest.approx(8.0)
    assert "2 nodes" in cap.description
