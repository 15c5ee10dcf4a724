"""The project's own rule catalogue, checked against the rule registry, and every rule's fixtures.

The catalogue (src/fleetserve/k8s/doctor/catalogue.yaml, rendered to docs/rules.md) and the
registry must name the same rules; every rule states the versions it applies to and has an
``--explain`` page; docs/rules.md is current. Each rule also has a trigger that raises it with
the catalogue's severity and a near miss that does not. Fixtures live in
tests/fixtures/doctor/<rule-id>/: ``trigger*`` / ``near_miss*``, each a YAML or Python file or
a directory of them (for rules that join several objects). Nothing reads the team's notes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from fleetserve.k8s.doctor import catalogue
from fleetserve.k8s.doctor.registry import SCHEMA_RULE, load_rules, rule_info

from .conftest import FIXTURES, REPO, findings_for

PAGES = catalogue.pages()
#: rule id -> the severity its catalogue page states.
CATALOGUE = {rule_id: p.severity for rule_id, p in PAGES.items() if rule_id != SCHEMA_RULE}


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


def test_every_registered_rule_has_a_page() -> None:
    missing = sorted(set(load_rules()) - set(PAGES))
    assert not missing, f"rules without a page in catalogue.yaml: {missing}"
    assert SCHEMA_RULE in PAGES


@pytest.mark.parametrize("rule_id", sorted(CATALOGUE))
def test_every_page_is_a_registered_rule(rule_id: str) -> None:
    assert rule_id in load_rules(), f"catalogue page {rule_id!r} names no registered rule"


@pytest.mark.parametrize("rule_id", sorted(load_rules()))
def test_every_rule_states_its_versions_and_has_an_explain_page(rule_id: str) -> None:
    info = rule_info()[rule_id]
    assert info.declared, f"@rule({rule_id!r}) declares no versions=..."
    text = catalogue.explain(rule_id)
    assert text.startswith(f"# {rule_id}\n")
    for section in ("What breaks.", "Why.", "Versions.", "Fix.", "Example."):
        assert f"**{section}**" in text, f"{rule_id}: page lacks {section}"
    assert f"Versions: {info.versions_text()}." in text
    assert info.help_uri in text


@pytest.mark.parametrize("rule_id", sorted(PAGES))
def test_every_example_parses(rule_id: str) -> None:
    p = PAGES[rule_id]
    if p.example_lang == "python":
        ast.parse(p.example)
    else:
        assert p.example_lang == "yaml"
        yaml.safe_load(p.example)


def test_docs_rules_md_is_current() -> None:
    docs = REPO / "docs" / "rules.md"
    assert docs.read_text(encoding="utf-8") == catalogue.render_markdown(), (
        "docs/rules.md is stale: run `python -m fleetserve.k8s.doctor.catalogue > docs/rules.md`"
    )


def test_no_test_reads_the_teams_shared_docs() -> None:
    needle = "shared" + "/docs"  # split so this file does not match itself
    readers = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "tests").rglob("*.py"))
        if needle in p.read_text(encoding="utf-8") or "pitfalls" + ".md" in p.read_text("utf-8")
    ]
    assert not readers, f"tests must not need ../{needle}: {readers}"


@pytest.mark.parametrize("rule_id", sorted(CATALOGUE))
def test_rule_has_trigger_and_near_miss(rule_id: str) -> None:
    names = [c[1].name for c in cases("trigger") + cases("near_miss") if c[0] == rule_id]
    assert any(n.startswith("trigger") for n in names), f"no trigger fixture for {rule_id}"
    assert any(n.startswith("near_miss") for n in names), f"no near-miss fixture for {rule_id}"


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
