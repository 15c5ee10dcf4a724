"""doctor never aborts on its input (issue #30, item 1): every file it cannot read is a finding
about that file and the run goes on, machine formats stay valid, and a bug in doctor itself is
exit code 3 with a message, not a traceback that reads as "errors found".

The inputs are the shapes that aborted a sweep of public repositories: a clusterloader2
template among KubeRay's samples (benchmark/perf-tests/100-raycluster/raycluster.yaml), a
Serve LLM config with ``tensor_parallel_size: 0`` (ray-operator/config/samples/
ray-service.llm-serve.yaml, changed), a Python 2 script.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetserve.cli import main
from fleetserve.k8s.doctor import command
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory
from fleetserve.k8s.doctor.registry import RULES

from .conftest import FIXTURES

TEMPLATE = FIXTURES / "unrendered-template" / "trigger_clusterloader.yaml"
TP_ZERO = FIXTURES / "engine-arg-invalid" / "trigger_tp_zero.yaml"
BROKEN = FIXTURES / "replicas-min-gt-max" / "trigger.yaml"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A directory as found in a repository: a template, a broken manifest, a Python 2 script."""
    shutil.copy(TEMPLATE, tmp_path / "a_template.yaml")
    shutil.copy(BROKEN, tmp_path / "b_broken.yaml")
    (tmp_path / "c_legacy.py").write_text('print "done"\n', encoding="utf-8")
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_template_does_not_hide_the_other_files(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, str(repo), "--format", "json")
    found = json.loads(out)
    by_rule = {f["rule"]: f for f in found}
    assert code == 1  # b_broken.yaml's error, not an abort
    assert "replicas-min-gt-max" in by_rule
    tpl = by_rule["unrendered-template"]
    assert (tpl["severity"], tpl["file"], tpl["object"]) == (
        "warning",
        str(repo / "a_template.yaml"),
        f"File/{repo / 'a_template.yaml'}",
    )
    assert "{{.Name}} on line 7" in str(tpl["message"])
    legacy = by_rule["input-unreadable"]
    assert (legacy["severity"], legacy["line"]) == ("warning", 1)
    assert "Python syntax error" in str(legacy["message"])
    assert "Traceback" not in err


@pytest.mark.parametrize("fmt", ["sarif", "github", "text"])
def test_every_format_reports_the_unreadable_file(
    repo: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, str(repo), "--format", fmt)
    assert code == 1
    if fmt == "sarif":
        run = json.loads(out)["runs"][0]
        assert {r["ruleId"] for r in run["results"]} >= {"unrendered-template"}
        assert run["invocations"] == [
            {"executionSuccessful": True, "toolExecutionNotifications": []}
        ]
    elif fmt == "github":
        assert f"::warning file={repo / 'a_template.yaml'},line=7" in out
    else:
        assert "unrendered-template" in out


def test_tensor_parallel_zero_is_a_finding_not_a_crash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(capsys, str(TP_ZERO), "--format", "json")
    assert code == 1
    [f] = [f for f in json.loads(out) if f["rule"] == "engine-arg-invalid"]
    assert f["path"] == "spec.serveConfigV2:applications[0].args.llm_configs[0].engine_kwargs" + (
        ".tensor_parallel_size"
    )
    assert "tensor_parallel_size 0" in f["message"]
    assert "internal error" not in err


@pytest.fixture
def crashing_rule() -> Iterator[str]:
    """A rule with a bug: it raises on any input (stands for the IndexError of #30)."""

    def boom(inv: Inventory) -> Iterator[Finding]:
        yield from ()
        raise IndexError("list index out of range")

    RULES["zz-crashes"] = boom
    try:
        yield "zz-crashes"
    finally:
        del RULES["zz-crashes"]


def test_a_crashing_rule_is_exit_3_and_the_others_still_report(
    crashing_rule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, str(BROKEN), "--format", "json")
    assert code == 3
    assert "replicas-min-gt-max" in {f["rule"] for f in json.loads(out)}
    assert f"internal error: rule {crashing_rule} raised IndexError: list index out of range" in err
    assert "test_never_abort.py" not in err  # the innermost frame is named only inside doctor
    assert "Traceback" not in err
    code, out, _ = _run(capsys, str(BROKEN), "--format", "sarif")
    assert code == 3
    [invocation] = json.loads(out)["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    [note] = invocation["toolExecutionNotifications"]
    assert note["descriptor"] == {"id": crashing_rule}
    code, out, _ = _run(capsys, str(BROKEN))
    assert code == 3
    assert "✗" in out
    assert f"rule {crashing_rule} raised" in out


def test_a_bug_outside_the_rules_is_exit_3_with_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken_loader(paths: object) -> Inventory:
        raise KeyError("spec")

    monkeypatch.setattr(command, "load_paths", broken_loader)
    code, out, err = _run(capsys, str(BROKEN), "--format", "json")
    assert code == 3
    assert out == ""
    assert "internal error: doctor raised KeyError: 'spec'" in err
    assert "Traceback" not in err
