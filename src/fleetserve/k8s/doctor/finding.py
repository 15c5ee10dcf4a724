"""A doctor finding: one trap found in one object, with the numbers and the fix.

What must stay true: a finding is plain, frozen data (rules are pure functions that yield
them), ``to_json`` keys are the public ``--format json`` contract, and ``sort_key`` makes
reports deterministic whatever order rules ran in.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]

#: Order used when sorting and summarising: errors first.
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One problem found by a rule (or by schema validation)."""

    #: Rule id from pitfalls.md, or ``"schema"`` for schema violations.
    rule: str
    #: ``error`` (will fail / never schedule), ``warning`` (likely wrong), ``info``.
    severity: Severity
    #: ``Kind/namespace/name``; ``ScalingConfig/<file>:<line>`` for Python; ``HelmValues/<file>``.
    object: str
    #: Field path inside the object, e.g. ``spec.rayClusterConfig.headGroupSpec.rayStartParams``.
    path: str
    #: What will happen, with the numbers that prove it.
    message: str
    #: What to change.
    fix: str
    #: Source file and 1-based line, when known.
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, builtins.object]:
        """The ``--format json`` shape: rule, severity, object, path, message, fix (+file, line)."""
        out: dict[str, builtins.object] = {
            "rule": self.rule,
            "severity": self.severity,
            "object": self.object,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
        }
        if self.file is not None:
            out["file"] = self.file
        if self.line is not None:
            out["line"] = self.line
        return out

    def sort_key(self) -> tuple[str, int, int, str, str, str]:
        """Deterministic order: by file, line, severity, object, path, rule."""
        return (
            self.file or "",
            self.line or 0,
            SEVERITY_ORDER[self.severity],
            self.object,
            self.path,
            self.rule + "\0" + self.message,
        )
