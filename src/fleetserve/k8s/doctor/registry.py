"""The rule registry: rule modules register pure functions ``Inventory -> Iterable[Finding]``.

Each rule declares, where it is registered, the versions it applies to (per component: Ray,
KubeRay, vLLM, HAMi, as PEP 440 specifier sets or ``"all"``); its catalogue page (the
``--explain`` text, ``docs/rules.md#<id>`` and the SARIF ``helpUri``) is derived from its id, so
the link is computed in one place.

What must stay true: a rule id is registered once (a duplicate is a programming error, caught
at import), and so is a malformed version range; ``run_rules`` imports every rule module
(``fleetserve.k8s.doctor.rules``) before running, so callers never depend on import order;
output is sorted and de-duplicated so two runs over the same input print the same report.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory

RuleFn = Callable[[Inventory], Iterable[Finding]]

#: The components whose version can decide whether a rule is true.
Component = Literal["ray", "kuberay", "vllm", "hami"]
COMPONENTS: tuple[Component, ...] = get_args(Component)
#: How each component is named in messages and the catalogue.
COMPONENT_NAMES: dict[Component, str] = {
    "ray": "Ray",
    "kuberay": "KubeRay",
    "vllm": "vLLM",
    "hami": "HAMi",
}
#: A range that covers every version.
ALL = "all"

#: Where the rule catalogue (docs/rules.md) is published; a rule's page is ``#<rule id>`` on
#: it. Teams that mirror fleetserve point SARIF links at their own copy with
#: ``FLEETSERVE_RULES_URL``; read once at import so one report never mixes two homes.
CATALOGUE_URL = os.environ.get(
    "FLEETSERVE_RULES_URL", "https://github.com/fleetserve/fleetserve/blob/main/docs/rules.md"
)
#: The id of schema-validation findings (not a registered rule, but a catalogue page).
SCHEMA_RULE = "schema"
#: The name of a crash outside every rule and check (the loader, the CRD lookup).
WHOLE_RUN = "doctor"


def help_uri(rule_id: str) -> str:
    """Absolute link to a rule's catalogue page (SARIF ``helpUri``, ``--explain``)."""
    return f"{CATALOGUE_URL}#{rule_id}"


