"""A traffic-planned model is rendered (and served) with the plan's choices.

``plan`` chooses a traffic-planned model's tensor_parallel, max_num_seqs, replica count and
pool (``PlanResult.traffic[]``); the spec says none of them. Render must deploy exactly
that choice - in the RayService's worker groups, its ``deployments[]``, the app's resolved
deployments and the spec the app receives - without the user copying it into the spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.engine.config import EngineConfig
from fleetserve.k8s.render import render
from fleetserve.plan import plan_fleet
from fleetserve.plan.deployment import ModelDeployment, deployment_name, node_deployment
from fleetserve.plan.result import PlanResult, TrafficPlan
from fleetserve.spec import FleetSpec, parse_spec

SLO_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "plan" / "slo.yaml"


def slo_fleet() -> FleetSpec:
    """examples/plan/slo.yaml made renderable: weights to load, pools told apart."""
    data: dict[str, Any] = yaml.safe_load(SLO_EXAMPLE.read_text())
    for pool in data["pools"]:
        pool["labels"] = {"pool": pool["name"]}
    for model in data["models"]:
        model["source"] = f"google/{model['config']}-it"
    return parse_spec(data, "slo.yaml")


@pytest.fixture(scope="module")
def planned() -> tuple[FleetSpec, PlanResult, PlanResult]:
    spec = slo_fleet()
    return spec, plan_fleet(spec, scenario="min"), plan_fleet(spec, scenario="max")


def choice(plan: PlanResult, model: str) -> TrafficPlan:
    return next(t for t in plan.traffic if t.model == model)


def test_the_spec_leaves_the_choices_to_the_plan(
    planned: tuple[FleetSpec, PlanResult, PlanResult],
) -> None:
    spec, plan_min, _ = planned
    chat = choice(plan_min, "chat")
    # the point of the test: the plan picks what the spec does not say
    assert chat.met
    assert chat.tensor_parallel > 1
    assert chat.replicas > 1
    assert spec.models[0].tensor_parallel == 1
    assert spec.models[0].max_num_seqs is None
    assert spec.models[0].replicas.max == 1


def test_render_deploys_the_plans_traffic_choice(
    planned: tuple[FleetSpec, PlanResult, PlanResult],
) -> None:
    spec, plan_min, plan_max = planned
    objects = render(spec, plan_min, plan_max)
    (rs,) = [o for o in objects if o["kind"] == "RayService"]
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    options = {d["name"]: d for d in app["deployments"]}
    app_spec = {m["name"]: m for m in app["args"]["spec"]["models"]}
    workers = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for t in plan_min.traffic:
        d = options[deployment_name(t.model)]
        # Serve runs the replicas the plan placed, no autoscaling past them
        assert d["num_replicas"] == t.replicas
        assert "autoscaling_config" not in d
        # each replica admits the chosen batch running and one waiting (spec.admitting),
        # not what the spec's own concurrency would have given
        assert d["max_ongoing_requests"] == max(64, 2 * t.max_num_seqs)
        ranks = d.get("placement_group_bundles") or [{"GPU": d["ray_actor_options"]["num_gpus"]}]
        assert len(ranks) == t.tensor_parallel
        resolved = ModelDeployment.model_validate(app["args"]["deployments"][t.model])
        assert resolved.tensor_parallel == t.tensor_parallel
        assert resolved.engine.max_num_seqs == t.max_num_seqs
        # the spec the app (and doctor) reads says the same
        assert app_spec[t.model]["tensor_parallel"] == t.tensor_parallel
        assert app_spec[t.model]["max_num_seqs"] == t.max_num_seqs
        assert app_spec[t.model]["replicas"]["min"] == t.replicas
        # the engine the app builds from them
        engine = EngineConfig.from_spec(
            parse_spec(app["args"]["spec"], "args.spec").models[
                [m.name for m in spec.models].index(t.model)
            ],
            model_path="/weights",
            settings=resolved.engine,
            tensor_parallel=resolved.tensor_parallel,
        )
        cli = engine.vllm_cli_args()
        assert cli[cli.index("--tensor-parallel-size") + 1] == str(t.tensor_parallel)
        assert cli[cli.index("--max-num-seqs") + 1] == str(t.max_num_seqs)
        # the worker groups hold exactly those replicas, on the pool the plan chose
        mine = [g for g in workers if t.model in g["groupName"]]
        assert sum(g["replicas"] for g in mine) == t.replicas
        assert {g["groupName"].split("-")[0] for g in mine} <= set(t.pools)


def test_node_deployment_carries_the_plans_traffic_choice(
    planned: tuple[FleetSpec, PlanResult, PlanResult],
) -> None:
    spec, plan_min, _ = planned
    fleet = node_deployment(spec, plan_min)
    queued = 0
    for t in plan_min.traffic:
        d = fleet.models[t.model]
        assert d.serve["num_replicas"] == t.replicas
        assert d.tensor_parallel == t.tensor_parallel
        assert d.engine.max_num_seqs == t.max_num_seqs
        assert d.ray.num_gpus == t.tensor_parallel  # whole cards for a TP replica
        queued += d.serve["max_queued_requests"]
    # the ingress bounds the planned replicas' requests, not the spec's one replica's
    assert fleet.ingress_options(spec)["max_ongoing_requests"] > queued
