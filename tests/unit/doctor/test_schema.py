"""Schema validation: CRD OpenAPI schemas (+ CEL rules) and core kinds (kubernetes-validate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.errors import InputFileError
from fleetserve.k8s.doctor.loader import load_paths, load_text
from fleetserve.k8s.doctor.schema import CrdSchemas, CrdValidator, validate_schemas

from .conftest import FIXTURES, SEEDS

SCHEMA = FIXTURES / "schema"


def _schema(path: Path, crds: Path | None) -> list[tuple[str, str, int | None]]:
    report = validate_schemas(load_paths([path]), crds)
    assert all(f.rule == "schema" and f.severity == "error" for f in report.findings)
    return [(f.path, f.message, f.line) for f in report.findings]


def test_wrong_type(crds_dir: Path) -> None:
    [(path, message, line)] = _schema(SCHEMA / "wrong_type.yaml", crds_dir)
    assert path == "spec.headGroupSpec.rayStartParams.num-cpus"
    assert "must be of type string" in message
    assert line == 9


def test_unknown_fields(crds_dir: Path) -> None:
    found = {p: m for p, m, _ in _schema(SCHEMA / "unknown_field.yaml", crds_dir)}
    assert set(found) == {
        "spec.headGroupSpec.rayStartParam",
        "spec.workerGroupSpecs[0].replica",
    }
    assert 'unknown field "rayStartParam"' in found["spec.headGroupSpec.rayStartParam"]


def test_unknown_field_fix_suggests_the_name(crds_dir: Path) -> None:
    report = validate_schemas(load_paths([SCHEMA / "unknown_field.yaml"]), crds_dir)
    fixes = {f.path: f.fix for f in report.findings}
    assert "did you mean 'rayStartParams'" in fixes["spec.headGroupSpec.rayStartParam"]
    assert "did you mean 'replicas'" in fixes["spec.workerGroupSpecs[0].replica"]


def test_cel_rule_violation(crds_dir: Path) -> None:
    [(path, message, line)] = _schema(SCHEMA / "cel_violation.yaml", crds_dir)
    assert path == "spec.managedBy"
    assert "the managedBy field value must be either" in message
    assert line == 7


def test_cel_rule_on_object(crds_dir: Path) -> None:
    text = """
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: j}
spec:
  entrypoint: python x.py
  deletionStrategy:
    onSuccess: {policy: DeleteCluster}
    onFailure: {policy: DeleteCluster}
    deletionRules:
      - policy: DeleteCluster
        condition: {jobStatus: SUCCEEDED, ttlSeconds: 10}
