"""Doctor's output: a readable report grouped by object (rich), or JSON for machines.

What must stay true: the JSON output is exactly a list of ``Finding.to_json()`` objects in
the findings' deterministic order (the public contract of ``--format json``); SARIF and
GitHub annotations carry the same findings for CI; the text report
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

from fleetserve.k8s.doctor.catalogue import pages
from fleetserve.k8s.doctor.finding import SEVERITY_ORDER, Finding
from fleetserve.k8s.doctor.registry import CATALOGUE_URL, RuleCrash, help_uri

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
    #: Rules (or stages) that raised: their findings are missing; the command exits 3.
    crashes: tuple[RuleCrash, ...] = ()

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


_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _sarif_rule(rule_id: str) -> dict[str, object]:
    """A SARIF reportingDescriptor: the rule's title, default level, catalogue page and link."""
    out: dict[str, object] = {"id": rule_id, "name": rule_id, "helpUri": help_uri(rule_id)}
    p = pages().get(rule_id)
    if p is not None:
        out["shortDescription"] = {"text": p.title}
        out["fullDescription"] = {"text": " ".join(p.breaks.split())}
        out["defaultConfiguration"] = {"level": _SARIF_LEVEL[p.severity]}
        out["help"] = {
            "text": f"{' '.join(p.fix.split())} See {p.help_uri}",
            "markdown": p.body(),
        }
        out["properties"] = {"versions": p.versions}
    return out


def to_sarif(findings: Sequence[Finding], version: str, crashes: Sequence[RuleCrash] = ()) -> str:
    """SARIF 2.1.0 (GitHub code scanning and most CI dashboards read it); each rule links its
    catalogue page (``helpUri``) and carries the page as ``help``. A rule that crashed is a
    tool execution notification of an unsuccessful invocation (SARIF's place for it)."""
    rules = sorted({f.rule for f in findings})
    results = []
    for f in findings:
        result: dict[str, object] = {
            "ruleId": f.rule,
            "ruleIndex": rules.index(f.rule),
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f"{f.object} {f.path}: {f.message} Fix: {f.fix}"},
        }
        if f.file:
            region = {"startLine": f.line} if f.line else {}
            result["locations"] = [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.file},
                        **({"region": region} if region else {}),
                    },
                    "logicalLocations": [{"fullyQualifiedName": f"{f.object}:{f.path}"}],
                }
            ]
        results.append(result)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "fleetserve doctor",
                        "version": version,
                        "informationUri": CATALOGUE_URL,
                        "rules": [_sarif_rule(r) for r in rules],
                    }
                },
                "invocations": [
                    {
                        "executionSuccessful": not crashes,
                        "toolExecutionNotifications": [
                            {
                                "level": "error",
                                "message": {"text": c.message()},
                                "descriptor": {"id": c.rule},
                            }
                            for c in crashes
                        ],
                    }
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def to_github(findings: Sequence[Finding]) -> str:
    """GitHub Actions workflow commands: each finding becomes an annotation on its line."""

    def esc(text: str, prop: bool = False) -> str:
        out = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return out.replace(":", "%3A").replace(",", "%2C") if prop else out

    lines = []
    for f in findings:
        props = [f"title={esc(f'{f.rule}: {f.object}', prop=True)}"]
        if f.file:
            props.insert(0, f"file={esc(f.file, prop=True)}")
            if f.line:
                props.insert(1, f"line={f.line}")
        text = esc(f"{f.path}: {f.message} Fix: {f.fix}")
        lines.append(f"::{_GITHUB_LEVEL[f.severity]} {','.join(props)}::{text}")
    return "\n".join(lines)


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
    for crash in result.crashes:
        console.print(Text(crash.message(), style="bold red"), soft_wrap=True)
    failed = result.has_errors or bool(result.crashes)
    style = "bold red" if failed else "bold green"
    mark = "✗" if failed else "✓"
    console.print(Text(f"{mark} {summary_line(result)}", style=style), soft_wrap=True)
