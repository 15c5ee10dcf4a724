"""``fleetserve doctor PATH...``: find known traps in manifests and Ray Train scripts.

Exit codes (the contract CI relies on): 0 no error findings, 1 error findings (or findings
at ``--fail-on`` severity), 2 bad usage (a path that does not exist, a bad flag), 3 an internal
error (a rule raised: the report of the other rules is still printed, and a message names the
rule). A file that cannot be read (bad YAML, an unrendered template) is a finding about that
file, never an abort. An object can silence rules it breaks on purpose with the annotation
``doctor.fleetserve.io/ignore: "rule-id,rule-id"``; the summary counts what was silenced.
The handler is a thin shell: load, validate schemas, run rules, print; all judgement lives
in the pure rule functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown

from fleetserve import __version__
from fleetserve.errors import FleetServeError, InternalError, UsageError
from fleetserve.k8s.doctor import catalogue
from fleetserve.k8s.doctor.context import split_contexts
from fleetserve.k8s.doctor.crds import CLUSTER, known_upstream, lookup_crds
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory
from fleetserve.k8s.doctor.loader import expand_paths, load_paths
from fleetserve.k8s.doctor.registry import (
    SCHEMA_RULE,
    WHOLE_RUN,
    RuleCrash,
    load_rules,
    run_rules_contained,
)
from fleetserve.k8s.doctor.report import DoctorResult, print_text, to_github, to_json, to_sarif
from fleetserve.k8s.doctor.schema import validate_schemas


def register(subparsers: Any) -> None:
    """Add the ``doctor`` sub-command."""
    p = subparsers.add_parser(
        "doctor",
        help="check KubeRay/HAMi/monitoring manifests and Ray Train scripts for known traps",
        description=(
            "Read YAML files or directories (RayService, RayCluster, RayJob, HAMi Helm values, "
            "Karpenter NodePools, monitoring objects, core kinds, fleet specs) and Python files "
            "(Ray Train ScalingConfig, @ray.remote, placement groups; read statically, never "
            "executed); report schema violations and every pitfall of the rule catalogue "
            "(--list-rules, --explain RULE, docs/rules.md). A file that cannot be read is a "
            "finding about it. Exit 0: no errors, 1: errors, 2: bad usage, 3: internal error."
        ),
        epilog=(
            "An object silences rules it breaks on purpose with the annotation "
            'doctor.fleetserve.io/ignore: "rule-id,rule-id".'
        ),
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="files or directories to check (- reads stdin)"
    )
    p.add_argument(
        "--explain",
        metavar="RULE",
        default=None,
        help="print the catalogue page of RULE (what breaks, why, versions, fix, example)",
    )
    p.add_argument(
        "--list-rules",
        action="store_true",
        help="list every rule: id, severity, versions it applies to, what it catches "
        "(--format json: as JSON)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json", "sarif", "github"),
        default="text",
        help="text: readable report (default); json: a list of findings; sarif: SARIF 2.1.0 "
        "for code scanning; github: GitHub Actions annotations",
    )
    p.add_argument(
        "--crds",
        metavar="DIR|cluster",
        default=None,
        help="where custom-resource schemas come from. Default: the CRDs of the KubeRay (and "
        "prometheus-operator) release the manifests name, else the newest known, from the "
        "cache ($FLEETSERVE_CACHE/crds, else ~/.cache/fleetserve/crds), downloaded once from "
        "the upstream release when online (FLEETSERVE_OFFLINE=1: never), else the KubeRay "
        "schemas shipped with fleetserve. 'cluster': the "
        "CRDs installed in the kubeconfig's cluster (read with kubectl). DIR: a directory of "
        "CRD YAML files",
    )
    p.add_argument(
        "--rules",
        metavar="ID,ID",
        default=None,
        help="only these rule ids (comma-separated; 'schema' selects schema validation)",
    )
    p.add_argument(
        "--k8s-version",
        metavar="X.Y",
        default=None,
        help="Kubernetes version whose schemas validate core kinds (default: newest known)",
    )
    p.add_argument(
        "--fail-on",
        choices=("error", "warning", "info"),
        default="error",
        help="exit 1 when a finding is at least this severe (default: error)",
    )
    p.set_defaults(handler=run)


def _parse_rules(raw: str | None) -> set[str] | None:
    if raw is None:
        return None
    wanted = {r.strip() for r in raw.split(",") if r.strip()}
    known = set(load_rules()) | {SCHEMA_RULE}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise UsageError(
            f"--rules: unknown rule id(s) {', '.join(unknown) or '(none given)'}",
            hint="known: " + ", ".join(sorted(known)) + " (fleetserve doctor --list-rules)",
        )
    return wanted


def diagnose(
    paths: list[str],
    *,
    crds: str | None = None,
    rules: set[str] | None = None,
    k8s_version: str | None = None,
) -> DoctorResult:
    """Load ``paths`` and return every finding (the library entry point behind the command)."""
    if crds is not None and crds != CLUSTER and not Path(crds).is_dir():
        raise UsageError(
            f"--crds {crds}: not a directory",
            hint="pass a directory of CRD YAML files, or --crds cluster",
        )
    files = expand_paths(paths)
    # Each repository or Helm chart is judged on its own: one's node pools, operator version
    # or NetworkPolicies must not decide another's findings (context.py).
    parts = [_judge(load_paths(group), crds, rules, k8s_version) for group in split_contexts(files)]
    invs = [part.inv for part in parts]
    notes: list[str] = []
    for part in parts:
        notes.extend(n for n in part.notes if n not in notes)
    skipped = [s for inv in invs for s in inv.skipped]
    if skipped:
        shown = ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else "")
        notes.append(
            f"skipped {len(skipped)} document(s) without kind that are not recognised "
            f"Helm values or a fleet spec: {shown}"
        )
    patches = [m for inv in invs for m in inv.patches]
    if patches:
        patch_files = sorted({m.file for m in patches})
        notes.append(
            f"{len(patches)} kustomize patch document(s) not checked alone (they complete a "
            f"base; check `kustomize build DIR | fleetserve doctor -`): "
            + ", ".join(patch_files[:3])
            + (" ..." if len(patch_files) > 3 else "")
        )
    findings = sorted({f for part in parts for f in part.findings}, key=lambda f: f.sort_key())
    objects = sum(len(i.manifests) + len(i.helm_values) + len(i.scaling_configs) for i in invs)
    return DoctorResult(
        findings,
        [u for part in parts for u in part.unchecked],
        len(files),
        objects,
        tuple(notes),
        sum(part.suppressed for part in parts),
        tuple(c for part in parts for c in part.crashes),
    )


@dataclass
class _Judged:
    """What one context's check found (see :func:`diagnose`)."""

    inv: Inventory
    findings: list[Finding] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suppressed: int = 0
    crashes: list[RuleCrash] = field(default_factory=list)