"""
    found = validate_schemas(load_text(text), crds_dir).findings
    assert any("cannot be used together" in f.message for f in found), found


def test_valid_objects_pass(crds_dir: Path) -> None:
    assert _schema(SCHEMA / "valid.yaml", crds_dir) == []
    # Transition rules (self == oldSelf) only run on update and must not fire on create.
    assert _schema(SEEDS / "seed000" / "original" / "raycluster.yaml", crds_dir) == []


def test_api_version_not_served(crds_dir: Path) -> None:
    text = "apiVersion: ray.io/v1alpha9\nkind: RayService\nmetadata: {name: x}\nspec: {}\n"
    [f] = validate_schemas(load_text(text), crds_dir).findings
    assert f.path == "apiVersion"
    assert "ray.io/v1" in f.fix


def test_label_values_must_be_strings(crds_dir: Path) -> None:
    text = (
        "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: x\n  labels:\n"
        "    version: 2\nspec:\n  headGroupSpec:\n    template:\n      spec:\n"
        "        containers: [{name: h, image: i}]\n"
    )
    [f] = validate_schemas(load_text(text), crds_dir).findings
    assert f.path == "metadata.labels.version"
    assert 'version: "2"' in f.fix


def test_core_kinds_with_kubernetes_validate() -> None:
    report = validate_schemas(load_paths([SCHEMA / "core_kinds.yaml"]), None)
    by_object = {(f.object, f.path) for f in report.findings}
    assert ("Service/default/serve", "spec.ports[0].port") in by_object
    assert any(o == "ConfigMap/default/settings" for o, _ in by_object)
    assert not any(o.startswith("Secret/") for o, _ in by_object)


def test_custom_resources_without_crds_are_listed_as_unchecked() -> None:
    report = validate_schemas(load_paths([SCHEMA / "wrong_type.yaml"]), None)
    assert report.findings == []
    assert report.unchecked == ["RayCluster/default/typed"]


def test_crds_among_the_inputs_are_used(crds_dir: Path, tmp_path: Path) -> None:
    crd = (crds_dir / "ray.io_rayclusters.yaml").read_text(encoding="utf-8")
    (tmp_path / "crd.yaml").write_text(crd, encoding="utf-8")
    (tmp_path / "x.yaml").write_text(
        (SCHEMA / "wrong_type.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    found = validate_schemas(load_paths([tmp_path]), None).findings
    assert [f.path for f in found] == ["spec.headGroupSpec.rayStartParams.num-cpus"]


def test_bad_crds_dir(tmp_path: Path) -> None:
    with pytest.raises(InputFileError):
        CrdSchemas.from_dir(tmp_path / "missing")
    (tmp_path / "bad.yaml").write_text("a: [1,\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"bad\.yaml:"):
        CrdSchemas.from_dir(tmp_path)


def test_validator_protocol_fake() -> None:
    # The chain asks validators in order; the first that knows a kind decides.
    class Fake:
        def validate(self, m):  # type: ignore[no-untyped-def]
            return [] if m.kind == "Known" else None

    inv = load_text("kind: Known\nmetadata: {name: a}\n---\nkind: Other\nmetadata: {name: b}\n")
    report = validate_schemas(inv, chain=[Fake(), CrdValidator(CrdSchemas())])
    assert report.findings == []
    assert report.unchecked == ["Other/default/b"]


def test_only_needed_crds_are_parsed(crds_dir: Path) -> None:
    schemas = CrdSchemas.from_dir(crds_dir, {("ray.io", "RayJob")})
    assert list(schemas.versions) == [("ray.io", "RayJob")]
    assert len(CrdSchemas.from_dir(crds_dir).versions) == 6


_POD_TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata: {name: driver}
spec:
  nodeSelector: {pool: spark}
  tolerations: [{key: spark, operator: Exists, effect: NoSchedule}]
"""


def test_spark_pod_template_files_need_no_containers(tmp_path: Path) -> None:
    template = tmp_path / "driver-pod-template.yaml"
    template.write_text(_POD_TEMPLATE, encoding="utf-8")
    assert validate_schemas(load_paths([template]), None).findings == []
    # Wrong fields still count in a template; and a plain Pod file needs its containers.
    template.write_text(_POD_TEMPLATE + "  restartPolicy: 3\n", encoding="utf-8")
    [wrong] = validate_schemas(load_paths([template]), None).findings
    assert wrong.path == "spec.restartPolicy"
    pod = tmp_path / "driver.yaml"
    pod.write_text(_POD_TEMPLATE, encoding="utf-8")
    [missing] = validate_schemas(load_paths([pod]), None).findings
    assert "'containers' is a required property" in missing.message


def test_an_object_one_of_the_inputs_crds_accepts_is_no_error() -> None:
    # production-stack carries a stale install bundle beside its CRD bases: the samples follow
    # the bases, and whichever file loads last must not make them schema errors.
    folder = SCHEMA / "two_crds_one_kind"
    assert validate_schemas(load_paths([folder])).findings == []
    for first, second in (("bundle", "bases"), ("bases", "bundle")):
        files = [folder / f"{first}.yaml", folder / f"{second}.yaml", folder / "sample.yaml"]
        assert validate_schemas(load_paths(files)).findings == []


def test_an_object_no_input_crd_accepts_is_still_an_error() -> None:
    folder = SCHEMA / "two_crds_one_kind"
    sample = (
        (folder / "sample.yaml")
        .read_text(encoding="utf-8")
        .replace("hfTokenKeyName: token", "hfTokenKey: token")
    )
    text = "\n---\n".join(
        [
            (folder / "bundle.yaml").read_text(encoding="utf-8"),
            (folder / "bases.yaml").read_text(encoding="utf-8"),
            sample,
        ]
    )
    [f] = validate_schemas(load_text(text)).findings
    assert f.path == "spec.hfTokenSecret.hfTokenKey"
