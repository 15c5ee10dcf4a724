"""``fleetserve doctor --explain RULE`` / ``--list-rules`` and the catalogue links in SARIF."""

from __future__ import annotations

import json

import pytest

from fleetserve.cli import main
from fleetserve.k8s.doctor import catalogue
from fleetserve.k8s.doctor.registry import CATALOGUE_URL, load_rules, rule_info

from .conftest import FIXTURES


def test_explain_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--explain", "resources-set-twice"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# resources-set-twice\n")
    assert "Severity: **error**" in out
    assert f"Versions: {rule_info()['resources-set-twice'].versions_text()}." in out
    assert "```yaml\n" in out
    assert f"{CATALOGUE_URL}#resources-set-twice" in out


def test_explain_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--explain", "schema"]) == 0
    assert "serveConfig" in capsys.readouterr().out


def test_explain_unknown_rule_is_exit_2_with_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--explain", "name-to-long"]) == 2
    err = capsys.readouterr().err
    assert "unknown rule 'name-to-long' (did you mean 'name-too-long'?)" in err
    assert "--list-rules" in err
    assert "Traceback" not in err


def test_list_rules_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--list-rules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["rule", "severity", "versions", "catches"]
    ids = [line.split()[0] for line in lines[1:]]
    assert ids == sorted({*load_rules(), "schema"})
    row = next(line for line in lines if line.startswith("resources-set-twice "))
    assert rule_info()["resources-set-twice"].versions_text() in row


def test_list_rules_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--list-rules", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["rule"] for r in rows} == {*load_rules(), "schema"}
    for r in rows:
        assert r["severity"] in ("error", "warning", "info")
        assert r["versions"]
        assert r["versions"] != "not declared"
        assert r["help_uri"] == f"{CATALOGUE_URL}#{r['rule']}"


def test_paths_are_required_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 2
    assert "give at least one PATH" in capsys.readouterr().err


def test_unknown_rules_filter_points_at_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(FIXTURES), "--rules", "nope"]) == 2
    assert "fleetserve doctor --list-rules" in capsys.readouterr().err


def test_sarif_links_every_rule_to_its_page(capsys: pytest.CaptureFixture[str]) -> None:
    broken = FIXTURES / "replicas-min-gt-max" / "trigger.yaml"
    assert main(["doctor", str(broken), "--format", "sarif"]) == 1
    driver = json.loads(capsys.readouterr().out)["runs"][0]["tool"]["driver"]
    assert driver["informationUri"] == CATALOGUE_URL
    assert driver["rules"]
    for r in driver["rules"]:
        p = catalogue.page(r["id"])
        assert r["helpUri"] == f"{CATALOGUE_URL}#{r['id']}"
        assert r["shortDescription"]["text"] == p.title
        assert r["help"]["markdown"] == p.body()
        assert r["defaultConfiguration"]["level"] in ("error", "warning", "note")
        assert r["properties"]["versions"] == p.versions
