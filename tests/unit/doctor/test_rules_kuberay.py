"""KubeRay controller rules: each message quotes what the operator says."""

from __future__ import annotations

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_text
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import FIXTURES

RS = (FIXTURES / "head-schedulable" / "near_miss.yaml").read_text(encoding="utf-8")


def _rules(text: str, *rules: str) -> list[Finding]:
    return run_rules(load_text(text, "x.yaml"), set(rules))


@pytest.mark.parametrize(
    ("kind", "name", "bad"),
    [
        ("RayService", "a" * 47, False),
        ("RayService", "a" * 48, True),
        ("RayCluster", "a" * 53, False),
        ("RayCluster", "a" * 54, True),
        ("RayJob", "a" * 48, True),
        ("RayService", "Vllm_Service", True),
        ("RayService", "7b-model", True),
    ],
)
def test_name_limits(kind: str, name: str, bad: bool) -> None:
    text = f"apiVersion: ray.io/v1\nkind: {kind}\nmetadata: {{name: {name}}}\nspec: {{}}\n"
    assert bool(_rules(text, "name-too-long")) is bad


def test_dns_message_and_fix() -> None:
    text = "apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: Vllm_Service}\nspec: {}\n"
    [f] = _rules(text, "name-too-long")
    assert "valid DNS1035 label" in f.message
    assert "'vllm-service'" in f.fix


def test_negative_replicas() -> None:
    text = RS.replace("minReplicas: 1", "minReplicas: -1")
    [f] = _rules(text, "replicas-min-gt-max")
    assert "worker group gpu has negative minReplicas -1" in f.message


def test_unknown_upgrade_type() -> None:
    text = RS.replace(
        "spec:\n  serveConfigV2", "spec:\n  upgradeStrategy:\n    type: BlueGreen\n  serveConfigV2"
    )
    [f] = _rules(text, "upgrade-strategy")
    assert "'BlueGreen' is invalid" in f.message
    assert f.path == "spec.upgradeStrategy.type"


def test_incremental_upgrade_needs_autoscaling() -> None:
    text = (FIXTURES / "upgrade-strategy" / "near_miss.yaml").read_text(encoding="utf-8")
    text = text.replace("enableInTreeAutoscaling: true", "enableInTreeAutoscaling: false")
    [f] = _rules(text, "upgrade-strategy")
    assert "Ray Autoscaler is required" in f.message


def _head_env(text: str, name: str, value: str) -> str:
    return text.replace(
        "                  memory: 8Gi\n",
        f"                  memory: 8Gi\n              env:\n                - name: {name}\n"
        f'                  value: "{value}"\n',
        1,
    )


def test_autoscaler_v2_env_and_version_conflicts() -> None:
    env_only = _head_env(RS, "RAY_enable_autoscaler_v2", "1").replace(
        '                  nvidia.com/gpu: "1"\n',
        '                  nvidia.com/gpu: "1"\n            restartPolicy: OnFailure\n',
    )
    # The operator's IsAutoscalingV2Enabled reads autoscalerOptions.version only.
    assert _rules(env_only, "autoscaler-v2-restart-policy") == []
    both = env_only.replace(
        "enableInTreeAutoscaling: true",
        "enableInTreeAutoscaling: true\n    autoscalerOptions:\n      version: v2",
    )
    messages = [f.message for f in _rules(both, "autoscaler-v2-restart-policy")]
    assert any("please only use the former" in m for m in messages)
    assert any("'OnFailure'" in m for m in messages)
    off = _head_env(RS, "RAY_enable_autoscaler_v2", "true").replace(
        "enableInTreeAutoscaling: true", "enableInTreeAutoscaling: false"
    )
    [g] = _rules(off, "autoscaler-v2-restart-policy")
    assert "enableInTreeAutoscaling is false" in g.message


def test_gcs_ft_redis_password_with_options() -> None:
    text = (FIXTURES / "gcs-ft-conflict" / "near_miss.yaml").read_text(encoding="utf-8")
    text = text.replace('num-cpus: "0"', 'num-cpus: "0"\n        redis-password: secret')
    [f] = _rules(text, "gcs-ft-conflict")
    assert "rayStartParams redis-password" in f.message
    assert "gcsFaultToleranceOptions.redisPassword" in f.fix


def test_redis_env_with_legacy_annotation_is_allowed() -> None:
    text = (FIXTURES / "gcs-ft-conflict" / "trigger_redis_env.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "  namespace: serving\n",
        '  namespace: serving\n  annotations:\n    ray.io/ft-enabled: "true"\n',
        1,
    )
    assert _rules(text, "gcs-ft-conflict") == []


def test_resources_set_twice_quotes_the_operator() -> None:
    text = (FIXTURES / "resources-set-twice" / "trigger.yaml").read_text(encoding="utf-8")
    [f] = _rules(text, "resources-set-twice")
    assert "for gpu group; please use only one" in f.message
    assert f.path == "spec.rayClusterConfig.workerGroupSpecs[0].resources"
