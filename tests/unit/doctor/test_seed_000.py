"""Seed 000: Ray Train's hidden +1 CPU (worker limit 4 CPU, resources_per_worker CPU 4)."""

from __future__ import annotations

import json

import pytest

from fleetserve.cli import main

from .conftest import SEEDS, findings_for

SEED = SEEDS / "seed000"


def test_original_reports_the_coordinator_cpu() -> None:
    found = [f for f in findings_for(SEED / "original") if f.severity == "error"]
    assert [f.rule for f in found] == ["train-coordinator-cpu"]
    f = found[0]
    assert f.object == f"ScalingConfig/{SEED / 'original' / 'train.py'}:5"
    assert f.line == 5
    # The seed's arithmetic: rank-0 needs 4 + 1 = 5 CPUs, the node advertises 4.
    assert "bundle 0 needs 5 CPU (4 + 1 trainer)" in f.message
    assert "advertises 4 CPU" in f.message
    assert "whatever num_workers (2)" in f.message
    # Both of the seed's fixes are named.
    assert "limits.cpu to 5" in f.fix
    assert "resources_per_worker CPU to 3" in f.fix


@pytest.mark.parametrize("fix", ["fix_limits", "fix_code"])
def test_both_fixes_from_the_seed_clear_it(fix: str) -> None:
    rules = {f.rule for f in findings_for(SEED / fix)}
    assert "train-coordinator-cpu" not in rules
    assert "infeasible-request" not in rules


def test_cli_exit_code_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", str(SEED / "original"), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert {"rule", "severity", "object", "path", "message", "fix"} <= set(out[0])
    assert "train-coordinator-cpu" in {f["rule"] for f in out}
    assert main(["doctor", str(SEED / "fix_code"), "--format", "json"]) == 0
