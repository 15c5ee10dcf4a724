"""Stable names and labels of rendered objects (pure).

What must stay true: every name is a function of the spec only (never of dict order, time or
randomness), is a valid Kubernetes/Ray name, and two different inputs never collide - where
a name is shortened or sanitised, a short hash of the original keeps it unique.
"""

from __future__ import annotations

import hashlib
import re

#: Ray's Serve HTTP port inside the pods (KubeRay's serve Service targets the "serve" port).
SERVE_PORT_NAME = "serve"
#: Ray's metrics-export port (KubeRay's default, ``--metrics-export-port``).
METRICS_PORT = 8080
METRICS_PORT_NAME = "metrics"
#: Ports that must never be reachable from outside the cluster's own pods.
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
GCS_PORT = 6379

#: Prefix of the Ray custom resource that pins a model's Serve replicas to its worker group.
MODEL_RESOURCE_PREFIX = "fleetserve_model_"


def _digest(text: str, size: int = 6) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def dns_label(text: str, max_length: int = 63) -> str:
    """``text`` as a DNS-1123 label; sanitised or shortened names get a hash suffix."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"
    label = re.sub(r"-{2,}", "-", label)
    if label == text and len(label) <= max_length:
        return label
    head = label[: max_length - 7].rstrip("-")
    return f"{head}-{_digest(text)}"


def model_resource(model_name: str) -> str:
    """The Ray custom resource a model's replicas require (one unit per worker pod)."""
    body = re.sub(r"[^A-Za-z0-9_]+", "_", model_name).strip("_")
    if body == model_name and len(body) <= 40:
        return MODEL_RESOURCE_PREFIX + body
    return f"{MODEL_RESOURCE_PREFIX}{body[:40]}_{_digest(model_name)}"


def group_name(pool: str, model_name: str) -> str:
    """Worker group of one model on one pool (also a label value: at most 63 chars)."""
    return dns_label(f"{pool}-{model_name}", max_length=48)


def common_labels(instance: str) -> dict[str, str]:
    """Labels on every rendered object and pod (selectors of monitors and the policy)."""
    return {
        "app.kubernetes.io/name": "fleetserve",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/managed-by": "fleetserve",
    }


def pod_selector(instance: str) -> dict[str, str]:
    """Selects every Ray pod (head and workers) of this fleet."""
    return {"app.kubernetes.io/name": "fleetserve", "app.kubernetes.io/instance": instance}
