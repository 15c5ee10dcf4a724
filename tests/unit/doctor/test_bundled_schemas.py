"""KubeRay's CRD schemas ship with fleetserve in a compact derived form (issue #30, item 6), so
the default offline run checks schemas: the three real bugs of issue #11 (a v1alpha1
RayService with the removed ``spec.serveConfig``, a misplaced ``template.schedulerName``, a
non-string nodeSelector value) are found with an empty cache and no network, as ``--crds``
finds them. The shipped file must be what ``bundled.py`` derives from the release's CRDs
(../shared/k8s/crds: KubeRay v1.7.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.k8s.doctor import bundled
from fleetserve.k8s.doctor.command import diagnose
from fleetserve.modelstore.store import CACHE_ENV

from .conftest import CRDS, SHARED_CRD_VERSIONS
from .test_crd_cache import BUGS, EXPECTED, NEAR_MISS


def test_compact_drops_prose_but_keeps_a_field_named_description() -> None:
    schema = {
        "type": "object",
        "description": "prose",
        "properties": {
            "description": {"type": "string", "description": "prose", "maxLength": 3},
            "items": {"type": "array", "items": {"type": "integer", "example": 1}},
        },
        "x-kubernetes-validations": [{"rule": "self.x > 0", "message": "m"}],
    }
    assert bundled.compact(schema) == {
        "type": "object",
        "properties": {
            "description": {"type": "string", "maxLength": 3},
            "items": {"type": "array", "items": {"type": "integer"}},
        },
        "x-kubernetes-validations": [{"rule": "self.x > 0", "message": "m"}],
    }


@pytest.mark.skipif(not CRDS.is_dir(), reason=f"CRDs not found at {CRDS}")
def test_the_shipped_schemas_are_derived_from_the_release() -> None:
    version = SHARED_CRD_VERSIONS["kuberay"]
    derived = bundled.derive(sorted(CRDS.glob("ray.io_*.yaml")), "kuberay", version)
    shipped = bundled.bundled("kuberay", version)
    assert shipped == derived, (
        "re-derive: python -m fleetserve.k8s.doctor.bundled kuberay "
        f"{version} ../shared/k8s/crds --group ray.io"
    )
    assert {c["kind"] for c in derived["crds"]} == {"RayCluster", "RayJob", "RayService"}
    assert version in bundled.bundled_versions("kuberay")


def test_default_offline_run_with_an_empty_cache_checks_schemas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    bugs = tmp_path / "bugs.yaml"
    bugs.write_text(BUGS, encoding="utf-8")
    result = diagnose([str(bugs)], rules={"schema"})
    assert {f.path for f in result.findings} == EXPECTED
    assert result.notes == ()  # the release wanted (the newest known) is the one shipped
    near = tmp_path / "near.yaml"
    near.write_text(NEAR_MISS, encoding="utf-8")
    assert diagnose([str(near)], rules={"schema"}).findings == []
    assert not (tmp_path / "empty-cache").exists(), "an offline run must not write the cache"


def test_a_placeholder_value_is_not_a_schema_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shape of awslabs/data-on-eks data-stacks/ray-on-eks/examples/raydata-sparklogs-processing-
    # job/rayjob.yaml: worker counts filled in by envsubst before kubectl apply.
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    job = tmp_path / "rayjob.yaml"
    job.write_text(
        "apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: logs}\nspec:\n"
        "  entrypoint: python job.py\n  rayClusterSpec:\n    headGroupSpec:\n"
        "      rayStartParams: {}\n      template:\n        spec:\n"
        "          containers: [{name: ray-head, image: rayproject/ray:2.52.0}]\n"
        "    workerGroupSpecs:\n    - groupName: workers\n      replicas: $INITIAL_WORKERS\n"
        "      minReplicas: $MIN_WORKERS\n      maxReplicas: 4\n      rayStartParams: {}\n"
        "      template:\n        spec:\n"
        "          containers: [{name: ray-worker, image: rayproject/ray:2.52.0}]\n",
        encoding="utf-8",
    )
    assert diagnose([str(job)], rules={"schema"}).findings == []
    job.write_text(job.read_text("utf-8").replace("maxReplicas: 4", 'maxReplicas: "4"'), "utf-8")
    [f] = diagnose([str(job)], rules={"schema"}).findings
    assert f.path == "spec.rayClusterSpec.workerGroupSpecs[0].maxReplicas"


#: KubeRay's operator Deployment (ray-operator/config/manager/manager.yaml) naming a release.
_OPERATOR = """\
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kuberay-operator}
spec:
  selector: {matchLabels: {app: kuberay}}
  template:
    metadata: {labels: {app: kuberay}}
    spec:
      containers: [{name: op, image: "quay.io/kuberay/operator:v1.5.0"}]
"""


def test_the_release_the_input_names_decides_the_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # spec.networkPolicy appeared in KubeRay 1.7 (ray-operator/config/samples/
    # ray-cluster.network-policy-deny-all.yaml): with operator 1.5.0 named, the shipped 1.5.2
    # schemas check it and the field is unknown there; without a version, 1.7.0's accept it.
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    cluster = (
        "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: c}\nspec:\n"
        "  networkPolicy: {mode: DenyAll}\n  headGroupSpec:\n    rayStartParams: {}\n"
        "    template:\n      spec:\n"
        "        containers: [{name: ray-head, image: rayproject/ray:2.52.0}]\n"
    )
    newest = tmp_path / "newest.yaml"
    newest.write_text(cluster, encoding="utf-8")
    assert diagnose([str(newest)], rules={"schema"}).findings == []
    old = tmp_path / "old.yaml"
    old.write_text(cluster + _OPERATOR, encoding="utf-8")
    result = diagnose([str(old)], rules={"schema"})
    assert [f.path for f in result.findings] == ["spec.networkPolicy"]
    [note] = result.notes
    assert "KubeRay 1.5.2 (shipped with fleetserve) CRDs, not 1.5.0" in note
    assert set(bundled.bundled_versions("kuberay")) >= {"1.3.2", "1.4.2", "1.5.2", "1.6.2", "1.7.0"}
