"""render(spec, plan_min, plan_max): what the objects say, checked field by field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.serve.schema import ServeDeploySchema

from fleetserve.errors import RenderError
from fleetserve.k8s.render import RenderOptions, render
from fleetserve.k8s.render.groups import plan_worker_groups, tenant_warnings
from fleetserve.plan.deployment import deployment_name
from fleetserve.plan.result import PlanResult, Unplaced
from fleetserve.serve.control.app import BuildArgs
from fleetserve.spec import parse_spec


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def rayservice(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (rs,) = by_kind(objects, "RayService")
    return rs


def groups(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        g["groupName"]: g
        for g in rayservice(objects)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    }


def serve_cfg(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(rayservice(objects)["spec"]["serveConfigV2"])


def test_one_worker_group_per_pool_and_model_with_the_plans_replicas(kit: Any) -> None:
    objects = render(*kit.sliced_fleet())
    g = groups(objects)
    assert sorted(g) == ["a6000-llama-3-8b", "t4-qwen-qwen2-5-7b-" + g_suffix(g)]
    llama = g["a6000-llama-3-8b"]
    assert (llama["replicas"], llama["minReplicas"], llama["maxReplicas"]) == (1, 1, 3)
    qwen = next(v for k, v in g.items() if k.startswith("t4-"))
    assert (qwen["minReplicas"], qwen["maxReplicas"]) == (2, 2)


def g_suffix(g: dict[str, Any]) -> str:
    name = next(k for k in g if k.startswith("t4-"))
    return name.rsplit("-", 1)[1]


def test_hami_slices_scheduler_selector_and_tolerations(kit: Any) -> None:
    objects = render(*kit.sliced_fleet())
    llama = groups(objects)["a6000-llama-3-8b"]["template"]["spec"]
    limits = llama["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert limits["nvidia.com/gpumem"] == "24000"
    assert limits["nvidia.com/gpucores"] == "50"
    assert llama["schedulerName"] == "hami-scheduler"
    assert llama["nodeSelector"] == {"pool": "a6000"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in llama[
        "tolerations"
    ]
    qwen = next(v for k, v in groups(objects).items() if k.startswith("t4-"))
    assert {
        "key": "dedicated",
        "operator": "Equal",
        "value": "inference",
        "effect": "NoSchedule",
    } in qwen["template"]["spec"]["tolerations"]


def test_whole_cards_without_sharing_use_the_default_scheduler(kit: Any) -> None:
    objects = render(*kit.whole_fleet())
    (group,) = groups(objects).values()
    spec = group["template"]["spec"]
    assert "schedulerName" not in spec
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "5", "memory": "64Gi", "nvidia.com/gpu": "4"}


def test_gpu_sharing_none_refuses_a_plan_that_shares_cards(kit: Any) -> None:
    with pytest.raises(RenderError, match=r"shares cards.*card 0: llama-3-8b#0, llama-3-8b#2"):
        render(*kit.sliced_fleet(), RenderOptions(gpu_sharing="none"))


def test_forced_hami_gives_whole_card_pods_gpucores_100(kit: Any) -> None:
    objects = render(*kit.whole_fleet(), RenderOptions(gpu_sharing="hami"))
    spec = next(iter(groups(objects).values()))["template"]["spec"]
    assert spec["schedulerName"] == "hami-scheduler"
    limits = spec["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpucores"], limits["nvidia.com/gpumem"]) == ("100", "81920")


def test_head_takes_no_replicas_and_kuberay_rules_hold(kit: Any) -> None:
    rs = rayservice(render(*kit.sliced_fleet()))
    cluster = rs["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert "headService" not in head
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["version"] == "v2"
    assert "serviceUnhealthySecondThreshold" not in rs["spec"]
    assert head["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    for group in cluster["workerGroupSpecs"]:
        # Never resources in both rayStartParams and the group map (KubeRay rejects it).
        assert not set(group["rayStartParams"]) & {"num-cpus", "num-gpus", "memory", "resources"}
        assert group["template"]["spec"]["restartPolicy"] == "Never"


def test_serve_config_deployments_pin_replicas_to_their_group(kit: Any) -> None:
    objects = render(*kit.sliced_fleet())
    cfg = serve_cfg(objects)
    (app,) = cfg["applications"]
    assert app["import_path"] == "fleetserve.serve.control.app:build_app"
    deps = {d["name"]: d for d in app["deployments"]}
    llama = deps["model-llama-3-8b"]
    assert llama["autoscaling_config"]["min_replicas"] == 1
    assert llama["autoscaling_config"]["max_replicas"] == 3
    assert llama["autoscaling_config"]["target_ongoing_requests"] == 8
    assert "num_replicas" not in llama
    resource = groups(objects)["a6000-llama-3-8b"]["resources"]
    assert llama["ray_actor_options"] == {
        "num_cpus": 1,
        "num_gpus": 1,
        "resources": dict.fromkeys(resource, 1),
    }
    qwen = deps["model-Qwen-Qwen2.5-7B"]
    assert qwen["num_replicas"] == 2
    assert "autoscaling_config" not in qwen
    assert app["args"]["deployments"]["llama-3-8b"]["engine"]["gpu_memory_utilization"] == 0.48


def test_tensor_parallel_uses_one_gpu_bundle_per_rank(kit: Any) -> None:
    deps = serve_cfg(render(*kit.whole_fleet()))["applications"][0]["deployments"]
    (dep,) = deps
    bundles = dep["placement_group_bundles"]
    assert sum(b.get("GPU", 0) for b in bundles) == 4
    assert dep["placement_group_strategy"] == "STRICT_PACK"
    assert dep["ray_actor_options"]["num_gpus"] == 0
    assert set(dep["ray_actor_options"]["resources"]) <= set(bundles[0])


def test_serve_config_is_accepted_by_ray_serve_schema(kit: Any) -> None:
    for make in kit.FLEETS.values():
        ServeDeploySchema.model_validate(serve_cfg(render(*make())))


def test_ray_autoscaler_sees_the_custom_resource_and_gpus(kit: Any) -> None:
    objects = render(*kit.whole_fleet())
    cr = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "vllm", "namespace": "rayserve-vllm"},
        "spec": rayservice(objects)["spec"]["rayClusterConfig"],
    }
    config = _derive_autoscaling_config_from_ray_cr(cr)
    types = config["available_node_types"]
    assert types["headgroup"]["resources"]["CPU"] == 0
    (name,) = [k for k in types if k != "headgroup"]
    worker = types[name]
    resource = next(k for k in worker["resources"] if k.startswith("fleetserve_model_"))
    assert worker["resources"]["GPU"] == 4
    assert worker["resources"][resource] == 1
    assert worker["resources"]["CPU"] == 5
    assert (worker["min_workers"], worker["max_workers"]) == (1, 2)
    bundle = serve_cfg(objects)["applications"][0]["deployments"][0]["placement_group_bundles"]
    # Every bundle of one replica fits one pod together (STRICT_PACK).
    for key in ("CPU", "GPU", resource):
        assert sum(b.get(key, 0) for b in bundle) <= worker["resources"][key]


def test_secrets_are_references_never_values(kit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERNAL_API_KEY", "sk-very-secret")
    objects = render(*kit.sliced_fleet())
    text = yaml.safe_dump_all(objects)
    assert "sk-very-secret" not in text
    env = rayservice(objects)["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    assert {
        "name": "INTERNAL_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llm-env", "key": "INTERNAL_API_KEY"}},
    } in env
    assert {
        "name": "FLEETSERVE_SECRET_CUSTOMER_KEYS_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "customer-keys", "key": "api-key"}},
    } in env
    args_spec = serve_cfg(objects)["applications"][0]["args"]["spec"]
    assert args_spec["tenants"][1]["api_keys"] == [
        {"env": "FLEETSERVE_SECRET_CUSTOMER_KEYS_API_KEY"}
    ]
    assert args_spec["models"][0]["hf_token"] == {"env": "HF_TOKEN"}


def test_app_args_are_what_build_app_accepts(kit: Any) -> None:
    args = serve_cfg(render(*kit.sliced_fleet()))["applications"][0]["args"]
    parsed = BuildArgs.model_validate(args)
    spec = parsed.load_spec()
    assert parsed.deployments is not None
    assert set(parsed.deployments) == {m.name for m in spec.models}
    app = serve_cfg(render(*kit.sliced_fleet()))["applications"][0]
    deployments = {d["name"] for d in app["deployments"]}
    assert {deployment_name(m.name) for m in spec.models} <= deployments


def test_monitoring_objects_carry_the_selector_label(kit: Any) -> None:
    objects = render(*kit.sliced_fleet())
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        for obj in by_kind(objects, kind):  # the sliced fleet also scrapes HAMi's monitor
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    custom = render(*kit.sliced_fleet(), RenderOptions(monitoring_labels={"prometheus": "main"}))
    (rule,) = by_kind(custom, "PrometheusRule")
    assert rule["metadata"]["labels"]["prometheus"] == "main"
    assert "release" not in rule["metadata"]["labels"]
    (pm,) = by_kind(objects, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"]["ray.io/node-type"] == "worker"
    sm, hami = by_kind(objects, "ServiceMonitor")
    assert hami["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["spec"]["selector"]["matchLabels"]["ray.io/originated-from-cr-name"] == "llm"
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all('namespace="llm-serving"' in e for e in exprs)
    (dash,) = [
        o for o in by_kind(objects, "ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]
    ]
    assert "ray_vllm_time_to_first_token_seconds_bucket" in next(iter(dash["data"].values()))


def test_network_policy_opens_only_the_serve_port_to_everyone(kit: Any) -> None:
    (policy,) = by_kind(render(*kit.sliced_fleet()), "NetworkPolicy")
    rules = policy["spec"]["ingress"]
    everyone = [
        {"namespaceSelector": {}},
        {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {"ipBlock": {"cidr": "::/0"}},
    ]
    open_rules = [r for r in rules if r.get("from") == everyone]
    assert open_rules == [{"from": everyone, "ports": [{"port": 8000, "protocol": "TCP"}]}]
    restricted = {
        r["ports"][0]["port"]: r["from"][0]["namespaceSelector"]["matchLabels"]
        for r in rules
        if "ports" in r and r["from"] != everyone
    }
    assert restricted == {
        8080: {"kubernetes.io/metadata.name": "kube-prometheus-stack"},
        8265: {"kubernetes.io/metadata.name": "kuberay-operator"},
    }
    assert all(10001 not in [p["port"] for p in r.get("ports", [])] for r in rules)


def test_pods_meet_the_restricted_pod_security_profile(kit: Any) -> None:
    rs = rayservice(render(*kit.sliced_fleet()))
    cluster = rs["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    for template in templates:
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc.get("privileged") is False
            assert "hostPort" not in str(container["ports"])
    assert cluster["autoscalerOptions"]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_nodepools_match_the_pool_labels_and_taints(kit: Any) -> None:
    objects = render(*kit.sliced_fleet(), RenderOptions(with_nodepools=True))
    pools = {o["metadata"]["name"]: o for o in by_kind(objects, "NodePool")}
    assert sorted(pools) == ["a6000", "cpu", "t4"]
    a6000 = pools["a6000"]["spec"]
    assert a6000["template"]["metadata"]["labels"] == {"pool": "a6000"}
    reqs = {r["key"]: r for r in a6000["template"]["spec"]["requirements"]}
    assert reqs["karpenter.k8s.aws/instance-gpu-count"]["values"] == ["2"]
    assert a6000["limits"]["nvidia.com/gpu"] == "4"
    assert a6000["template"]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    ]
    assert not by_kind(render(*kit.sliced_fleet()), "NodePool")


def test_an_infeasible_plan_is_refused_with_the_planners_reasons(kit: Any) -> None:
    spec, plan_min, plan_max = kit.sliced_fleet()
    bad = PlanResult(
        **{
            **plan_max.model_dump(),
            "feasible": False,
            "unplaced": [Unplaced(model="llama-3-8b", index=2, reason="no card has 24000 MiB")],
        }
    )
    with pytest.raises(RenderError, match=r"max plan is not feasible.*llama-3-8b#2: no card"):
        render(spec, plan_min, bad)


def test_a_model_with_two_pod_shapes_is_refused(kit: Any) -> None:
    data = copy.deepcopy(kit.SLICED_SPEC)
    data["models"][0]["pools"] = ["a6000", "t4"]
    spec = parse_spec(data)
    _, plan_min, plan_max = kit.sliced_fleet()
    odd = kit.place("llama-3-8b", 2, "t4", 0, [1], 15000, 90, 0.9)
    with pytest.raises(RenderError, match=r"two pod shapes.*pool a6000.*pool t4"):
        render(spec, plan_min, kit.plan([*plan_max.replicas[:2], odd, *plan_max.replicas[3:]]))


def test_pools_that_share_their_labels_are_refused(kit: Any) -> None:
    data = copy.deepcopy(kit.SLICED_SPEC)
    data["pools"][2]["labels"] = {"pool": "a6000", "family": "turing"}
    _, plan_min, plan_max = kit.sliced_fleet()
    with pytest.raises(RenderError, match=r"pool 'a6000'.*pool 't4' also carries"):
        render(parse_spec(data), plan_min, plan_max)


def test_ray_version_must_match_the_image(kit: Any) -> None:
    data = copy.deepcopy(kit.WHOLE_SPEC)
    data["kubernetes"]["image"] = "rayproject/ray:2.35.0-py311-cu121"
    _, plan_min, plan_max = kit.whole_fleet()
    with pytest.raises(RenderError, match=r"ray_version \(2.60.0\).*2.35.0"):
        render(parse_spec(data), plan_min, plan_max)


def test_pods_that_do_not_fit_their_node_are_refused(kit: Any) -> None:
    data = copy.deepcopy(kit.WHOLE_SPEC)
    data["models"][0]["resources"] = {"cpu": 60, "memory_gb": 64}
    _, plan_min, plan_max = kit.whole_fleet()
    with pytest.raises(RenderError, match=r"pool p4de node 0: its 2 replica pods .* need 120 CPUs"):
        render(parse_spec(data), plan_min, plan_max)


def test_a_plan_with_the_wrong_card_count_for_tp_is_refused(kit: Any) -> None:
    spec, _, _ = kit.whole_fleet()
    wrong = kit.plan([kit.place("llama-3-70b", 0, "p4de", 0, [0, 1], 81920, 100, 0.9)])
    with pytest.raises(RenderError, match=r"2 card\(s\) but tensor_parallel \(4\)"):
        render(spec, wrong, wrong)


def test_runtime_env_pip_installs_the_app_when_the_image_lacks_it(kit: Any) -> None:
    plain = serve_cfg(render(*kit.whole_fleet()))["applications"][0]
    assert "runtime_env" not in plain
    pip = ["fleetserve @ https://example.com/fleetserve-0.1.0-py3-none-any.whl"]
    app = serve_cfg(render(*kit.whole_fleet(), RenderOptions(runtime_env_pip=pip)))
    assert app["applications"][0]["runtime_env"] == {"pip": pip}
    ServeDeploySchema.model_validate(app)


def test_inside_a_hami_slice_the_engine_gets_the_slice_fraction(kit: Any) -> None:
    spec, plan_min, plan_max = kit.sliced_fleet()

    def with_slice(p: PlanResult) -> PlanResult:
        reps = [
            r.model_copy(
                update={"engine": r.engine.model_copy(update={"slice_memory_utilization": 0.95})}
            )
            for r in p.replicas
        ]
        return kit.plan(reps)

    args = serve_cfg(render(spec, with_slice(plan_min), with_slice(plan_max)))["applications"][0][
        "args"
    ]
    assert args["deployments"]["llama-3-8b"]["engine"]["gpu_memory_utilization"] == 0.95
    whole = serve_cfg(render(*kit.whole_fleet()))["applications"][0]["args"]
    assert whole["deployments"]["llama-3-70b"]["engine"]["gpu_memory_utilization"] == 0.9


def test_a_dedicated_tenant_sharing_a_hami_pool_is_warned_about(kit: Any) -> None:
    data = copy.deepcopy(kit.SLICED_SPEC)
    data["tenants"][1]["isolation"] = "dedicated"
    data["models"][0]["tenant"] = "customer"
    data["models"][1]["tenant"] = "internal"
    data["models"][1]["pools"] = ["a6000"]
    spec = parse_spec(data)
    _, plan_min, plan_max = kit.sliced_fleet()
    moved = [
        r.model_copy(update={"pool": "a6000", "node": 1}) if r.pool == "t4" else r
        for r in plan_max.replicas
    ]
    groups = plan_worker_groups(spec, plan_min.model_copy(update={"replicas": []}), kit.plan(moved))
    (warning,) = tenant_warnings(spec, groups, hami=True)
    assert "dedicated tenant 'customer' (llama-3-8b) shares pool 'a6000'" in warning
    assert tenant_warnings(spec, groups, hami=False) == []
