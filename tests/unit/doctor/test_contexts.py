"""Context stays where it belongs (issue #30, item 2): given several repositories at once, one
repository's Karpenter NodePools and operator version do not judge another's objects.

The fixtures (tests/fixtures/doctor/contexts/) are shapes of real files: a data-on-eks
NodePool, an ai-on-eks RayService whose nodeSelector names its own (absent) Karpenter pool,
and KubeRay's operator Deployment. A sweep over eight public repositories given at once found
76 false node-selector-no-pool errors and 9 warnings raised to errors this way.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetserve.k8s.doctor.command import diagnose
from fleetserve.k8s.doctor.context import split_contexts

from .conftest import FIXTURES

CONTEXTS = FIXTURES / "contexts"


def _repo(root: Path, name: str, *files: str) -> Path:
    repo = root / name
    (repo / ".git").mkdir(parents=True)
    for f in files:
        shutil.copy(CONTEXTS / f, repo / f)
    return repo


def _rules(paths: list[Path]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in diagnose(
        [str(p) for p in paths], rules={"node-selector-no-pool", "rayservice-head-service-name"}
    ).findings:
        found.setdefault(f.rule, []).append(f.severity)
    return found


def test_one_repositorys_pools_and_operator_do_not_judge_another(tmp_path: Path) -> None:
    infra = _repo(tmp_path, "data-on-eks", "nodepool.yaml", "operator.yaml")
    app = _repo(tmp_path, "ai-on-eks", "rayservice.yaml")
    alone = _rules([app])
    # Alone: no pool in its repository (nothing to check against), no operator version (a
    # warning in the conservative wording).
    assert alone == {"rayservice-head-service-name": ["warning"]}
    assert _rules([infra, app]) == alone
    assert _rules([tmp_path]) == alone  # a folder of clones: the same


def test_without_repositories_the_input_is_one_context(tmp_path: Path) -> None:
    for f in ("nodepool.yaml", "operator.yaml", "rayservice.yaml"):
        shutil.copy(CONTEXTS / f, tmp_path / f)
    found = _rules([tmp_path])
    # Together they are one cluster: its pool cannot place the worker, KubeRay 1.7.0 rejects.
    assert found["rayservice-head-service-name"] == ["error"]
    assert "error" in found["node-selector-no-pool"]


def test_a_helm_chart_is_its_own_context(tmp_path: Path) -> None:
    chart = tmp_path / "charts" / "kuberay-operator"
    chart.mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: x\nversion: 1.0.0\n", "utf-8")
    files = [chart / "values.yaml", tmp_path / "app.yaml", tmp_path / "b.yaml"]
    assert split_contexts(files) == [[chart / "values.yaml"], files[1:]]