@dataclass(frozen=True)
class RuleInfo:
    """One registered rule: its checker and what it declares about itself."""

    id: str
    check: RuleFn
    #: Component -> version range the rule applies to ("all" or a PEP 440 specifier set such
    #: as ">=2.33" or ">=1.1,<1.7"). A component that is absent does not decide the rule.
    #: Empty: the rule has not declared its versions yet (the catalogue meta-test fails).
    versions: Mapping[Component, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def declared(self) -> bool:
        """Whether the rule states its version range."""
        return bool(self.versions)

    def applies(self, component: Component, version: str | None) -> bool:
        """Whether the rule applies at ``version`` of ``component``.

        An unknown (None or unparsable) version, or a component the rule does not depend on,
        applies: a rule stays quiet only about versions it knows it does not cover.
        """
        wanted = self.versions.get(component)
        if wanted is None or wanted == ALL or version is None:
            return True
        try:
            parsed = Version(version.lstrip("v"))
        except InvalidVersion:
            return True
        return SpecifierSet(wanted).contains(parsed, prereleases=True)

    def versions_text(self) -> str:
        """``Ray >=2.33; KubeRay all`` (catalogue and ``--list-rules``)."""
        if not self.versions:
            return "not declared"
        if set(self.versions.values()) == {ALL} and set(self.versions) == set(COMPONENTS):
            return "all versions"
        return "; ".join(
            f"{COMPONENT_NAMES[c]} {self.versions[c]}" for c in COMPONENTS if c in self.versions
        )

    @property
    def anchor(self) -> str:
        """The catalogue page's anchor in docs/rules.md (the rule id itself)."""
        return self.id

    @property
    def help_uri(self) -> str:
        """Absolute link to the rule's catalogue page (SARIF ``helpUri``)."""
        return help_uri(self.anchor)


#: rule id -> checker. Filled by the ``@rule`` decorator when rule modules are imported.
RULES: dict[str, RuleFn] = {}
#: rule id -> everything the rule declares.
RULE_INFO: dict[str, RuleInfo] = {}


def _versions(
    rule_id: str, versions: Mapping[str, str] | Literal["all"] | None
) -> Mapping[Component, str]:
    if versions is None:
        return MappingProxyType({})
    if versions == ALL:
        return MappingProxyType(dict.fromkeys(COMPONENTS, ALL))
    assert not isinstance(versions, str)
    out: dict[Component, str] = {}
    for component, spec in versions.items():
        if component not in COMPONENTS:
            raise RuntimeError(
                f"rule {rule_id!r}: unknown component {component!r} (known: {COMPONENTS})"
            )
        text = spec.strip()
        if text != ALL:
            try:
                SpecifierSet(text)
            except InvalidSpecifier as e:
                raise RuntimeError(f"rule {rule_id!r}: bad version range {spec!r}: {e}") from e
            if not text:
                raise RuntimeError(f"rule {rule_id!r}: empty version range for {component}")
        out[component] = text
    if not out:
        raise RuntimeError(f"rule {rule_id!r}: versions must name at least one component")
    return MappingProxyType(out)


def rule(
    rule_id: str, *, versions: Mapping[str, str] | Literal["all"] | None = None
) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` as the checker for ``rule_id`` (a page of docs/rules.md).

    ``versions`` maps components (``ray``, ``kuberay``, ``vllm``, ``hami``) to the range the
    rule applies to: ``"all"`` or a PEP 440 specifier set (``">=2.33"``, ``">=1.1,<1.7"``);
    ``versions="all"`` says no component's version matters. Example::

        @rule("deprecated-serve-field", versions={"ray": ">=2.11", "kuberay": "all"})
    """
    declared = _versions(rule_id, versions)

    def register(fn: RuleFn) -> RuleFn:
        if rule_id in RULES and RULES[rule_id] is not fn:
            raise RuntimeError(f"rule {rule_id!r} registered twice ({RULES[rule_id]!r}, {fn!r})")
        RULES[rule_id] = fn
        RULE_INFO[rule_id] = RuleInfo(rule_id, fn, declared)
        return fn

    return register


def load_rules() -> dict[str, RuleFn]:
    """Import all rule modules (idempotent) and return the registry."""
    importlib.import_module("fleetserve.k8s.doctor.rules")
    return RULES


def rule_info() -> dict[str, RuleInfo]:
    """Every registered rule's declaration, by id (imports the rule modules)."""
    load_rules()
    return RULE_INFO


def run_rules(inv: Inventory, only: set[str] | None = None) -> list[Finding]:
    """Run every registered rule (or those in ``only``) and return sorted, unique findings.

    A rule that raises propagates (tests and library callers see the bug); the command uses
    :func:`run_rules_contained`, which keeps the other rules' findings.
    """
    rules = load_rules()
    found: set[Finding] = set()
    for rule_id in sorted(rules):
        if only is not None and rule_id not in only:
            continue
        found.update(rules[rule_id](inv))
    return sorted(found, key=Finding.sort_key)


@dataclass(frozen=True)
class RuleCrash:
    """A rule that raised on this input: a bug in fleetserve, not in the input."""

    rule: str
    #: ``IndexError: list index out of range`` (the exception's type and message).
    error: str
    #: ``rules/_capacity.py:293`` (the innermost frame inside fleetserve), "" when unknown.
    where: str = ""

    @classmethod
    def of(cls, rule: str, e: BaseException) -> RuleCrash:
        """The crash of ``rule`` (or a stage: ``schema``, ``doctor``) raising ``e``."""
        return cls(rule, _error_text(e), _innermost(e))

    def message(self) -> str:
        """One line for stderr and SARIF: which rule, what it raised, where, what is lost."""
        at = f" at {self.where}" if self.where else ""
        if self.rule == WHOLE_RUN:
            return f"internal error: doctor raised {self.error}{at}; no report was produced."
        what = "schema validation" if self.rule == SCHEMA_RULE else f"rule {self.rule}"
        return (
            f"internal error: {what} raised {self.error}{at}; its findings are missing from "
            "this report (the other checks ran). Please report it with the input."
        )


def run_rules_contained(
    inv: Inventory, only: set[str] | None = None
) -> tuple[list[Finding], list[RuleCrash]]:
    """Like :func:`run_rules`, but a rule that raises is recorded and the others still run: one
    rule's bug must not turn a whole report into a traceback (the command exits 3)."""
    rules = load_rules()
    found: set[Finding] = set()
    crashes: list[RuleCrash] = []
    for rule_id in sorted(rules):
        if only is not None and rule_id not in only:
            continue
        try:
            found.update(list(rules[rule_id](inv)))
        except Exception as e:  # contained and reported (exit 3), never swallowed
            crashes.append(RuleCrash.of(rule_id, e))
    return sorted(found, key=Finding.sort_key), crashes


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _innermost(e: BaseException) -> str:
    """``rules/_capacity.py:293``: the deepest traceback frame inside fleetserve's doctor."""
    where = ""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/fleetserve/k8s/doctor/" in name:
            where = f"{name.rsplit('/fleetserve/k8s/doctor/', 1)[1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
