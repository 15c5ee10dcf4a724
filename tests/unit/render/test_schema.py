"""Every rendered object is valid: custom resources against the CRD schemas in
../shared/k8s/crds (unknown fields rejected), core kinds against Kubernetes' own schemas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from fleetserve.k8s.render import RenderOptions, render

K8S_VERSION = "1.33"
#: Kinds with no schema available offline (Karpenter's CRD is not in shared/k8s).
_NO_SCHEMA = {"NodePool"}


def _all_objects(kit: Any) -> list[dict[str, Any]]:
    out = []
    for make in kit.FLEETS.values():
        out += render(*make(), RenderOptions(with_nodepools=True))
    return out


@pytest.mark.usefixtures("crds_present")
def test_custom_resources_match_their_crd(kit: Any) -> None:
    checked = set()
    for obj in _all_objects(kit):
        if obj["kind"] in _NO_SCHEMA or obj["apiVersion"] in ("v1", "networking.k8s.io/v1"):
            continue
        errors = kit.crd_errors(obj)
        assert errors is not None, f"no CRD for {obj['apiVersion']} {obj['kind']}"
        assert errors == [], f"{obj['kind']}/{obj['metadata']['name']}: {errors}"
        checked.add(obj["kind"])
    assert checked == {"RayService", "ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.mark.usefixtures("crds_present")
def test_the_crd_check_is_real(kit: Any) -> None:
    rs = next(o for o in render(*kit.whole_fleet()) if o["kind"] == "RayService")
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "two"
    rs["spec"]["rayClusterConfig"]["headGroupSpec"]["bogus"] = 1
    errors = kit.crd_errors(rs)
    assert any("maxReplicas" in e for e in errors)
    assert any("bogus" in e for e in errors)


def test_core_objects_match_kubernetes_schemas(kit: Any) -> None:
    kinds = set()
    for obj in _all_objects(kit):
        if obj["apiVersion"] in ("v1", "networking.k8s.io/v1"):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            kinds.add(obj["kind"])
    assert kinds == {"Namespace", "NetworkPolicy", "ConfigMap"}


def test_nodepools_have_karpenters_required_fields(kit: Any) -> None:
    pools = [o for o in _all_objects(kit) if o["kind"] == "NodePool"]
    assert pools
    for pool in pools:
        assert pool["apiVersion"] == "karpenter.sh/v1"
        template = pool["spec"]["template"]["spec"]
        assert set(template["nodeClassRef"]) == {"group", "kind", "name"}
        for req in template["requirements"]:
            assert req["operator"] in {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
            assert all(isinstance(v, str) for v in req["values"])
