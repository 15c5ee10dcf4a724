"""Render of a replica whose pipeline stages cross nodes (TP 8 x PP 2 on two 8-GPU nodes).

Through the real planner, as ``fleetserve render`` runs it: one worker pod per node of the
replica (whole GPUs, no HAMi), a Serve deployment with one ``{GPU: 1}`` bundle per rank (what
vLLM's Ray executor requires: it refuses bundles of more than one GPU) under PACK, and the
engine told to use Ray's distributed executor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.serve.schema import ServeDeploySchema

from fleetserve.engine.config import EngineConfig
from fleetserve.errors import RenderError
from fleetserve.k8s.render import RenderOptions, render
from fleetserve.plan import plan_fleet
from fleetserve.serve.control.app import BuildArgs
from fleetserve.spec import FleetSpec, load_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "k8s" / "pipeline-across-nodes.yaml"


def _render(spec: FleetSpec, **options: Any) -> list[dict[str, Any]]:
    plan_min, plan_max = plan_fleet(spec), plan_fleet(spec, scenario="max")
    return render(spec, plan_min, plan_max, RenderOptions(**options))


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return _render(load_spec(EXAMPLE), with_nodepools=True)


def _rayservice(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "RayService")


def _serve(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(_rayservice(objects)["spec"]["serveConfigV2"])  # type: ignore[no-any-return]


def test_one_pod_per_node_of_each_replica(objects: list[dict[str, Any]]) -> None:
    (group,) = _rayservice(objects)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    # replicas {min: 1, max: 2} x 2 pods each
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 4)
    (container,) = group["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8"  # one node's cards: one stage's TP group
    assert not any(k.startswith("nvidia.com/gpumem") or "cores" in k for k in limits)
    assert "schedulerName" not in group["template"]["spec"]  # whole cards, no HAMi
    (resource,) = group["resources"]
    assert group["resources"][resource] == "8"  # one unit per card for the GPU bundles


def test_deployment_reserves_one_gpu_bundle_per_rank_across_pods(
    objects: list[dict[str, Any]],
) -> None:
    (dep,) = _serve(objects)["applications"][0]["deployments"]
    bundles = dep["placement_group_bundles"]
    assert len(bundles) == 16
    assert all(b["GPU"] == 1 for b in bundles)
    assert dep["placement_group_strategy"] == "PACK"
    actor = dep["ray_actor_options"]
    assert actor["num_gpus"] == 0
    # the replica actor (vLLM's driver) sits in bundle 0 with its CPUs and its pin
    assert bundles[0]["CPU"] == actor["num_cpus"] == 8
    pin = next(iter(actor["resources"]))
    assert all(b[pin] == 1 for b in bundles)
    assert dep["autoscaling_config"]["max_replicas"] == 2  # replicas, not pods


def test_ray_autoscaler_fills_two_pods_per_replica(objects: list[dict[str, Any]]) -> None:
    rs = _rayservice(objects)
    cr = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "llm-405b", "namespace": "llm-405b"},
        "spec": rs["spec"]["rayClusterConfig"],
    }
    types = _derive_autoscaling_config_from_ray_cr(cr)["available_node_types"]
    (name,) = [k for k in types if k != "headgroup"]
    worker = types[name]["resources"]
    (dep,) = _serve(objects)["applications"][0]["deployments"]
    bundles = dep["placement_group_bundles"]
    for key in ("GPU", next(iter(dep["ray_actor_options"]["resources"]))):
        # exactly two pods' worth: PACK fills one pod (one stage) before the next
        assert sum(b.get(key, 0) for b in bundles) == 2 * worker[key]
    assert all(all(b[k] <= worker[k] for k in b) for b in bundles)


def test_engine_runs_pipeline_stages_with_rays_executor(objects: list[dict[str, Any]]) -> None:
    app = _serve(objects)["applications"][0]
    ServeDeploySchema.model_validate(_serve(objects))
    args = BuildArgs.model_validate(app["args"])
    spec = args.load_spec()
    (model,) = spec.models
    assert (model.tensor_parallel, model.pipeline_parallel) == (8, 2)
    assert model.engine_args["distributed_executor_backend"] == "ray"
    assert args.deployments is not None
    cli = EngineConfig.from_spec(
        model, model_path="/models/405b", settings=args.deployments[model.name].engine
    ).vllm_cli_args()
    for flag, value in (
        ("--tensor-parallel-size", "8"),
        ("--pipeline-parallel-size", "2"),
        ("--distributed-executor-backend", "ray"),
    ):
        assert cli[cli.index(flag) + 1] == value


@pytest.mark.usefixtures("crds_present")
def test_rayservice_matches_its_crd(objects: list[dict[str, Any]], kit: Any) -> None:
    # the only object whose shape changes for a replica spanning pods
    assert kit.crd_errors(_rayservice(objects)) == []


def test_another_executor_is_refused() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["models"][0]["engine_args"] = {"distributed_executor_backend": "mp"}
    spec = FleetSpec.model_validate(data)
    with pytest.raises(RenderError, match="spans 2 pods"):
        _render(spec)
