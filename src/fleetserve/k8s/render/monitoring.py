"""Monitoring objects: ServiceMonitor (head), PodMonitor (workers), PrometheusRule, dashboard.

Design: KubeRay creates a Service only for the head, so the head is scraped through the
RayService's stable head Service (``ray.io/originated-from-cr-name=<name>``, which follows
the active cluster across blue/green upgrades, so series are not duplicated by the
per-cluster head Service) and the workers through a PodMonitor on the pod labels fleetserve
sets. All four objects carry the label the Prometheus CR selects them by (default
``release: kube-prometheus-stack``); without it Prometheus silently ignores them. Alert
rules and the dashboard come from :mod:`fleetserve.observe`, scoped to the fleet's namespace.

With HAMi slices a fifth object scrapes HAMi's vGPU monitor (the ``hami-device-plugin``
Service's ``monitorport``, container port 9394, in HAMi's namespace). Its series label each
slice with the engine pod's ``namespace``/``pod``/``container``; ``honorLabels`` keeps those
(otherwise Prometheus renames them ``exported_*`` and overwrites them with the monitor pod's
own), which is what joins a slice with its engine's vLLM series - scraped by the PodMonitor,
whose targets carry the same ``namespace``/``pod``. Only this fleet's namespace is kept, so a
HAMi shared by several fleets is not scraped into duplicate series by each.
"""

from __future__ import annotations

import json
from typing import Any

from fleetserve.k8s.render.naming import METRICS_PORT_NAME, common_labels, pod_selector
from fleetserve.observe.alerts import AlertThresholds, rule_groups
from fleetserve.observe.dashboard import grafana_dashboard
from fleetserve.spec import FleetSpec

SCRAPE_INTERVAL = "30s"
#: HAMi chart's device-plugin monitor Service: its port name and the component label.
HAMI_MONITOR_PORT_NAME = "monitorport"
HAMI_COMPONENT = {"app.kubernetes.io/component": "hami-device-plugin"}
#: Label kube-prometheus-stack's Grafana sidecar loads dashboard ConfigMaps by.
GRAFANA_DASHBOARD_LABEL = "grafana_dashboard"


def _meta(spec: FleetSpec, name: str, extra: dict[str, str]) -> dict[str, Any]:
    k8s = spec.kubernetes
    labels = {**common_labels(k8s.name), **extra}
    return {"name": name, "namespace": k8s.namespace, "labels": dict(sorted(labels.items()))}


def _cluster_relabel() -> list[dict[str, Any]]:
    return [
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
            "targetLabel": "ray_io_cluster",
        }
    ]


def service_monitor(spec: FleetSpec, labels: dict[str, str]) -> dict[str, Any]:
    k8s = spec.kubernetes
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(spec, f"{k8s.name}-head", labels),
        "spec": {
            "jobLabel": "ray.io/node-type",
            "namespaceSelector": {"matchNames": [k8s.namespace]},
            "selector": {
                "matchLabels": {
                    "ray.io/node-type": "head",
                    "ray.io/originated-from-cr-name": k8s.name,
                    "ray.io/originated-from-crd": "RayService",
                }
            },
            "endpoints": [
                {
                    "port": METRICS_PORT_NAME,
                    "interval": SCRAPE_INTERVAL,
                    "relabelings": _cluster_relabel(),
                }
            ],
        },
    }


def pod_monitor(spec: FleetSpec, labels: dict[str, str]) -> dict[str, Any]:
    k8s = spec.kubernetes
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(spec, f"{k8s.name}-workers", labels),
        "spec": {
            "jobLabel": "ray.io/node-type",
            "namespaceSelector": {"matchNames": [k8s.namespace]},
            "selector": {"matchLabels": {**pod_selector(k8s.name), "ray.io/node-type": "worker"}},
            "podMetricsEndpoints": [
                {
                    "port": METRICS_PORT_NAME,
                    "interval": SCRAPE_INTERVAL,
                    "relabelings": _cluster_relabel(),
                }
            ],
        },
    }


def hami_service_monitor(
    spec: FleetSpec, labels: dict[str, str], *, hami_namespace: str
) -> dict[str, Any]:
    """Scrapes HAMi's vGPU monitor for this fleet's slices (see the module docstring)."""
    k8s = spec.kubernetes
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(spec, f"{k8s.name}-hami", labels),
        "spec": {
            "namespaceSelector": {"matchNames": [hami_namespace]},
            "selector": {"matchLabels": dict(HAMI_COMPONENT)},
            "endpoints": [
                {
                    "port": HAMI_MONITOR_PORT_NAME,
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    "honorLabels": True,
                    "metricRelabelings": [
                        {
                            "action": "keep",
                            "sourceLabels": ["namespace"],
                            "regex": k8s.namespace,
                        }
                    ],
                }
            ],
        },
    }


def prometheus_rule(
    spec: FleetSpec, labels: dict[str, str], thresholds: AlertThresholds
) -> dict[str, Any]:
    k8s = spec.kubernetes
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(spec, f"{k8s.name}-alerts", labels),
        "spec": rule_groups({"namespace": k8s.namespace}, thresholds),
    }


def dashboard_configmap(spec: FleetSpec) -> dict[str, Any]:
    k8s = spec.kubernetes
    dashboard = grafana_dashboard(
        {"namespace": k8s.namespace},
        uid=f"fleetserve-{k8s.name}"[:40],
        title=f"fleetserve: {k8s.namespace}/{k8s.name}",
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, f"{k8s.name}-dashboard", {GRAFANA_DASHBOARD_LABEL: "1"}),
        "data": {
            f"fleetserve-{k8s.name}.json": json.dumps(dashboard, indent=2, sort_keys=True) + "\n"
        },
    }
