"""The dashboard imports into Grafana as is: checked against Grafana's dashboard JSON model.

The rules are Grafana's documented dashboard JSON model (grafana.com/docs/grafana/latest/
dashboards/build-dashboards/view-dashboard-json-model/) and its panel/variable references:
top-level fields and their types, a 24-column grid, unique panel ids, unique refIds per
panel, rows without nested panels when expanded, template variables of known types with the
fields their type needs, and every ``$variable`` a query uses is defined (or a Grafana global).
The rendered ConfigMap carries exactly this JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fleetserve.observe.dashboard import SCHEMA_VERSION, grafana_dashboard

#: Grafana's variable types (dashboard JSON model, templating.list[].type).
VARIABLE_TYPES = {"query", "custom", "constant", "datasource", "interval", "textbox", "adhoc"}
#: Panel types fleetserve uses, all built into Grafana (no plugin to install).
BUILTIN_PANELS = {"row", "timeseries", "table", "stat", "gauge", "bargauge", "text"}
#: Units from Grafana's unit catalogue that the dashboard uses.
KNOWN_UNITS = {"reqps", "percentunit", "s", "ms", "short", "bytes", "percent"}
#: Transformations built into Grafana.
KNOWN_TRANSFORMATIONS = {"merge", "organize", "joinByField", "reduce", "filterFieldsByName"}
#: Grafana's global variables a query may use without defining them.
GLOBALS = {"__rate_interval", "__interval", "__range", "__all"}
TOP_LEVEL: dict[str, type | tuple[type, ...]] = {
    "uid": str,
    "title": str,
    "tags": list,
    "timezone": str,
    "editable": bool,
    "graphTooltip": int,
    "time": dict,
    "templating": dict,
    "annotations": dict,
    "refresh": str,
    "schemaVersion": int,
    "version": int,
    "panels": list,
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    # What an operator pastes into "Import dashboard": the JSON text, round-tripped.
    return json.loads(json.dumps(grafana_dashboard({"namespace": "llm"})))  # type: ignore[no-any-return]


def test_top_level_fields(dashboard: dict[str, Any]) -> None:
    for key, kind in TOP_LEVEL.items():
        assert isinstance(dashboard[key], kind), key
    assert "id" not in dashboard or dashboard["id"] is None  # Grafana assigns ids on import
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["schemaVersion"] == SCHEMA_VERSION >= 36  # datasource refs are objects
    assert dashboard["graphTooltip"] in (0, 1, 2)
    assert set(dashboard["time"]) == {"from", "to"}
    assert isinstance(dashboard["templating"]["list"], list)
    assert isinstance(dashboard["annotations"]["list"], list)


def test_panels_fit_the_grid_and_have_unique_ids(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(isinstance(i, int) and i > 0 for i in ids)
    for panel in dashboard["panels"]:
        assert panel["type"] in BUILTIN_PANELS
        grid = panel["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"}
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        assert grid["w"] > 0
        assert grid["h"] > 0
        if panel["type"] == "row":
            assert panel["collapsed"] is False
            assert panel["panels"] == []  # expanded rows hold no panels of their own
            assert grid["w"] == 24
            assert grid["h"] == 1
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["fieldConfig"]["defaults"]["unit"] in KNOWN_UNITS
        refs = [t["refId"] for t in panel["targets"]]
        assert refs
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert isinstance(target["expr"], str)
            assert target["expr"]
            assert isinstance(target["legendFormat"], str)
        for transformation in panel.get("transformations", []):
            assert transformation["id"] in KNOWN_TRANSFORMATIONS


def test_rows_come_before_their_panels(dashboard: dict[str, Any]) -> None:
    # Grafana groups panels under the row above them by y: every panel sits below a row.
    rows = sorted(p["gridPos"]["y"] for p in dashboard["panels"] if p["type"] == "row")
    assert rows[0] == 0
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert any(r < panel["gridPos"]["y"] for r in rows)


def test_variables_are_well_formed_and_every_reference_is_defined(
    dashboard: dict[str, Any],
) -> None:
    variables = dashboard["templating"]["list"]
    names = [v["name"] for v in variables]
    assert len(names) == len(set(names))
    for var in variables:
        assert var["type"] in VARIABLE_TYPES
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var["name"])
        if var["type"] == "datasource":
            assert var["query"] == "prometheus"  # the datasource plugin id
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert var["query"]["query"].startswith("label_values(")
            assert var["definition"] == var["query"]["query"]
            assert var["refresh"] in (1, 2)
            assert var["includeAll"] is True
            assert var["multi"] is True
    assert names[0] == "datasource"  # the others' datasource is resolved first
    assert {"model", "tenant"} <= set(names)
    text = json.dumps(dashboard["panels"]) + json.dumps(variables[1:])
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))
    assert used - set(names) - GLOBALS == set()
