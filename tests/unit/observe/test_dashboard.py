"""The Grafana dashboard model and the ``fleetserve observe`` command."""

from __future__ import annotations

import json

import pytest
import yaml

from fleetserve.cli import main
from fleetserve.observe.dashboard import (
    NEEDS_REASON,
    dashboard_panels,
    dashboard_queries,
    grafana_dashboard,
)


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
    assert names == ["datasource", "model", "tenant"]
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            assert 'namespace="llm"' in target["expr"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    vllm = [e for e in exprs if "ray_vllm_" in e]
    gateway = [e for e in exprs if "ray_fleetserve_gateway_" in e]
    assert vllm
    assert gateway
    assert all('model_name=~"$model"' in e for e in vllm)
    assert all('model=~"$model"' in e and 'tenant=~"$tenant"' in e for e in gateway)


def test_front_door_reads_the_gateway_not_serves_proxy() -> None:
    # With direct ingress Serve's proxy never sees a request: the front door is the gateway.
    panels = dashboard_panels()
    front = panels[:3]
    assert all("ray_fleetserve_gateway_" in t.expr for p in front for t in p.targets)
    assert not any("ray_serve_num_http" in q or "ray_serve_http" in q for q in dashboard_queries())


def test_panels_say_what_they_need() -> None:
    dash = grafana_dashboard()
    by_title = {p["title"]: p for p in dash["panels"]}
    for panel in dashboard_panels():
        described = by_title[panel.title]["description"]
        if panel.needs == "fleet":
            assert "Needs" not in described
        else:
            assert NEEDS_REASON[panel.needs] in described
    hami = [p for p in dashboard_panels() if p.needs == "kubernetes-hami"]
    assert hami
    for panel in hami:
        exprs = " ".join(t.expr for t in panel.targets)
        assert "on (namespace, pod) group_left (model_name)" in exprs or "ray_vllm_" in exprs


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
