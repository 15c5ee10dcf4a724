"""The Grafana dashboard model and the ``fleetserve observe`` command."""

from __future__ import annotations

import json

import pytest
import yaml

from fleetserve.cli import main
from fleetserve.observe.dashboard import grafana_dashboard


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = grafana_dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_every_query_uses_the_datasource_variable_and_the_selector() -> None:
    dash = grafana_dashboard({"namespace": "llm"})
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "model"]
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            assert 'namespace="llm"' in target["expr"]
    engine = [p for p in dash["panels"] if p.get("targets") and "vllm" in p["targets"][0]["expr"]]
    assert engine
    assert all('model_name=~"$model"' in t["expr"] for p in engine for t in p["targets"])


def test_dashboard_is_deterministic() -> None:
    assert json.dumps(grafana_dashboard({"namespace": "a"}), sort_keys=True) == json.dumps(
        grafana_dashboard({"namespace": "a"}), sort_keys=True
    )


def test_observe_command_prints_rules_and_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["observe", "rules", "--selector", "namespace=llm"]) == 0
    rules = yaml.safe_load(capsys.readouterr().out)
    assert rules["groups"][0]["rules"][0]["alert"].startswith("FleetServe")
    assert main(["observe", "dashboard"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == "fleetserve"
    assert main(["observe", "rules", "--selector", "oops"]) == 2
    assert "expected LABEL=VALUE" in capsys.readouterr().err