def _judge(
    inv: Inventory, crds: str | None, rules: set[str] | None, k8s_version: str | None
) -> _Judged:
    """Schemas and rules over one context's inventory."""
    out = _Judged(inv)
    findings: list[Finding] = []
    if rules is None or SCHEMA_RULE in rules:
        found = lookup_crds(inv, crds)
        try:
            schema = validate_schemas(inv, found.schemas, k8s_version)
        except FleetServeError:
            raise  # the user's flag (--k8s-version) or CRDs: their message, their exit code
        except Exception as e:  # a bug in the validator: the rules still run
            out.crashes.append(RuleCrash.of(SCHEMA_RULE, e))
        else:
            findings.extend(schema.findings)
            out.unchecked = schema.unchecked
        # One note for the CRDs that could not be had (it says why and what to do); kinds
        # no upstream is known for (a Karpenter NodePool, a Gateway...) are only listed.
        missing = found.note()
        if missing:
            out.notes.append(missing)
        unchecked_set = set(out.unchecked)
        others = sorted(
            {m.ref for m in inv.manifests if m.ref in unchecked_set and not known_upstream(m)}
        )
        if others:
            shown = ", ".join(others[:5]) + (
                f" and {len(others) - 5} more" if len(others) > 5 else ""
            )
            out.notes.append(f"no schema known for {shown}: not schema-checked")
    rule_ids = None if rules is None else rules - {SCHEMA_RULE}
    if rule_ids is None or rule_ids:
        found_by_rules, rule_crashes = run_rules_contained(inv, rule_ids)
        findings.extend(found_by_rules)
        out.crashes.extend(rule_crashes)
    ignored = {m.ref: m.ignored_rules for m in inv.manifests if m.ignored_rules}
    out.findings = [f for f in set(findings) if f.rule not in ignored.get(f.object, frozenset())]
    out.suppressed = len(set(findings)) - len(out.findings)
    return out


def _list_rules(fmt: str) -> None:
    rows = catalogue.list_rules()
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    # Plain columns, one rule a line (greppable, never wrapped inside an id).
    head = {"rule": "rule", "severity": "severity", "versions": "versions", "title": "catches"}
    width = {k: max(len(r[k]) for r in [head, *rows]) for k in ("rule", "severity", "versions")}
    for r in [head, *rows]:
        cells = [r[k].ljust(width[k]) for k in ("rule", "severity", "versions")]
        sys.stdout.write("  ".join([*cells, r["title"]]) + "\n")


def run(args: argparse.Namespace) -> int:
    """Handler: print the report; exit 1 when there are error findings."""
    if args.explain is not None:
        text = catalogue.explain(args.explain)
        if sys.stdout.isatty():  # rendered for a person; plain Markdown for pipes and files
            Console().print(Markdown(text))
        else:
            sys.stdout.write(text)
        return 0
    if args.list_rules:
        _list_rules(args.format)
        return 0
    if not args.paths:
        raise UsageError(
            "doctor: give at least one PATH to check",
            hint="or --explain RULE / --list-rules to read the rule catalogue",
        )
    rules = _parse_rules(args.rules)
    try:
        result = diagnose(args.paths, crds=args.crds, rules=rules, k8s_version=args.k8s_version)
    except FleetServeError:
        raise
    except Exception as e:
        # A bug outside the contained rules (the loader, the CRD lookup): a message and exit
        # 3, never a traceback that reads as "errors found".
        raise InternalError(
            RuleCrash.of(WHOLE_RUN, e).message(),
            hint="run with --rules to narrow it down, and report it with the input",
        ) from e
    if args.format == "json":
        sys.stdout.write(to_json(result.findings) + "\n")
    elif args.format == "sarif":
        sys.stdout.write(to_sarif(result.findings, __version__, result.crashes) + "\n")
    elif args.format == "github":
        text = to_github(result.findings)
        sys.stdout.write(text + "\n" if text else "")
    else:
        print_text(result, Console(highlight=False))
    if args.format != "text":
        # Machine formats keep stdout parseable; the notes (e.g. "no CRD schema ...: not
        # schema-checked") still reach the person reading the CI log.
        for note in result.notes:
            sys.stderr.write(f"fleetserve doctor: note: {note}\n")
        for crash in result.crashes:
            sys.stderr.write(f"fleetserve doctor: {crash.message()}\n")
    if result.crashes:
        return InternalError.exit_code
    return 1 if result.fails(args.fail_on) else 0
