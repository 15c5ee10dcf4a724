"""Every rule of the pitfall catalogue has a trigger that raises it and a near miss that does not.

The rule ids and severities come from ../shared/docs/pitfalls.md, so a rule missing from the
code (or without fixtures) shows up here as a failure. Fixtures live in
tests/fixtures/doctor/<rule-id>/: ``trigger*`` / ``near_miss*``, each a YAML or Python file or
a directory of them (for rules that join several objects).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetserve.k8s.doctor.registry import load_rules

from .conftest import FIXTURES, PITFALLS, findings_for

_ROW = re.compile(r"^\|\s*`([a-z0-9-]+)`\s*\|\s*(error|warning|info)\s*\|", re.MULTILINE)


def catalogue() -> dict[str, str]:
    """rule id -> severity, from the pitfall catalogue."""
    if not PITFALLS.is_file():
        return {}
    return dict(_ROW.findall(PITFALLS.read_text(encoding="utf-8")))


CATALOGUE = catalogue()


def cases(prefix: str) -> list[tuple[str, Path]]:
    out = []
    for rule_id in sorted(CATALOGUE):
        folder = FIXTURES / rule_id
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(prefix) and (
                entry.is_dir() or entry.suffix in (".yaml", ".yml", ".py")
            ):
                out.append((rule_id, entry))
    return out


def _id(case: tuple[str, Path]) -> str:
    return f"{case[0]}/{case[1].name}"


def test_catalogue_is_readable() -> None:
    assert len(CATALOGUE) >= 30, f"expected the pitfall catalogue at {PITFALLS}"


@pytest.mark.parametrize("rule_id", sorted(CATALOGUE))
def test_rule_is_implemented(rule_id: str) -> None:
    assert rule_id in load_rules(), f"rule {rule_id!r} from pitfalls.md has no implementation"


@pytest.mark.parametrize("rule_id", sorted(CATALOGUE))
def test_rule_has_trigger_and_near_miss(rule_id: str) -> None:
    names = [c[1].name for c in cases("trigger") + cases("near_miss") if c[0] == rule_id]
    assert any(n.startswith("trigger") for n in names), f"no trigger fixture for {rule_id}"
    assert any(n.startswith("near_miss") for n in names), f"no near-miss fixture for {rule_id}"


def test_no_rule_outside_the_catalogue() -> None:
    stray = sorted(set(load_rules()) - set(CATALOGUE))
    assert not stray, f"rules not in pitfalls.md: {stray}"


@pytest.mark.parametrize("case", cases("trigger"), ids=_id)
def test_trigger_raises_rule(case: tuple[str, Path]) -> None:
    rule_id, path = case
    found = [f for f in findings_for(path, {rule_id}) if f.rule == rule_id]
    assert found, f"{path} should raise {rule_id}"
    assert any(f.severity == CATALOGUE[rule_id] for f in found), (
        f"{rule_id} is {CATALOGUE[rule_id]} in the catalogue, got {[f.severity for f in found]}"
    )
    for f in found:
        assert f.message
        assert f.fix
        assert f.object
        assert f.path
        assert f.file is not None
        assert f.line is not None
        assert f.line >= 1


@pytest.mark.parametrize("case", cases("near_miss"), ids=_id)
def test_near_miss_is_silent(case: tuple[str, Path]) -> None:
    rule_id, path = case
    found = [f for f in findings_for(path, {rule_id}) if f.rule == rule_id]
    assert not found, f"{path} must not raise {rule_id}: {[f.message for f in found]}"
