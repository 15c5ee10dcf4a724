"""Which input files are judged together: a repository, a Helm chart, or the whole input.

Design note: many rules join facts from several objects - the node pools a pod may land on,
the operator version, the Prometheus that selects a monitor, the NetworkPolicies of a
namespace. Those facts only hold where they are deployed together. Given several repositories
at once (``fleetserve doctor repo-a repo-b``, or a folder of clones), one repository's
Karpenter NodePools must not judge another's pods, nor its operator version decide another's
severities. So the input is split into contexts, and each is loaded and judged on its own:

* a Helm chart (a folder with ``Chart.yaml``): its values belong to its release;
* a repository (a folder with ``.git``);
* everything else, together, as before (files named one by one are meant together).

A file belongs to the nearest such folder above it. What must stay true: the split depends
only on the files' paths (the same input, the same contexts, in a stable order), and input
without any repository or chart is one context, exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleetserve.k8s.doctor.loader import STDIN

#: Files or folders that make a folder the root of its own context.
_MARKERS = (".git", "Chart.yaml")


def context_root(file: Path) -> Path | None:
    """The nearest folder above ``file`` that is a repository or a Helm chart, or None."""
    if str(file) == STDIN:
        return None
    for folder in file.resolve().parents:
        if any((folder / marker).exists() for marker in _MARKERS):
            return folder
    return None


def split_contexts(files: Sequence[Path]) -> list[list[Path]]:
    """``files`` grouped by context, each group in input order; groups ordered by their first
    file. Files under no repository or chart form one group."""
    groups: dict[Path | None, list[Path]] = {}
    for f in files:
        groups.setdefault(context_root(f), []).append(f)
    return list(groups.values())
