"""The Namespace and NetworkPolicy of a fleet (pure).

Design: the Ray pods of the fleet may talk to each other on any port (GCS, raylets, object
transfer, NCCL all use dynamic ports). From outside those pods only these are open:

* the Serve HTTP port, to anyone (the OpenAI endpoint);
* the metrics port (8080), only from Prometheus's namespace;
* the dashboard port (8265), only from the KubeRay operator's namespace - the RayService
  controller deploys the Serve config and reads its status through it.

The dashboard/Jobs API (8265) and the Ray client port (10001) run arbitrary code for whoever
reaches them (CVE-2023-48022 class), so nothing else may reach them. The Namespace asks Pod
Security admission to warn and audit against "restricted" (not to enforce: containers the
KubeRay operator injects are outside fleetserve's control).
"""

from __future__ import annotations

from typing import Any

from fleetserve.k8s.render.naming import (
    DASHBOARD_PORT,
    METRICS_PORT,
    common_labels,
    pod_selector,
)
from fleetserve.spec import FleetSpec

_NS_LABEL = "kubernetes.io/metadata.name"


def namespace(spec: FleetSpec) -> dict[str, Any]:
    k8s = spec.kubernetes
    labels = {
        **common_labels(k8s.name),
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": k8s.namespace, "labels": dict(sorted(labels.items()))},
    }


def network_policy(
    spec: FleetSpec, *, prometheus_namespace: str, kuberay_namespace: str
) -> dict[str, Any]:
    k8s = spec.kubernetes
    pods = {"matchLabels": pod_selector(k8s.name)}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{k8s.name}-ingress",
            "namespace": k8s.namespace,
            "labels": common_labels(k8s.name),
        },
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": pods}]},
                {
                    # Anyone: every pod of every namespace, and any address outside the
                    # cluster (written out rather than omitting `from`, so the rule reads as
                    # what it is: the one port open to all).
                    "from": [
                        {"namespaceSelector": {}},
                        {"ipBlock": {"cidr": "0.0.0.0/0"}},
                        {"ipBlock": {"cidr": "::/0"}},
                    ],
                    "ports": [{"port": spec.server.port, "protocol": "TCP"}],
                },
                {
                    "from": [
                        {"namespaceSelector": {"matchLabels": {_NS_LABEL: prometheus_namespace}}}
                    ],
                    "ports": [{"port": METRICS_PORT, "protocol": "TCP"}],
                },
                {
                    "from": [
                        {"namespaceSelector": {"matchLabels": {_NS_LABEL: kuberay_namespace}}}
                    ],
                    "ports": [{"port": DASHBOARD_PORT, "protocol": "TCP"}],
                },
            ],
        },
    }
