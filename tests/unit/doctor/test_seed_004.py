"""Seed 004: HAMi + KubeRay + vLLM on a mixed RTX 3090 / A6000 / T4 pool.

What the team really ran into, and what doctor says about their published manifests:

* a week with HAMi's kube-scheduler off, until slices summed past a card and the OOM killer
  took vLLM workers (section 1.2) -> ``hami-scheduler-disabled`` on their values file;
* "tensor_parallel_size and ray_actor_options.num_gpus must match" (section 2.4, half a day):
  their RayService gives each worker pod ``nvidia.com/gpu: 1`` (one 22000 MiB slice) while a
  replica asks for 4 GPUs, which with HAMi means 4 slices on 4 cards in ONE pod
  -> ``hami-gpu-count`` and Ray's ``infeasible-request``;
* the deprecated health thresholds they still set -> ``deprecated-threshold``.

And what must stay quiet: rayVersion matches the images (2.35.0), the reconstructed
NetworkPolicy (section 6) restricts ingress, the custom node label gives no card size (no
memory verdict without facts), and no secret is written in clear text.
"""

from __future__ import annotations

import json

import pytest

from fleetserve.cli import main
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_paths
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import SEEDS

SEED = SEEDS / "seed004"
INCIDENT_VALUES = SEEDS / "seed004_incident" / "hami-values.yaml"
MANIFESTS = [
    SEED / "rayservice-llama3-70b.yaml",
    SEED / "pod-vllm-worker-llama3-8b.yaml",
    SEED / "networkpolicy-llm-serving.yaml",
]


def _findings(*paths: object) -> list[Finding]:
    return run_rules(load_paths([str(p) for p in paths]))


def _rules(found: list[Finding]) -> set[str]:
    return {f.rule for f in found}


def test_incident_week_reports_the_disabled_scheduler() -> None:
    found = _findings(*MANIFESTS, INCIDENT_VALUES)
    (f,) = [f for f in found if f.rule == "hami-scheduler-disabled"]
    assert f.severity == "error"
    assert f.object == f"HelmValues/{INCIDENT_VALUES}"
    assert f.path == "scheduler.kubeScheduler.enabled"
    # Both slicing workloads of the article are named: the Ray workers and the section-1.3 pod.
    assert "2 container(s) in the input ask for HAMi slices" in f.message
    assert "22000 MiB" in f.message
    assert "kubeScheduler.enabled: true" in f.fix
    lines = INCIDENT_VALUES.read_text(encoding="utf-8").splitlines()
    assert f.line is not None
    assert lines[f.line - 1].strip() == "enabled: false"


def test_published_values_keep_the_scheduler() -> None:
    found = _findings(*MANIFESTS, SEED / "hami-values.yaml")
    assert "hami-scheduler-disabled" not in _rules(found)


def test_tp4_replica_on_one_slice_pods() -> None:
    found = _findings(*MANIFESTS, SEED / "hami-values.yaml")
    (count,) = [f for f in found if f.rule == "hami-gpu-count"]
    # An error, as without HAMi: slicing does not give vLLM the ranks it needs (#30).
    assert count.severity == "error"
    assert "'llama3/VLLMDeployment' needs 4 GPUs in one pod (num_gpus 4)" in count.message
    assert count.message.endswith("so not even one replica fits.")
    assert "nvidia.com/gpu: 1" in count.message
    assert "22000 MiB" in count.fix
    assert count.path == (
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0]"
        ".resources.limits.nvidia.com/gpu"
    )
    # Ray's side of the same mistake: no worker pod advertises 4 GPUs.
    assert "infeasible-request" in _rules(found)


def test_what_must_stay_quiet() -> None:
    found = _findings(*MANIFESTS, SEED / "hami-values.yaml")
    quiet = {
        "rayversion-image-mismatch",  # rayVersion 2.35.0 = rayproject/ray:2.35.0-py311(-cu121)
        "no-network-policy",  # section 6's policy: only istio-ingressgateway gets in
        "hami-gpumem-overflow",  # gpu.cubox.ai/family: ampere names no card size
        "hami-engine-memory",  # the vLLM arguments live in llm_app.py, not the manifest
        "kv-cache-too-small",
        "tp-gpus-mismatch",  # TP is only in llm_app.py: not guessed from the config
        "plaintext-secret",  # tokens come from Vault via ExternalSecrets
        "dashboard-exposed",
        "tenant-shares-gpu",
        "hami-privileged-gpu",
    }
    assert not quiet & _rules(found), [f for f in found if f.rule in quiet]


def test_without_the_network_policy_the_namespace_is_open() -> None:
    found = _findings(SEED / "rayservice-llama3-70b.yaml")
    (f,) = [f for f in found if f.rule == "no-network-policy"]
    assert "'llm-serving'" in f.message


def test_deprecated_thresholds_are_reported() -> None:
    found = _findings(SEED / "rayservice-llama3-70b.yaml")
    paths = sorted(f.path for f in found if f.rule == "deprecated-threshold")
    assert paths == [
        "spec.deploymentUnhealthySecondThreshold",
        "spec.serviceUnhealthySecondThreshold",
    ]


def test_command_line_report(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["doctor", *(str(p) for p in MANIFESTS), str(INCIDENT_VALUES), "--format", "json"]
    assert main(argv) == 1  # error findings
    report = json.loads(capsys.readouterr().out)
    rules = {item["rule"] for item in report}
    assert {"hami-scheduler-disabled", "hami-gpu-count", "infeasible-request"} <= rules
    scheduler = next(item for item in report if item["rule"] == "hami-scheduler-disabled")
    assert scheduler["object"] == f"HelmValues/{INCIDENT_VALUES}"
    assert set(scheduler) >= {"rule", "severity", "object", "path", "message", "fix"}
