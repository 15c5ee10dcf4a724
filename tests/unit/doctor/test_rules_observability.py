"""Observability and security rules: selector semantics, exposure paths, literal secrets."""

from __future__ import annotations

import base64
import textwrap

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_paths, load_text
from fleetserve.k8s.doctor.registry import run_rules
from fleetserve.k8s.doctor.rules.observability import selector_matches

from .conftest import FIXTURES, SEEDS


def _run(rule_id: str, text: str) -> list[Finding]:
    return [f for f in run_rules(load_text(textwrap.dedent(text)), {rule_id}) if f.rule == rule_id]


def _fixture(rule_id: str, name: str) -> list[Finding]:
    inv = load_paths([FIXTURES / rule_id / name])
    return [f for f in run_rules(inv, {rule_id}) if f.rule == rule_id]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (None, {"a": "1"}, None),
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "2"}}, {"a": "1"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]},
            {"a": "1"},
            True,
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
            {"a": "1"},
            False,
        ),
        ({"matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, {"a": "1"}, True),
    ],
)
def test_selector_semantics(
    selector: object, labels: dict[str, str], expected: bool | None
) -> None:
    assert selector_matches(selector, labels) is expected


# --------------------------------------------------------------------------- monitoring


def test_release_label_missing_on_each_object() -> None:
    found = _fixture("servicemonitor-release-label", "trigger.yaml")
    assert sorted(f.object for f in found) == [
        "PrometheusRule/rayserve-vllm/ray-cluster-gcs-rules",
        "ServiceMonitor/rayserve-vllm/ray-head-monitor",
    ]
    assert "release: kube-prometheus-stack" in found[0].fix


def test_prometheus_cr_selector_is_the_reference() -> None:
    (f,) = _fixture("servicemonitor-release-label", "trigger_prometheus_cr.yaml")
    assert "podMonitorSelector={prometheus: main}" in f.message


def test_prometheus_with_null_namespace_selector_watches_its_own_namespace() -> None:
    text = """
    apiVersion: monitoring.coreos.com/v1
    kind: Prometheus
    metadata: {name: main, namespace: monitoring}
    spec:
      serviceMonitorSelector: {}
    ---
    apiVersion: monitoring.coreos.com/v1
    kind: ServiceMonitor
    metadata: {name: sm, namespace: serving}
    spec:
      selector: {matchLabels: {ray.io/node-type: head}}
      endpoints: [{port: metrics}]
    """
    (f,) = _run("servicemonitor-release-label", text)
    assert "in namespace 'monitoring' only" in f.message


def test_worker_podmonitor_needed_only_when_monitoring_is_set_up() -> None:
    rs = (FIXTURES / "worker-metrics-podmonitor" / "trigger.yaml").read_text(encoding="utf-8")
    first_doc = rs.split("\n---\n")[0]
    assert not _run("worker-metrics-podmonitor", first_doc)
    (f,) = _fixture("worker-metrics-podmonitor", "trigger.yaml")
    assert "group(s): gpu" in f.message
    assert f.path == "spec.rayClusterConfig.workerGroupSpecs"


def test_podmonitor_for_another_namespace_does_not_count() -> None:
    text = (FIXTURES / "worker-metrics-podmonitor" / "near_miss.yaml").read_text(encoding="utf-8")
    moved = text.replace(
        "  name: ray-workers-monitor\n  namespace: rayserve-vllm",
        "  name: ray-workers-monitor\n  namespace: monitoring",
    )
    assert moved != text
    assert _run("worker-metrics-podmonitor", moved)
    any_ns = moved.replace(
        "spec:\n  selector:\n    matchLabels:\n      ray.io/node-type: worker",
        "spec:\n  namespaceSelector:\n    any: true\n  selector:\n    matchLabels:\n"
        "      ray.io/node-type: worker",
    )
    assert any_ns != moved
    assert not _run("worker-metrics-podmonitor", any_ns)


# --------------------------------------------------------------------------- dashboard


def test_loadbalancer_dashboard_and_client_ports() -> None:
    found = _fixture("dashboard-exposed", "trigger.yaml")
    assert [f.path for f in found] == ["spec.ports[0]", "spec.ports[1]"]
    assert "port 8265 (dashboard / Jobs API)" in found[0].message
    assert "port 10001 (Ray client)" in found[1].message


