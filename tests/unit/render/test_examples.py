"""The example fleets through the real planner, the CLI, and ``fleetserve doctor``.

What users run: ``fleetserve render examples/k8s/<fleet>.yaml -o DIR`` then ``fleetserve
doctor DIR``; doctor must find no error (and no warning) in render's own output.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "k8s").glob("*.yaml"))
CRDS = Path(__file__).resolve().parents[4] / "shared" / "k8s" / "crds"


def test_there_are_sliced_and_whole_gpu_examples() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"hami-multi-model", "whole-gpu-tp"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("nodepools", [False, True], ids=["plain", "nodepools"])
def test_example_renders_and_doctor_finds_nothing(
    example: Path, nodepools: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["render", str(example), "-o", str(out)] + (["--with-nodepools"] if nodepools else [])
    assert main(argv) == 0
    files = sorted(p.name for p in out.glob("*.yaml"))
    assert "kustomization.yaml" in files
    assert any(f.startswith("rayservice-") for f in files)
    capsys.readouterr()
    if importlib.util.find_spec("fleetserve.k8s.doctor.command") is None:  # pragma: no cover
        pytest.skip("fleetserve doctor (another area) is not installed")
    # The contract is `fleetserve doctor DIR`; with node pools rendered, also give doctor the
    # fleet spec, so pool rules join the spec's pools with the NodePools.
    doctor = ["doctor", str(out), *([str(example)] if nodepools else []), "--format", "json"]
    if CRDS.is_dir():
        doctor += ["--crds", str(CRDS)]
    code = main(doctor)
    findings: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    problems = [f for f in findings if f["severity"] in ("error", "warning")]
    assert problems == [], json.dumps(problems, indent=2)
    assert code == 0


@pytest.mark.slow
def test_hami_example_uses_slices_and_whole_gpu_example_does_not(tmp_path: Path) -> None:
    seen = {}
    for example in EXAMPLES:
        out = tmp_path / example.stem
        assert main(["render", str(example), "-o", str(out)]) == 0
        rs = yaml.safe_load(next(out.glob("rayservice-*.yaml")).read_text())
        specs = [g["template"]["spec"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
        seen[example.stem] = {s.get("schedulerName") for s in specs}
    assert seen["hami-multi-model"] == {"hami-scheduler"}
    assert seen["whole-gpu-tp"] == {None}


def test_bad_spec_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "fleet.yaml"
    spec.write_text("models: [{name: m, source: x, bogus: 1}]\n")
    assert main(["render", str(spec), "-o", str(tmp_path / "out")]) == 2
    assert "models[0].bogus: unknown key" in capsys.readouterr().err


def test_bad_monitoring_label_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["render", str(EXAMPLES[0]), "-o", str(tmp_path), "--monitoring-label", "x"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_saved_plans_render_the_same_bytes_as_planning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = next(p for p in EXAMPLES if p.stem == "hami-multi-model")
    plans = {}
    for scenario in ("min", "max"):
        assert main(["plan", str(example), "--format", "json", "--scenario", scenario]) == 0
        plans[scenario] = tmp_path / f"{scenario}.json"
        plans[scenario].write_text(capsys.readouterr().out)
    assert main(["render", str(example), "-o", str(tmp_path / "a")]) == 0
    assert main(["render", str(example), "-o", str(tmp_path / "b")]) == 0
    saved = ["--plan-min", str(plans["min"]), "--plan-max", str(plans["max"])]
    assert main(["render", str(example), "-o", str(tmp_path / "c"), *saved]) == 0
    read = {d: {p.name: p.read_bytes() for p in (tmp_path / d).iterdir()} for d in "abc"}
    assert read["a"] == read["b"] == read["c"]


def test_a_bad_plan_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"feasible": true}')
    argv = ["render", str(EXAMPLES[0]), "-o", str(tmp_path / "o")]
    assert main([*argv, "--plan-min", str(bad), "--plan-max", str(bad)]) == 2
    assert "not a fleetserve plan" in capsys.readouterr().err
    assert main([*argv, "--plan-min", str(bad)]) == 2
    assert "give both --plan-min and --plan-max" in capsys.readouterr().err
