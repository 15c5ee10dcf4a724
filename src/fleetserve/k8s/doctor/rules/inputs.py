"""Input files doctor could not read: reported as findings about the file, never an abort.

Design note: the loader records every file (or document) it cannot turn into objects as an
:class:`InputProblem` and goes on with the next file, so a directory with one Helm template in
it is still checked everywhere else, and machine formats (JSON, SARIF) stay valid. These two
rules say what was left out and why. A template is not broken, only not rendered yet: a
warning. YAML that does not parse, a document whose ``kind`` is not a string, and an invalid
fleet spec are refused by ``kubectl apply`` or fleetserve too: errors. Python that does not
parse (a Python 2 script, a generated file), bytes that are not UTF-8, or a file the OS does
not let us read are not deploy artifacts doctor can judge: warnings.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetserve.k8s.doctor.finding import Finding, Severity
from fleetserve.k8s.doctor.inventory import InputProblem, Inventory
from fleetserve.k8s.doctor.registry import rule

#: Severity of each unreadable kind (see the module doc for why).
_SEVERITY: dict[str, Severity] = {
    "yaml": "error",
    "document": "error",
    "fleet-spec": "error",
    "python": "warning",
    "encoding": "warning",
    "file": "warning",
}

_EFFECT = {
    "yaml": "kubectl apply refuses the file too",
    "document": "kubectl apply refuses the document too",
    "fleet-spec": "fleetserve refuses the spec too",
    "python": "its Ray resource requests were not read",
    "encoding": "doctor reads UTF-8 only",
    "file": "the file could not be opened",
}

_FIX = {
    "yaml": "Fix the YAML at the line shown (a YAML parser shows the same error), or leave the "
    "file out of the paths if it is not a manifest.",
    "document": "Give the document a string `kind` (e.g. kind: RayService) and an apiVersion.",
    "fleet-spec": "Fix the field named (`fleetserve plan SPEC` prints the spec's own errors).",
    "python": "Leave the file out of the paths if it is not Python 3, or fix the syntax error.",
    "encoding": "Save the file as UTF-8, or leave it out of the paths.",
    "file": "Check the file's permissions, or leave it out of the paths.",
}


def _path(p: InputProblem) -> str:
    return p.field or "file"


@rule("unrendered-template", versions="all")
def unrendered_template(inv: Inventory) -> Iterator[Finding]:
    """A Helm/Jinja/envsubst template given as a manifest: nothing in it can be checked."""
    for p in inv.problems:
        if p.kind != "template":
            continue
        yield Finding.at(
            "unrendered-template",
            "warning",
            p,
            _path(p),
            f"{p.file} is an unrendered template ({p.placeholder} on line "
            f"{p.placeholder_line}), not a manifest yet - at line {p.line}: {p.detail}. "
            "Nothing in it was checked.",
            "Render it and check the output: `helm template RELEASE CHART | fleetserve doctor "
            "-` (Helm), `envsubst < FILE | fleetserve doctor -`, `kustomize build DIR | "
            "fleetserve doctor -`; or leave the file out of the paths.",
        )


@rule("input-unreadable", versions="all")
def input_unreadable(inv: Inventory) -> Iterator[Finding]:
    """A file (or document) that does not parse: left out of every other check."""
    for p in inv.problems:
        if p.kind == "template":
            continue
        where = f"{p.file}:{p.line}"
        field = f" at {p.field}" if p.field else ""
        yield Finding.at(
            "input-unreadable",
            _SEVERITY[p.kind],
            p,
            _path(p),
            f"{where}: {p.detail}{field}; {_EFFECT[p.kind]}, and nothing in it was checked.",
            _FIX[p.kind],
        )