def test_nodeport_by_target_port_and_ingress_backend() -> None:
    text = """
    apiVersion: v1
    kind: Service
    metadata: {name: dash, namespace: ns}
    spec:
      type: NodePort
      ports:
        - port: 80
          targetPort: 8265
    ---
    apiVersion: networking.k8s.io/v1
    kind: Ingress
    metadata: {name: dash, namespace: ns}
    spec:
      rules:
        - host: ray.example.com
          http:
            paths:
              - path: /
                pathType: Prefix
                backend:
                  service:
                    name: raycluster-head-svc
                    port:
                      name: dashboard
    """
    found = _run("dashboard-exposed", text)
    assert sorted(f.object for f in found) == ["Ingress/ns/dash", "Service/ns/dash"]


def test_kuberay_enable_ingress() -> None:
    text = (FIXTURES / "dashboard-exposed" / "trigger_head_service_type.yaml").read_text(
        encoding="utf-8"
    )
    text = text.replace("      serviceType: LoadBalancer\n", "      enableIngress: true\n")
    (f,) = _run("dashboard-exposed", text)
    assert f.path.endswith("headGroupSpec.enableIngress")


# --------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    ("name", "value", "secret"),
    [
        ("HUGGING_FACE_HUB_TOKEN", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", True),
        ("OPENAI_API_KEY", "sk-proj-abcdefghijklmnopqrstuvwx", True),
        ("API_KEY", "s3cr3t-value-for-prod", True),
        ("DB_PASSWORD", "hunter2hunter2", True),
        ("SOME_SETTING", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", True),  # shape wins
        ("HF_TOKEN", "${HF_TOKEN}", False),
        ("HF_TOKEN", "$HF_TOKEN", False),
        ("HF_TOKEN", "<your token>", False),
        ("HF_TOKEN", "", False),
        ("TOKENIZERS_PARALLELISM", "false", False),
        ("MAX_NUM_BATCHED_TOKENS", "8192", False),
        ("HF_TOKEN_FILE", "/var/run/secrets/hf/token", False),
        ("PAD_TOKEN", "[PAD]", False),
        ("EOS_TOKEN", "<|eot_id|>", False),
        ("VAULT_TOKEN", "/vault/secrets/token", False),
        ("OAUTH_PROXY_SECRET", "short", False),
    ],
)
def test_env_literal_secrets(name: str, value: str, secret: bool) -> None:
    text = f"""
    apiVersion: apps/v1
    kind: Deployment
    metadata: {{name: d, namespace: ns}}
    spec:
      template:
        spec:
          containers:
            - name: c
              image: vllm/vllm-openai:v0.11.0
              env:
                - name: {name}
                  value: "{value}"
    """
    assert bool(_run("plaintext-secret", text)) is secret


def test_secret_object_with_a_real_token_in_data() -> None:
    token = base64.b64encode(b"hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789").decode()
    text = f"""
    apiVersion: v1
    kind: Secret
    metadata: {{name: hf-token, namespace: ns}}
    data:
      hf-token: {token}
    """
    (f,) = _run("plaintext-secret", text)
    assert "base64 is an encoding, not encryption" in f.message
    assert f.path == "data.hf-token"


def test_rayjob_runtime_env_yaml() -> None:
    text = """
    apiVersion: ray.io/v1
    kind: RayJob
    metadata: {name: finetune, namespace: ns}
    spec:
      entrypoint: python train.py
      runtimeEnvYAML: |
        env_vars:
          WANDB_API_KEY: "0123456789abcdef0123456789abcdef"
    """
    (f,) = _run("plaintext-secret", text)
    assert "WANDB_API_KEY" in f.message


def test_seed_002_secret_placeholder_is_not_a_leak() -> None:
    inv = load_paths([SEEDS / "seed002" / "original"])
    assert not run_rules(inv, {"plaintext-secret"})


# --------------------------------------------------------------------------- network policy


def test_policy_selecting_other_pods_does_not_count() -> None:
    base = (FIXTURES / "no-network-policy" / "near_miss.yaml").read_text(encoding="utf-8")
    other = base.replace(
        "  podSelector: {}\n", "  podSelector:\n    matchLabels:\n      app: web\n"
    )
    assert other != base
    (f,) = _run("no-network-policy", other)
    assert "none restricting their ingress" in f.message


def test_egress_only_policy_does_not_restrict_ingress() -> None:
    base = (FIXTURES / "no-network-policy" / "near_miss.yaml").read_text(encoding="utf-8")
    egress = base.replace('policyTypes: ["Ingress"]', 'policyTypes: ["Egress"]')
    assert egress != base
    assert _run("no-network-policy", egress)


def test_api_key_flag_literal_vs_env_expansion() -> None:
    (f,) = _fixture("plaintext-secret", "trigger_api_key_flag.yaml")
    assert "the value of --api-key" in f.message
    assert "VLLM_API_KEY" in f.fix
    assert not _fixture("plaintext-secret", "near_miss_api_key_env.yaml")
