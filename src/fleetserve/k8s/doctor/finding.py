"""A doctor finding: one trap found in one object, with the numbers and the fix.

What must stay true: a finding is plain, frozen data (rules are pure functions that yield
them), ``to_json`` keys are the public ``--format json`` contract, and ``sort_key`` makes
reports deterministic whatever order rules ran in.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Literal, Protocol

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

    @classmethod
    def at(  # noqa: PLR0917 - one positional per field reads best at the many call sites
        cls,
        rule: str,
        severity: Severity,
        where: Located,
        path: str,
        message: str,
        fix: str,
    ) -> Finding:
        """The one way rules build a finding: about ``where`` (a manifest, Helm values, or a
        Python call site) at ``path``, with its ``Kind/ns/name`` ref, file and line."""
        return cls(rule, severity, where.ref, path, message, fix, where.file, where.line_of(path))

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


class Located(Protocol):
    """What a finding can be about: something with a report name, a file, and lines."""

    @property
    def ref(self) -> str:
        """``Kind/namespace/name`` (or ``ScalingConfig/<file>:<line>``)."""
        ...

    @property
    def file(self) -> str:
        """Source file."""
        ...

    def line_of(self, path: str) -> int:
        """1-based line of ``path`` (the object's own line when unknown)."""
        ...
