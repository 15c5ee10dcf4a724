"""The rule registry: rule modules register pure functions ``Inventory -> Iterable[Finding]``.

What must stay true: a rule id is registered once (a duplicate is a programming error, caught
at import); ``run_rules`` imports every rule module (``fleetserve.k8s.doctor.rules``) before
running, so callers never depend on import order; output is sorted and de-duplicated so two
runs over the same input print the same report.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory

RuleFn = Callable[[Inventory], Iterable[Finding]]

#: rule id -> function. Filled by the ``@rule`` decorator when rule modules are imported.
RULES: dict[str, RuleFn] = {}


def rule(rule_id: str) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` as the checker for ``rule_id`` (an id from pitfalls.md)."""

    def register(fn: RuleFn) -> RuleFn:
        if rule_id in RULES and RULES[rule_id] is not fn:
            raise RuntimeError(f"rule {rule_id!r} registered twice ({RULES[rule_id]!r}, {fn!r})")
        RULES[rule_id] = fn
        return fn

    return register


def load_rules() -> dict[str, RuleFn]:
    """Import all rule modules (idempotent) and return the registry."""
    importlib.import_module("fleetserve.k8s.doctor.rules")
    return RULES


def run_rules(inv: Inventory, only: set[str] | None = None) -> list[Finding]:
    """Run every registered rule (or those in ``only``) and return sorted, unique findings."""
    rules = load_rules()
    found: set[Finding] = set()
    for rule_id in sorted(rules):
        if only is not None and rule_id not in only:
            continue
        found.update(rules[rule_id](inv))
    return sorted(found, key=Finding.sort_key)
