"""Doctor's output: a readable report grouped by object (rich), or JSON for machines.

What must stay true: the JSON output is exactly a list of ``Finding.to_json()`` objects in
the findings' deterministic order (the public contract of ``--format json``); the text report
shows every finding with its severity, rule id, ``file:line``, field path, message and fix,
and ends with a one-line summary. Neither touches the findings' content.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from fleetserve.k8s.doctor.finding import SEVERITY_ORDER, Finding

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@dataclass(frozen=True)
class DoctorResult:
    """Everything a doctor run found."""

    findings: list[Finding]
    #: Objects whose kind no schema was known for (schema validation skipped them).
    unchecked: list[str]
    #: Input files read.
    files: int
    #: Objects read (manifests, Helm values, ScalingConfig calls).
    objects: int
    #: Notes for the user (e.g. "no --crds given").
    notes: tuple[str, ...] = ()
    #: Findings silenced by the ignore annotation (not in ``findings``).
    suppressed: int = 0

    @property
    def has_errors(self) -> bool:
        return self.fails("error")

    def fails(self, threshold: str) -> bool:
        """Whether any finding is at least as severe as ``threshold`` (error/warning/info)."""
        limit = SEVERITY_ORDER[threshold]
        return any(SEVERITY_ORDER[f.severity] <= limit for f in self.findings)

    def counts(self) -> Counter[str]:
        return Counter(f.severity for f in self.findings)


def to_json(findings: Sequence[Finding]) -> str:
    """``--format json``: a list of findings (rule, severity, object, path, message, fix...)."""
    return json.dumps([f.to_json() for f in findings], indent=2, ensure_ascii=False)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_line(result: DoctorResult) -> str:
    c = result.counts()
    text = (
        f"{_plural(c['error'], 'error')}, {_plural(c['warning'], 'warning')}, "
        f"{c['info']} info in {_plural(result.objects, 'object')} from "
        f"{_plural(result.files, 'file')}"
    )
    if result.suppressed:
        text += f" ({result.suppressed} silenced by annotation)"
    return text


def print_text(result: DoctorResult, console: Console) -> None:
    """The readable report: findings grouped by object, errors first within each object.

    Lines are soft-wrapped (never broken inside a field path or file:line, so both stay
    copy-pasteable); the terminal wraps long messages.
    """
    by_object: dict[str, list[Finding]] = {}
    for f in result.findings:
        by_object.setdefault(f.object, []).append(f)
    for obj, items in by_object.items():
        console.print(Text(obj, style="bold underline"), soft_wrap=True)
        for f in sorted(items, key=lambda f: (SEVERITY_ORDER[f.severity], f.line or 0, f.rule)):
            loc = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "")
            head = Text("  ")
            head.append(f"{f.severity:<7}", style=_STYLE[f.severity])
            head.append(f" {f.rule}", style="bold")
            if loc:
                head.append(f"  {loc}", style="dim")
            console.print(head, soft_wrap=True)
            console.print(Text(f"          at {f.path}", style="magenta"), soft_wrap=True)
            console.print(Text(f"          {f.message}"), soft_wrap=True)
            console.print(Text("          fix: ", style="green") + Text(f.fix), soft_wrap=True)
        console.print()
    for note in result.notes:
        console.print(Text(f"note: {note}", style="dim"), soft_wrap=True)
    style = "bold red" if result.has_errors else "bold green"
    mark = "✗" if result.has_errors else "✓"
    console.print(Text(f"{mark} {summary_line(result)}", style=style), soft_wrap=True)
