"""``fleetserve doctor``: exit codes, JSON contract, rule selection, readable report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.cli import main
from fleetserve.k8s.doctor.command import diagnose

from .conftest import FIXTURES, SEEDS

SCHEDULING_AND_KUBERAY = [
    "train-coordinator-cpu",
    "infeasible-request",
    "ingress-starved",
    "serve-replicas-exceed-workers",
    "head-schedulable",
    "resources-set-twice",
    "advertised-vs-limit",
    "cpu-rounding",
    "node-selector-no-pool",
    "missing-gpu-toleration",
    "replicas-min-gt-max",
    "rayservice-head-service-name",
    "name-too-long",
    "upgrade-strategy",
    "autoscaler-v2-restart-policy",
    "gcs-ft-conflict",
    "deprecated-threshold",
]
CLEAN = FIXTURES / "head-schedulable" / "near_miss.yaml"
BROKEN = FIXTURES / "replicas-min-gt-max" / "trigger.yaml"
BROKEN_LINE = BROKEN.read_text(encoding="utf-8").splitlines().index("        minReplicas: 4") + 1


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, object]]]:
    code = main(["doctor", *argv, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_exit_0_without_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _json(capsys, str(CLEAN))
    assert code == 0
    assert all(f["severity"] != "error" for f in found)


def test_exit_1_with_errors_and_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _json(capsys, str(BROKEN))
    assert code == 1
    f = next(f for f in found if f["rule"] == "replicas-min-gt-max")
    assert f == {
        "rule": "replicas-min-gt-max",
        "severity": "error",
        "object": "RayService/serving/llm",
        "path": "spec.rayClusterConfig.workerGroupSpecs[0].minReplicas",
        "message": f["message"],
        "fix": f["fix"],
        "file": str(BROKEN),
        "line": BROKEN_LINE,
    }
    assert "minReplicas 4 greater than maxReplicas 2" in str(f["message"])


def test_unreadable_input_is_a_finding_and_a_missing_path_is_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RayService\nspec: [\n", encoding="utf-8")
    code, found = _json(capsys, str(bad))
    assert code == 1
    assert [(f["rule"], f["file"], f["line"]) for f in found] == [("input-unreadable", str(bad), 3)]
    assert main(["doctor", str(tmp_path / "missing")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_rules_filter(capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _json(
        capsys, str(SEEDS / "seed002" / "original"), "--rules", "deprecated-threshold"
    )
    assert code == 0  # info only
    assert {f["rule"] for f in found} == {"deprecated-threshold"}
    assert main(["doctor", str(CLEAN), "--rules", "no-such-rule"]) == 2
    assert "unknown rule id(s) no-such-rule" in capsys.readouterr().err


def test_schema_selected_with_crds(crds_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = FIXTURES / "schema" / "wrong_type.yaml"
    code, found = _json(capsys, str(wrong), "--crds", str(crds_dir), "--rules", "schema")
    assert code == 1
    assert [f["rule"] for f in found] == ["schema"]
    assert main(["doctor", str(wrong), "--crds", str(wrong)]) == 2


def test_k8s_version(capsys: pytest.CaptureFixture[str]) -> None:
    core = FIXTURES / "schema" / "core_kinds.yaml"
    code, found = _json(capsys, str(core), "--k8s-version", "1.30", "--rules", "schema")
    assert code == 1
    assert any("Kubernetes 1.30" in str(f["message"]) for f in found)
    assert main(["doctor", str(core), "--k8s-version", "1.2"]) == 2
    assert main(["doctor", str(core), "--k8s-version", "latest"]) == 2
    # Versions compare as numbers (1.99 > 1.37): a newer cluster gets the newest schemas.
    code, found = _json(capsys, str(core), "--k8s-version", "v1.99.1", "--rules", "schema")
    assert code == 1


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(BROKEN)]) == 1
    out = capsys.readouterr().out
    assert "RayService/serving/llm" in out
    assert "replicas-min-gt-max" in out
    assert f"{BROKEN}:{BROKEN_LINE}" in out
    assert "fix:" in out
    assert "error" in out.splitlines()[-1]


def test_output_is_deterministic() -> None:
    paths = [str(FIXTURES), str(SEEDS)]
    first = [f.to_json() for f in diagnose(paths).findings]
    assert first == [f.to_json() for f in diagnose(paths).findings]


def test_argument_order_does_not_change_the_report() -> None:
    # Scheduling and KubeRay rules join objects across files; their messages list the
    # joined objects in a canonical order.
    paths = [str(FIXTURES), str(SEEDS)]
    rules = set(SCHEDULING_AND_KUBERAY)
    first = [f.to_json() for f in diagnose(paths, rules=rules).findings]
    again = [f.to_json() for f in diagnose(list(reversed(paths)), rules=rules).findings]
    assert first == again


def test_fail_on_warning(capsys: pytest.CaptureFixture[str]) -> None:
    warn_only = FIXTURES / "head-schedulable" / "trigger.yaml"
    assert main(["doctor", str(warn_only), "--rules", "head-schedulable"]) == 0
    assert (
        main(["doctor", str(warn_only), "--rules", "head-schedulable", "--fail-on", "warning"]) == 1
    )


def test_ignore_annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BROKEN.read_text(encoding="utf-8").replace(
        "  namespace: serving\n",
        "  namespace: serving\n  annotations:\n"
        '    doctor.fleetserve.io/ignore: "replicas-min-gt-max, serve-replicas-exceed-workers"\n',
        1,
    )
    (tmp_path / "x.yaml").write_text(text, encoding="utf-8")
    result = diagnose([str(tmp_path / "x.yaml")])
    assert not {"replicas-min-gt-max", "serve-replicas-exceed-workers"} & {
        f.rule for f in result.findings
    }
    assert result.suppressed == 3  # min > max, plus both sides of the GPU arithmetic
    assert main(["doctor", str(tmp_path / "x.yaml")]) == 0
    assert "(3 silenced by annotation)" in capsys.readouterr().out


def test_sarif_and_github_formats(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(BROKEN), "--format", "sarif"]) == 1
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["version"] == "2.1.0"
    run = sarif["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    result = next(r for r in run["results"] if r["ruleId"] == "replicas-min-gt-max")
    assert ids[result["ruleIndex"]] == "replicas-min-gt-max"
    assert result["level"] == "error"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == str(BROKEN)
    assert location["region"]["startLine"] == BROKEN_LINE

    assert main(["doctor", str(BROKEN), "--format", "github"]) == 1
    lines = capsys.readouterr().out.splitlines()
    mine = next(line for line in lines if "title=replicas-min-gt-max" in line)
    assert mine.startswith(f"::error file={BROKEN},line={BROKEN_LINE},title=replicas-min-gt-max")
    assert "\n" not in mine
