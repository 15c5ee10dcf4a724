"""Doctor on real-world manifests: findings and errors on the KubeRay samples, before and after.

Run::

    .venv/bin/python benchmarks/doctor_samples.py --kuberay-git GITDIR [--rev REV] \
        [--before COMMIT] [--json OUT]
    .venv/bin/python benchmarks/doctor_samples.py --samples DIR [--before COMMIT]

``--kuberay-git`` is a git directory of github.com/ray-project/kuberay (a bare mirror is enough);
``ray-operator/config/samples`` of ``--rev`` (default HEAD) is exported to a temporary directory
(never into this repository). ``--before COMMIT`` also runs the doctor of an older commit of
this repository (its ``src`` exported with ``git archive``) on the same samples, so the two
counts come from the same input and the same command line: ``fleetserve doctor SAMPLES
--format json`` (plus the text report for the notes). The environment passes through, so
``FLEETSERVE_CACHE`` / ``FLEETSERVE_OFFLINE`` decide where CRD schemas come from.

Reported: findings, errors/warnings/info, findings per rule, every error (rule, object, path,
message) and the notes. Not a test: the numbers go to docs/benchmarks.md ("Doctor on the
KubeRay samples"), where each remaining error is judged real or not.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLES = "ray-operator/config/samples"


def export_samples(git_dir: str, rev: str, into: Path) -> Path:
    """``git archive`` the samples folder of ``rev`` into ``into``; returns the folder."""
    data = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", rev, SAMPLES],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / SAMPLES


def export_src(commit: str, into: Path) -> Path:
    """This repository's ``src`` at ``commit``, for running the doctor of that commit."""
    data = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_doctor(samples: Path, src: Path) -> dict[str, Any]:
    """Findings (``--format json``) and notes (text report) of the doctor in ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    base = [sys.executable, "-m", "fleetserve.cli", "doctor", str(samples)]
    js = subprocess.run(
        [*base, "--format", "json"], capture_output=True, text=True, env=env, check=False
    )
    if js.returncode not in (0, 1):
        raise SystemExit(f"doctor failed ({js.returncode}): {js.stderr.strip()}")
    text = subprocess.run(
        base, capture_output=True, text=True, env={**env, "COLUMNS": "400"}, check=False
    )
    findings = json.loads(js.stdout)
    notes = [line for line in text.stdout.splitlines() if line.startswith("note:")]
    return {"findings": findings, "notes": notes, "exit": js.returncode}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    findings = result["findings"]
    severities = collections.Counter(f["severity"] for f in findings)
    per_rule = collections.Counter(f"{f['rule']} ({f['severity']})" for f in findings)
    errors = [
        {k: f.get(k) for k in ("rule", "object", "path", "message")}
        for f in findings
        if f["severity"] == "error"
    ]
    return {
        "findings": len(findings),
        "errors": severities["error"],
        "warnings": severities["warning"],
        "info": severities["info"],
        "per_rule": dict(per_rule.most_common()),
        "error_list": errors,
        "notes": result["notes"],
        "exit": result["exit"],
    }


def show(label: str, s: dict[str, Any]) -> None:
    print(f"== {label}: {s['findings']} findings: {s['errors']} errors, {s['warnings']} warnings,")
    print(f"   {s['info']} info (exit {s['exit']})")
    for rule, n in s["per_rule"].items():
        print(f"   {n:4}  {rule}")
    for e in s["error_list"]:
        message = e["message"] if len(e["message"]) < 160 else e["message"][:157] + "..."
        print(f"   ERROR {e['rule']}  {e['object']}  {e['path']}\n         {message}")
    for note in s["notes"]:
        print(f"   {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--kuberay-git", help="git dir of ray-project/kuberay")
    source.add_argument("--samples", help="a samples directory already on disk")
    parser.add_argument("--rev", default="HEAD", help="kuberay revision (default HEAD)")
    parser.add_argument("--before", help="also run the doctor of this commit of fleetserve")
    parser.add_argument("--json", help="write the summaries here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="doctor-samples-") as tmp:
        if args.kuberay_git:
            samples = export_samples(args.kuberay_git, args.rev, Path(tmp) / "kuberay")
        else:
            samples = Path(args.samples)
        files = sum(1 for p in samples.rglob("*") if p.is_file())
        print(f"samples: {samples} ({files} files)")
        out: dict[str, Any] = {"samples_files": files, "rev": args.rev}
        if args.before:
            before_src = export_src(args.before, Path(tmp) / "before")
            out["before"] = summary(run_doctor(samples, before_src))
            out["before"]["commit"] = args.before
            show(f"before ({args.before})", out["before"])
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        out["after"] = summary(run_doctor(samples, REPO / "src"))
        out["after"]["commit"] = f"{head} + working tree"
        show(f"now ({head} + working tree)", out["after"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
