"""Seed 002: AI-on-EKS vLLM RayService that KubeRay refused and Karpenter never scheduled."""

from __future__ import annotations

from pathlib import Path

from fleetserve.k8s.doctor.loader import load_paths
from fleetserve.k8s.doctor.schema import validate_schemas

from .conftest import SEEDS, findings_for

SEED = SEEDS / "seed002"


def _by_rule(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in findings_for(path):
        out.setdefault(f.rule, []).append(f.path)
    return out


def test_original_reports_what_the_author_hit() -> None:
    found = _by_rule(SEED / "original")
    # 1. the operator refused the RayService: no RayCluster appeared.
    assert found["rayservice-head-service-name"] == [
        "spec.rayClusterConfig.headGroupSpec.headService.metadata.name"
    ]
    # 2. both pods stayed Pending: NodeGroupType labels exist on no Karpenter pool.
    assert sorted(found["node-selector-no-pool"]) == [
        "spec.rayClusterConfig.headGroupSpec.template.spec.nodeSelector",
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.nodeSelector",
    ]
    # 3. the deprecated thresholds do nothing.
    assert len(found["deprecated-threshold"]) == 2
    # The worker tolerates the GPU taint and Serve max_replicas equals maxReplicas (4 = 4).
    assert "missing-gpu-toleration" not in found
    assert "serve-replicas-exceed-workers" not in found
    assert "head-schedulable" not in found


def test_finding_points_at_the_line(tmp_path: Path) -> None:
    f = next(f for f in findings_for(SEED / "original") if f.rule == "rayservice-head-service-name")
    assert f.file is not None
    lines = Path(f.file).read_text(encoding="utf-8").splitlines()
    assert lines[f.line - 1].strip() == "name: vllm"
    assert "should not be set" in f.message


def test_node_selector_message_names_the_pool_labels() -> None:
    f = next(f for f in findings_for(SEED / "original") if f.rule == "node-selector-no-pool")
    assert 'NodePool/default/gpu has no label "NodeGroupType"' in f.message
    assert "karpenter.sh/nodepool: gpu" in f.fix
    assert "accelerator: nvidia" in f.fix


def test_authors_fix_clears_the_controller_and_scheduling_errors() -> None:
    found = _by_rule(SEED / "fixed")
    assert "rayservice-head-service-name" not in found
    assert "node-selector-no-pool" not in found
    assert "missing-gpu-toleration" not in found


def test_kubectl_apply_accepted_it(crds_dir: Path) -> None:
    # The point of the seed: the schema is satisfied, the controller and scheduler are not.
    inv = load_paths([SEED / "original"])
    assert validate_schemas(inv, crds_dir).findings == []
