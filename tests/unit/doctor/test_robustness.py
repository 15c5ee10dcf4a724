"""Malformed input never crashes doctor: every field of realistic manifests is replaced by a
value of the wrong shape, and schema validation plus the scheduling/KubeRay rules must still
return findings (the schema reports the bad value) rather than raise."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from fleetserve.k8s.doctor.inventory import Inventory, Manifest, split_path
from fleetserve.k8s.doctor.loader import load_paths
from fleetserve.k8s.doctor.registry import run_rules
from fleetserve.k8s.doctor.schema import validate_schemas

from .conftest import FIXTURES, SEEDS
from .test_command import SCHEDULING_AND_KUBERAY

CASES = [
    SEEDS / "seed002" / "original",
    SEEDS / "seed000" / "original",
    FIXTURES / "ingress-starved" / "trigger_serve_llm.yaml",
    FIXTURES / "node-selector-no-pool" / "near_miss_affinity.yaml",
    FIXTURES / "upgrade-strategy" / "trigger_step.yaml",
]
BAD_VALUES: list[Any] = ["x", 3, [], {"a": 1}]


def _set(body: dict[str, Any], path: str, value: Any) -> bool:
    """Replace the value at ``path``; False when the path is not addressable (dotted keys)."""
    parts = split_path(path)
    node: Any = body
    try:
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = value
    except (KeyError, IndexError, TypeError):
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_wrong_shapes_do_not_crash(case: Path, crds_dir: Path) -> None:
    inv = load_paths([case])
    rules = set(SCHEDULING_AND_KUBERAY)
    for i, m in enumerate(inv.manifests):
        for path in m.lines:
            for value in BAD_VALUES:
                body = copy.deepcopy(m.body)
                if not _set(body, path, value):
                    continue
                bad = Manifest(
                    m.api_version, m.kind, m.name, m.namespace, body, m.file, m.line, m.lines
                )
                manifests = (*inv.manifests[:i], bad, *inv.manifests[i + 1 :])
                mutated = Inventory(manifests, inv.helm_values, inv.scaling_configs, inv.fleets)
                run_rules(mutated, rules)
                validate_schemas(mutated, crds_dir)
