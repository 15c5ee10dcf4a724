"""Rules: observability and security (pitfalls.md, "Observability and security").

Monitoring rules match label selectors the way the Prometheus Operator and Kubernetes do
(matchLabels and matchExpressions; an empty selector selects everything, a missing one
nothing). Exposure and secret rules look at every place a value can reach the outside: Service
types, KubeRay's own head Service and Ingress switches, Ingress/Istio/Gateway API routes, env
vars of every container, and the ``runtime_env`` inside Serve configs and RayJobs.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from packaging.version import Version

from fleetserve.k8s.doctor.crds import KUBERAY, named_versions
from fleetserve.k8s.doctor.finding import Finding, Severity
from fleetserve.k8s.doctor.inventory import HelmValues, Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import (
    RAY_KINDS,
    as_dict,
    cluster_spec,
    head_group,
    serve_config,
)
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._advisories import RAY_DNS_REBINDING, RAY_SHADOWRAY
from fleetserve.k8s.doctor.rules._channels import Channel, vllm_channels
from fleetserve.k8s.doctor.rules._devices import PodView, pods
from fleetserve.k8s.doctor.rules._engines import container_engine
from fleetserve.k8s.doctor.rules._versions import (
    TOKEN_AUTH_FROM,
    KnownVersion,
    normalise,
    ray_version,
    vllm_version,
)

_MONITOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
_SELECTOR_FIELD = {
    "ServiceMonitor": ("serviceMonitorSelector", "serviceMonitorNamespaceSelector"),
    "PodMonitor": ("podMonitorSelector", "podMonitorNamespaceSelector"),
    "PrometheusRule": ("ruleSelector", "ruleNamespaceSelector"),
}
#: The label kube-prometheus-stack's Prometheus selects by (its Helm release name).
_DEFAULT_LABEL = ("release", "kube-prometheus-stack")


def _labels(m: Manifest) -> dict[str, str]:
    meta = m.body.get("metadata")
    raw = meta.get("labels") if isinstance(meta, dict) else None
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def selector_matches(selector: Any, labels: dict[str, str]) -> bool | None:
    """A LabelSelector against labels: True/False, or None for a missing (null) selector."""
    if selector is None:
        return None
    if not isinstance(selector, dict):
        return False
    ml = selector.get("matchLabels")
    if isinstance(ml, dict) and any(labels.get(str(k)) != str(v) for k, v in ml.items()):
        return False
    exprs = selector.get("matchExpressions")
    for e in exprs if isinstance(exprs, list) else []:
        if not isinstance(e, dict):
            continue
        key, op = str(e.get("key")), e.get("operator")
        values = {str(v) for v in e.get("values") or []}
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# --------------------------------------------------------------------------- release label


@rule("servicemonitor-release-label", versions="all")
def servicemonitor_release_label(inv: Inventory) -> Iterator[Finding]:
    """Monitors and rules must carry the label the Prometheus CR selects them by."""
    proms = inv.of_kind("Prometheus")
    for m in inv.of_kind(*_MONITOR_KINDS):
        labels = _labels(m)
        sel_field, ns_field = _SELECTOR_FIELD[m.kind]
        if proms:
            wanted: list[str] = []
            picked = False
            for p in proms:
                spec = p.body.get("spec") if isinstance(p.body.get("spec"), dict) else {}
                assert isinstance(spec, dict)
                ok = selector_matches(spec.get(sel_field), labels)
                ns_sel = spec.get(ns_field)
                ns_ok = m.namespace == p.namespace if ns_sel is None else True
                if ok and ns_ok:
                    picked = True
                    break
                wanted.append(
                    f"{p.ref} selects {sel_field}={_sel_text(spec.get(sel_field))}"
                    + ("" if ns_ok else f" in namespace {p.namespace!r} only")
                )
            if picked:
                continue
            yield Finding.at(
                "servicemonitor-release-label",
                "warning",
                m,
                "metadata.labels",
                f"No Prometheus in the input picks up this {m.kind} (labels "
                f"{_dict_text(labels)}, namespace {m.namespace!r}): {'; '.join(wanted)}. "
                "Prometheus ignores it without a word and nothing is scraped/evaluated.",
                f"Add the labels the Prometheus selects by to metadata.labels (or move the "
                f"{m.kind} into a namespace it watches).",
            )
            continue
        stack = _stack_selector(inv, sel_field)
        if stack is not None:
            values, selector = stack
            if selector_matches(selector, labels):
                continue
            yield Finding.at(
                "servicemonitor-release-label",
                "warning",
                m,
                "metadata.labels",
                f"The kube-prometheus-stack values in {values.file} make its Prometheus select "
                f"{m.kind}s by {sel_field}={_sel_text(selector)}, and this one's labels are "
                f"{_dict_text(labels)}: Prometheus ignores it without a word.",
                f"Add the labels of prometheus.prometheusSpec.{sel_field} in {values.file} to "
                "metadata.labels.",
            )
            continue
        if _DEFAULT_LABEL[0] in labels:
            continue
        yield Finding.at(
            "servicemonitor-release-label",
            "warning",
            m,
            "metadata.labels",
            f"This {m.kind} has no '{_DEFAULT_LABEL[0]}' label (labels: {_dict_text(labels)}): "
            f"kube-prometheus-stack's Prometheus selects {m.kind}s by "
            f"{_DEFAULT_LABEL[0]}: <helm release> ({_DEFAULT_LABEL[0]}: {_DEFAULT_LABEL[1]} in "
            "the default install) and silently ignores the rest.",
            f"Add metadata.labels.{_DEFAULT_LABEL[0]}: {_DEFAULT_LABEL[1]} (your Prometheus "
            f"release name; see its {sel_field}).",
        )


def _stack_selector(inv: Inventory, sel_field: str) -> tuple[HelmValues, dict[str, Any]] | None:
    """(kube-prometheus-stack values, the selector its Prometheus then uses for ``sel_field``):
    ``prometheus.prometheusSpec.<sel_field>`` when set, else ``{}`` (every monitor) when
    ``<sel_field>NilUsesHelmValues: false`` - the chart then renders an empty selector, as
    data-on-eks' and ai-on-eks' kube-prometheus values do. None: the values do not say."""
    for values in inv.charts("kube-prometheus-stack"):
        spec = values.get("prometheus.prometheusSpec")
        if not isinstance(spec, dict):
            continue
        selector = spec.get(sel_field)
        if isinstance(selector, dict) and selector:
            return values, selector
        if spec.get(f"{sel_field}NilUsesHelmValues") is False:
            return values, {}
    return None


def _sel_text(sel: Any) -> str:
    if sel is None:
        return "null (selects nothing)"
    if isinstance(sel, dict) and not sel:
        return "{} (everything)"
    if isinstance(sel, dict) and isinstance(sel.get("matchLabels"), dict) and len(sel) == 1:
        return _dict_text({str(k): str(v) for k, v in sel["matchLabels"].items()})
    return str(sel)


def _dict_text(d: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) + "}" if d else "none"


# --------------------------------------------------------------------------- worker metrics


def _ray_pod_labels(pod: PodView) -> dict[str, str]:
    labels = dict(pod.labels)
    if pod.group is None:
        return labels
    labels.setdefault("app.kubernetes.io/created-by", "kuberay-operator")
    labels.setdefault("app.kubernetes.io/name", "kuberay")
    return labels


def _selects_pod(selector: Any, pod: PodView) -> bool:
    """A PodMonitor selector against the pods KubeRay creates for ``pod``'s group."""
    if not isinstance(selector, dict):
        return False
    labels = _ray_pod_labels(pod)
    ml = selector.get("matchLabels")
    if isinstance(ml, dict) and "ray.io/cluster" in ml:
        # The cluster name is the RayCluster's, or generated from the RayService's name.
        want = str(ml["ray.io/cluster"])
        if pod.manifest.kind == "RayService" and want.startswith(pod.manifest.name):
            labels["ray.io/cluster"] = want
        else:
            labels.setdefault("ray.io/cluster", pod.manifest.name)
    return bool(selector_matches(selector, labels))


def _watches(monitor: Manifest, namespace: str) -> bool:
    """Whether a ServiceMonitor/PodMonitor selects targets in ``namespace``: its
    ``namespaceSelector`` (``any: true``, or ``matchNames``), else its own namespace only -
    what the Prometheus operator does."""
    ns = monitor.get("spec.namespaceSelector")
    if isinstance(ns, dict):
        if ns.get("any") is True:
            return True
        names = ns.get("matchNames")
        if isinstance(names, list) and names:
            return namespace in [str(n) for n in names]
    return monitor.namespace == namespace


@rule("worker-metrics-podmonitor", versions="all")
def worker_metrics_podmonitor(inv: Inventory) -> Iterator[Finding]:
    """Ray worker metrics need a PodMonitor: KubeRay creates no Service for workers."""
    monitors = inv.of_kind("ServiceMonitor", "PodMonitor")
    if not monitors:
        return  # monitoring is not part of this input; nothing to compare against
    for sm in inv.of_kind("ServiceMonitor"):
        ml = sm.get("spec.selector.matchLabels")
        if isinstance(ml, dict) and str(ml.get("ray.io/node-type")) == "worker":
            yield Finding.at(
                "worker-metrics-podmonitor",
                "warning",
                sm,
                "spec.selector.matchLabels",
                "This ServiceMonitor selects Services labelled ray.io/node-type: worker, but "
                "KubeRay creates a Service for the head only: it matches nothing and worker "
                "metrics (vLLM engine, GPU, Serve replica) are never scraped.",
                "Use a PodMonitor selecting ray.io/node-type: worker (port 'metrics', 8080).",
            )
    podmons = inv.of_kind("PodMonitor")
    for m in inv.of_kind(*RAY_KINDS):
        workers = [p for p in pods(inv) if p.manifest is m and p.group and not p.group.is_head]
        # Monitoring is "set up" for this object only when a monitor watches its namespace
        # (namespaceSelector as the Prometheus operator reads it): monitors of other
        # namespaces or repositories in the same input say nothing about it.
        watching = [mon for mon in monitors if _watches(mon, m.namespace)]
        if not workers or not watching:
            continue
        covered = [
            w
            for w in workers
            if any(
                _watches(pm, m.namespace) and _selects_pod(pm.get("spec.selector"), w)
                for pm in podmons
            )
        ]
        missing = [w for w in workers if w not in covered]
        if not missing:
            continue
        found = cluster_spec(m)
        path = f"{found[1]}.workerGroupSpecs" if found else "spec"
        names = ", ".join(w.group.name for w in missing if w.group)
        yield Finding.at(
            "worker-metrics-podmonitor",
            "warning",
            m,
            path,
            f"No PodMonitor in the input selects the worker pods of {m.ref} (group(s): "
            f"{names}), though monitoring is set up for namespace {m.namespace!r} ("
            + ", ".join(mon.ref for mon in watching[:3])
            + (f" and {len(watching) - 3} more" if len(watching) > 3 else "")
            + "): KubeRay creates no Service for workers, so a "
            "ServiceMonitor cannot reach them and the engines' metrics are missing.",
            "Add a PodMonitor with selector.matchLabels ray.io/node-type: worker, "
            "podMetricsEndpoints port 'metrics', in (or watching) namespace "
            f"{m.namespace!r}.",
        )


# --------------------------------------------------------------------------- dashboard

_RAY_PRIVATE_PORTS = {8265: "dashboard / Jobs API", 10001: "Ray client", 6379: "Ray GCS"}
_RAY_PRIVATE_NAMES = {
    "dashboard": 8265,
    "client": 10001,
    "http-dashboard": 8265,
    "gcs-server": 6379,
    "gcs": 6379,
}
#: Ports that are Ray's only when the backend is a Ray pod (6379 is also plain Redis, e.g. the
#: external Redis of GCS fault tolerance).
_RAY_ONLY_IN_RAY = frozenset({6379})
_EXPOSING_TYPES = ("LoadBalancer", "NodePort")


def _private_port(port: Any, name: Any = None, *, ray: bool = True) -> int | None:
    """The Ray port (8265, 10001, 6379) a port number or name is, or None; with ``ray``
    False (the backend may not be a Ray pod) 6379 is not taken for Ray's."""
    hit: int | None = None
    if isinstance(port, int) and port in _RAY_PRIVATE_PORTS:
        hit = port
    for candidate in (port, name):
        if hit is None and isinstance(candidate, str) and candidate in _RAY_PRIVATE_NAMES:
            hit = _RAY_PRIVATE_NAMES[candidate]
    return None if hit in _RAY_ONLY_IN_RAY and not ray else hit


@dataclass(frozen=True)
class _Auth:
    """Ray's token authentication as configured for one cluster."""

    #: True when requests need the token (configured, and the Ray version has it or is unknown).
    on: bool
    #: What was found, for messages (``authOptions.mode: token on Ray 2.52.0 (rayVersion)``).
    text: str


def _auth(m: Manifest | None) -> _Auth | None:
    """Token auth of a Ray object: KubeRay's ``authOptions.mode: token`` (the operator then
    sets RAY_AUTH_MODE=token in every pod) or RAY_AUTH_MODE=token in the head's env; None
    when neither is set. Ray has token authentication from 2.52."""
    if m is None:
        return None
    found = cluster_spec(m)
    opts = found[0].get("authOptions") if found else None
    src = None
    if isinstance(opts, dict) and opts.get("mode") == "token":
        src = "authOptions.mode: token"
    else:
        head = head_group(m)
        env = head.container.get("env") if head else None
        for e in env if isinstance(env, list) else []:
            named = isinstance(e, dict) and e.get("name") == "RAY_AUTH_MODE"
            if named and str(e.get("value", "")).lower() == "token":
                src = "RAY_AUTH_MODE=token in the head's env"
    if src is None:
        return None
    v = ray_version(m)
    if v is not None and not v.at_least(TOKEN_AUTH_FROM):
        return _Auth(
            False,
            f"{src} is set, but {v.describe()} predates Ray's token "
            "authentication (added in 2.52), so it does nothing",
        )
    if v is None:
        return _Auth(
            True,
            f"{src}; Ray has token authentication from 2.52 and the manifest names no Ray version",
        )
    return _Auth(True, f"{src} on {v.describe()}")


#: Annotations that make a LoadBalancer Service internal (reachable inside the VPC/VNet only):
#: AWS (in-tree and the AWS Load Balancer Controller), GKE, Azure.
_INTERNAL_LB: dict[str, tuple[str, ...]] = {
    "service.beta.kubernetes.io/aws-load-balancer-internal": ("true", "0.0.0.0/0"),
    "service.beta.kubernetes.io/aws-load-balancer-scheme": ("internal",),
    "networking.gke.io/load-balancer-type": ("internal",),
    "cloud.google.com/load-balancer-type": ("internal",),
    "service.beta.kubernetes.io/azure-load-balancer-internal": ("true",),
}


def _reach(svc_type: Any, annotations: Any) -> tuple[str, bool]:
    """(from where a Service of ``svc_type`` is reachable, whether that is only a private net)."""
    ann = annotations if isinstance(annotations, dict) else {}
    if svc_type == "LoadBalancer":
        for key, values in _INTERNAL_LB.items():
            if str(ann.get(key, "")).strip().lower() in values:
                return (
                    f"from inside the VPC/VNet (an internal load balancer: {key}: "
                    f"{ann[key]}), not from the internet",
                    True,
                )
        return "from outside the cluster (an internet-facing load balancer)", False
    if svc_type == "NodePort":
        return "from anything that reaches a node's address (NodePort)", False
    return "from outside the cluster", False


#: Ingress annotations / classes that make the load balancer behind an Ingress internal: the
#: AWS Load Balancer Controller's scheme, GKE's internal Ingress class, Azure AGIC's private IP.
_INTERNAL_INGRESS_ANNOTATIONS: dict[str, tuple[str, ...]] = {
    "alb.ingress.kubernetes.io/scheme": ("internal",),
    "kubernetes.io/ingress.class": ("gce-internal",),
    "appgw.ingress.kubernetes.io/use-private-ip": ("true",),
}
_INTERNAL_INGRESS_CLASSES = frozenset({"gce-internal"})


def _nginx_controller_reach(inv: Inventory, m: Manifest) -> tuple[str, bool] | None:
    """Reach of an Ingress served by an ingress-nginx controller whose chart values are in the
    input: the controller's own Service decides (an internal load balancer serves the VPC)."""
    cls = m.get("spec.ingressClassName") or as_dict(m.get("metadata.annotations")).get(
        "kubernetes.io/ingress.class"
    )
    for values in inv.charts("ingress-nginx"):
        name = values.get("controller.ingressClassResource.name") or "nginx"
        if cls != name:
            continue
        where, private = _reach(
            values.get("controller.service.type") or "LoadBalancer",
            values.get("controller.service.annotations"),
        )
        if private:
            return f"{where}; the {name} controller's Service ({values.file})", True
    return None


def _ingress_reach(inv: Inventory, m: Manifest) -> tuple[str, bool]:
    """(from where an Ingress is reachable, whether only a private network): an internal load
    balancer serves the VPC/VNet only, anything else is taken as internet-facing."""
    by_controller = _nginx_controller_reach(inv, m)
    if by_controller is not None:
        return by_controller
    ann = as_dict(m.get("metadata.annotations"))
    for key, values in _INTERNAL_INGRESS_ANNOTATIONS.items():
        if str(ann.get(key, "")).strip().lower() in values:
            return (
                f"from inside the VPC/VNet (an internal load balancer: {key}: {ann[key]}), "
                "not from the internet",
                True,
            )
    cls = m.get("spec.ingressClassName")
    if isinstance(cls, str) and cls in _INTERNAL_INGRESS_CLASSES:
        return (
            f"from inside the VPC (ingressClassName {cls}: an internal load balancer), not "
            "from the internet",
            True,
        )
    return "from outside the cluster", False


def _mtls(m: Manifest | None) -> str | None:
    """Ray's mutual TLS on the head (``RAY_USE_TLS`` with a CA): gRPC callers, the Ray client
    on 10001 among them, need a certificate signed by that CA. The dashboard (HTTP) is not
    covered. None when off or unknown."""
    head = head_group(m) if m is not None else None
    env = head.container.get("env") if head else None
    names = {
        str(e.get("name")): str(e.get("value", ""))
        for e in (env if isinstance(env, list) else [])
        if isinstance(e, dict)
    }
    if names.get("RAY_USE_TLS", "").lower() in ("1", "true") and "RAY_TLS_CA_CERT" in names:
        return "RAY_USE_TLS=1 with RAY_TLS_CA_CERT in the head's env"
    return None


def _cluster_of_head_service(inv: Inventory, namespace: str, service: Any) -> Manifest | None:
    """The Ray object whose KubeRay head Service (``<name>-head-svc``) is ``service``."""
    if not isinstance(service, str):
        return None
    name = service.split(".")[0]  # a VirtualService host may be the Service's FQDN
    for m in inv.of_kind(*RAY_KINDS):
        if m.namespace == namespace and m.name and name == f"{m.name}-head-svc":
            return m
    return None


def _ray_advisories(port: int, cluster: Manifest | None) -> str:
    """The advisories behind an exposed Ray port, with the fixed release (none for ShadowRay)
    and, for the dashboard, whether the cluster's Ray predates the DNS-rebinding fix."""
    parts = [RAY_SHADOWRAY.cite()]
    v = ray_version(cluster) if cluster is not None else None
    if port == 8265 and RAY_DNS_REBINDING.affects(v) is not False:
        parts.append(
            RAY_DNS_REBINDING.cite() + (f" - {v.describe()} is affected" if v is not None else "")
        )
    return "; ".join(parts)


def _exposure(
    port: int,
    reach: tuple[str, bool],
    auth: _Auth | None,
    mtls: str | None = None,
    cluster: Manifest | None = None,
) -> tuple[Severity, str]:
    """Severity and text for one exposed Ray port: reachable from where, who can use it, and
    the advisories (with their fixed releases) that say so."""
    where, private = reach
    head = f"port {port} ({_RAY_PRIVATE_PORTS[port]}) is reachable {where}"
    cited = f" [{_ray_advisories(port, cluster)}]"
    if port == 10001 and mtls is not None:
        return "warning", (
            f"{head}; Ray's mutual TLS is on ({mtls}), so clients need a certificate signed "
            "by the cluster's CA, but whoever holds one can submit jobs and run code on the "
            "cluster" + cited
        )
    if auth is not None and auth.on:
        return "warning", (
            f"{head}; token authentication is on ({auth.text}), so callers need the cluster's "
            "token, but whoever holds it can submit jobs and run code on the cluster" + cited
        )
    why = auth.text if auth is not None else "Ray has no authentication unless RAY_AUTH_MODE=token"
    return ("warning" if private else "error"), (
        f"{head}: anyone who reaches it"
        + (" (any workload or person on that network)" if private else "")
        + f" can submit jobs and run arbitrary code on the cluster ({why})"
        + cited
    )


_FIX = (
    "Keep the head Service ClusterIP and expose only the Serve port (8000); reach the "
    "dashboard with kubectl port-forward, or behind an authenticating proxy; enable Ray's "
    "token authentication (KubeRay authOptions.mode: token, Ray 2.52+)."
)


def _exposed_service_ports(m: Manifest) -> Iterator[tuple[str, int]]:
    svc_type = m.get("spec.type")
    if svc_type not in _EXPOSING_TYPES:
        return
    sel = m.get("spec.selector")
    ray = isinstance(sel, dict) and any(str(k).startswith("ray.io/") for k in sel)
    ports = m.get("spec.ports")
    for i, p in enumerate(ports if isinstance(ports, list) else []):
        if not isinstance(p, dict):
            continue
        hit = _private_port(p.get("port"), p.get("name"), ray=ray) or _private_port(
            p.get("targetPort"), ray=ray
        )
        if hit:
            yield f"spec.ports[{i}]", hit


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def _cluster_of_service(inv: Inventory, svc: Manifest) -> Manifest | None:
    """The Ray object a Service selects (``ray.io/cluster`` in its selector), when in the input."""
    sel = svc.get("spec.selector")
    want = sel.get("ray.io/cluster") if isinstance(sel, dict) else None
    if not isinstance(want, str):
        return None
    for m in inv.of_kind(*RAY_KINDS):
        if m.namespace == svc.namespace and m.name and want.startswith(m.name):
            return m
    return None


@rule("dashboard-exposed", versions={"ray": "all", "kuberay": "all"})
def dashboard_exposed(inv: Inventory) -> Iterator[Finding]:
    """The Ray dashboard/Jobs API (8265) and client port (10001) must not leave the cluster."""
    for m in inv.of_kind("Service"):
        reach = _reach(m.get("spec.type"), m.get("metadata.annotations"))
        cluster = _cluster_of_service(inv, m)
        auth = _auth(cluster)
        for path, port in _exposed_service_ports(m):
            severity, text = _exposure(port, reach, auth, _mtls(cluster), cluster)
            yield Finding.at(
                "dashboard-exposed",
                severity,
                m,
                path,
                f"Service of type {m.get('spec.type')}: {text}.",
                _FIX,
            )
    for m in inv.of_kind(*RAY_KINDS):
        found = cluster_spec(m)
        if found is None:
            continue
        spec, base = found
        head = spec.get("headGroupSpec")
        if not isinstance(head, dict):
            continue
        auth = _auth(m)
        hpath = f"{base}.headGroupSpec"
        stype = head.get("serviceType")
        hs_type = m.get(f"{hpath}.headService.spec.type")
        head_ann = (
            dict(spec.get("headServiceAnnotations") or {})
            if isinstance(spec.get("headServiceAnnotations"), dict)
            else {}
        )
        hs_ann = m.get(f"{hpath}.headService.metadata.annotations")
        if isinstance(hs_ann, dict):
            head_ann.update(hs_ann)
        for where, value in (
            (f"{hpath}.serviceType", stype),
            (f"{hpath}.headService.spec.type", hs_type),
        ):
            if value in _EXPOSING_TYPES:
                severity, text = _exposure(8265, _reach(value, head_ann), auth, cluster=m)
                yield Finding.at(
                    "dashboard-exposed",
                    severity,
                    m,
                    where,
                    f"The head Service KubeRay creates is of type {value}, and it carries "
                    f"every head port: {text}; the client port 10001 and the GCS port 6379 "
                    "are exposed too.",
                    _FIX + " Use serveService (RayService) or a separate Service for 8000.",
                )
        serve_svc = m.get("spec.serveService") if m.kind == "RayService" else None
        if isinstance(serve_svc, dict) and serve_svc.get("spec", {}).get("type") in _EXPOSING_TYPES:
            reach = _reach(
                serve_svc["spec"]["type"], as_dict(serve_svc.get("metadata")).get("annotations")
            )
            ports = serve_svc["spec"].get("ports")
            for i, p in enumerate(ports if isinstance(ports, list) else []):
                if not isinstance(p, dict):
                    continue
                svc_port = _private_port(p.get("port"), p.get("name")) or _private_port(
                    p.get("targetPort")
                )
                if svc_port:
                    severity, text = _exposure(svc_port, reach, auth, cluster=m)
                    yield Finding.at(
                        "dashboard-exposed",
                        severity,
                        m,
                        f"spec.serveService.spec.ports[{i}]",
                        f"The serveService is of type {serve_svc['spec']['type']} and lists "
                        f"{text}.",
                        "List only the Serve port (8000) in serveService.",
                    )
        head_pod = (
            head.get("template", {}).get("spec") if isinstance(head.get("template"), dict) else None
        )
        node_reach = ("from anything that reaches the node's address", False)
        if isinstance(head_pod, dict) and head_pod.get("hostNetwork") is True:
            severity, text = _exposure(8265, node_reach, auth, cluster=m)
            yield Finding.at(
                "dashboard-exposed",
                severity,
                m,
                f"{hpath}.template.spec.hostNetwork",
                "The head pod runs with hostNetwork: true, so the dashboard (8265), the Ray "
                f"client (10001) and the GCS (6379) listen on the node's own address: {text}.",
                "Remove hostNetwork from the head pod.",
            )
        if head.get("enableIngress") is True:
            severity, text = _exposure(
                8265, ("through the cluster's Ingress controller", False), auth, cluster=m
            )
            yield Finding.at(
                "dashboard-exposed",
                severity,
                m,
                f"{hpath}.enableIngress",
                f"enableIngress: true makes KubeRay create an Ingress for the dashboard: {text}.",
                _FIX,
            )
        for pod in pods(inv):
            if pod.manifest is not m:
                continue
            for c, cpath in pod.containers():
                ports = c.get("ports")
                for i, p in enumerate(ports if isinstance(ports, list) else []):
                    if (
                        isinstance(p, dict)
                        and p.get("hostPort")
                        and _private_port(p.get("containerPort"))
                    ):
                        port = int(p["containerPort"])
                        severity, text = _exposure(port, node_reach, auth, _mtls(m), m)
                        yield Finding.at(
                            "dashboard-exposed",
                            severity,
                            m,
                            f"{cpath}.ports[{i}].hostPort",
                            f"hostPort {p['hostPort']} maps the node's port to the {pod.label}'s "
                            f"{port}: {text}.",
                            "Remove the hostPort.",
                        )
    for m in inv.of_kind("Ingress", "VirtualService", "HTTPRoute", "TCPRoute", "GRPCRoute"):
        for path, node in _walk(m.body.get("spec"), "spec"):
            if not isinstance(node, dict):
                continue
            hit: int | None = None
            backend: Any = None
            if m.kind == "Ingress" and isinstance(node.get("service"), dict):
                sp = node["service"].get("port")
                backend = node["service"].get("name")
                if isinstance(sp, dict):
                    hit = _private_port(sp.get("number"), sp.get("name"))
            elif m.kind == "VirtualService" and isinstance(node.get("destination"), dict):
                dp = node["destination"].get("port")
                backend = node["destination"].get("host")
                if isinstance(dp, dict):
                    hit = _private_port(dp.get("number"))
            elif m.kind.endswith("Route") and path.split(".")[-1].startswith("backendRefs"):
                hit = _private_port(node.get("port"))
                backend = node.get("name")
            cluster = _cluster_of_head_service(inv, m.namespace, backend)
            if hit in _RAY_ONLY_IN_RAY and cluster is None:
                hit = None  # 6379 behind an unknown backend may be any Redis
            if hit:
                reach = (
                    _ingress_reach(inv, m)
                    if m.kind == "Ingress"
                    else ("from outside the cluster", False)
                )
                severity, text = _exposure(hit, reach, _auth(cluster), _mtls(cluster), cluster)
                yield Finding.at(
                    "dashboard-exposed",
                    severity,
                    m,
                    path,
                    f"This {m.kind} routes outside traffic to the Ray head: {text}.",
                    _FIX,
                )


# --------------------------------------------------------------------------- secrets

_TOKEN_SHAPES = (
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "a Hugging Face token"),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"), "an OpenAI/Anthropic-style API key"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"), "a GitHub token"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}\b"), "a GitHub token"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b"), "a GitLab token"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key id"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), "a Slack token"),
)
_SECRET_NAME = re.compile(
    r"(^|_)(TOKEN|API_?KEY|SECRET|SECRET_KEY|PASSWORD|PASSWD|ACCESS_KEY|PRIVATE_KEY|"
    r"CREDENTIALS?|AUTH)$",
    re.IGNORECASE,
)
_PLACEHOLDER = re.compile(
    r"^(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|<[^>]*>|\{\{.*\}\}|\(\(.*\)\)|"
    r"changeme|change-me|replace-?me|xxx+|dummy|example|none|null|true|false|\d+|)$",
    re.IGNORECASE,
)


def _token_shape(value: str) -> str | None:
    for pattern, what in _TOKEN_SHAPES:
        if pattern.search(value):
            return what
    return None


def _secret_literal(name: str, value: Any) -> str | None:
    """Why (name, value) is a literal secret, or None."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    text = str(value).strip()
    shape = _token_shape(text)
    if shape:
        return shape
    if _SECRET_NAME.search(name) and _looks_secret(text):
        return f"a literal value for {name}"
    return None


def _looks_secret(text: str) -> bool:
    """A value that can be a credential: not a placeholder, a path, a URL, or a model's
    special token (``PAD_TOKEN: "[PAD]"``, ``EOS_TOKEN: "<|eot_id|>"``)."""
    if _PLACEHOLDER.match(text) or len(text) < 8 or any(ch.isspace() for ch in text):
        return False
    if text[0] in "[<{(" and text[-1] in "]>})":
        return False
    return not (text.startswith(("/", "./", "~")) or "://" in text)


_SECRET_FIX = (
    "Put the value in a Secret (created out of band, or by ExternalSecrets/SealedSecrets) and "
    "reference it: env valueFrom.secretKeyRef, or envFrom.secretRef; rotate the leaked value."
)


def _env_vars_in(node: Any, base: str) -> Iterator[tuple[str, str, Any]]:
    """(path, name, value) of every ``env_vars`` entry and secret-named key in a runtime env."""
    for path, sub in _walk(node, base):
        if not isinstance(sub, dict):
            continue
        for k, v in sub.items():
            if isinstance(v, dict | list):
                continue
            yield f"{path}.{k}", str(k), v


@rule("plaintext-secret", versions="all")
def plaintext_secret(inv: Inventory) -> Iterator[Finding]:
    """Tokens and API keys written as literals instead of Secret references."""
    for pod in pods(inv):
        for c, cpath in pod.containers():
            env = c.get("env")
            for i, e in enumerate(env if isinstance(env, list) else []):
                if not isinstance(e, dict) or "value" not in e:
                    continue
                why = _secret_literal(str(e.get("name", "")), e.get("value"))
                if why:
                    yield Finding.at(
                        "plaintext-secret",
                        "error",
                        pod.manifest,
                        f"{cpath}.env[{i}].value",
                        f"Env var {e.get('name')!r} of container {c.get('name', '?')!r} in the "
                        f"{pod.label} holds {why} in clear text: anyone who can read the "
                        "manifest (git, kubectl get -o yaml, the Ray dashboard) has it.",
                        _SECRET_FIX,
                    )
    for pod in pods(inv):
        for c, cpath in pod.containers():
            for key in ("command", "args"):
                items = c.get(key)
                if not isinstance(items, list):
                    continue
                for i in range(len(items)):
                    why = _cli_secret(items, i)
                    if why:
                        yield Finding.at(
                            "plaintext-secret",
                            "error",
                            pod.manifest,
                            f"{cpath}.{key}[{i}]",
                            f"Container {c.get('name', '?')!r} in the {pod.label} of "
                            f"{pod.manifest.ref} has {why} in its {key} in clear text (it also "
                            "shows in `ps` and in the pod spec).",
                            _SECRET_FIX + " For vLLM, set VLLM_API_KEY from a Secret instead of "
                            "--api-key.",
                        )
    for m in inv.of_kind("RayService"):
        found = serve_config(m)
        if found is None:
            continue
        cfg, root = found
        for path, name, value in _env_vars_in(cfg, f"{root}:"):
            why = _secret_literal(name, value)
            if why:
                yield Finding.at(
                    "plaintext-secret",
                    "error",
                    m,
                    path.replace(":.", ":"),
                    f"serveConfigV2 sets {name!r} to {why} in clear text; the Serve config "
                    "is also shown by the Ray dashboard and the Serve REST API.",
                    _SECRET_FIX + " In runtime_env, read it from the pod env instead.",
                )
    for m in inv.of_kind("RayJob"):
        raw = m.get("spec.runtimeEnvYAML")
        parsed: Any = None
        if isinstance(raw, str):
            try:
                parsed = yaml.safe_load(raw)
            except yaml.YAMLError:
                parsed = None
        for path, name, value in _env_vars_in(parsed, "spec.runtimeEnvYAML:"):
            why = _secret_literal(name, value)
            if why:
                yield Finding.at(
                    "plaintext-secret",
                    "error",
                    m,
                    path.replace(":.", ":"),
                    f"The RayJob's runtime env sets {name!r} to {why} in clear text.",
                    _SECRET_FIX,
                )
        entry = m.get("spec.entrypoint")
        if isinstance(entry, str) and (why := _token_shape(entry)):
            yield Finding.at(
                "plaintext-secret",
                "error",
                m,
                "spec.entrypoint",
                f"The RayJob's entrypoint contains {why} in clear text.",
                _SECRET_FIX,
            )
    for m in inv.of_kind("Secret", "ConfigMap"):
        for section in ("data", "stringData"):
            table = m.get(section)
            for key, value in table.items() if isinstance(table, dict) else []:
                text = str(value)
                if m.kind == "Secret" and section == "data":
                    text = _b64(text)
                why = _token_shape(text)
                if why:
                    yield Finding.at(
                        "plaintext-secret",
                        "error",
                        m,
                        f"{section}.{key}",
                        f"This {m.kind} manifest carries {why} in {section}.{key}"
                        + (" (base64 is an encoding, not encryption)" if section == "data" else "")
                        + ": the file itself is the leak.",
                        "Do not keep the value in the manifest: create the Secret out of band "
                        "(kubectl create secret) or through ExternalSecrets/SealedSecrets, and "
                        "rotate the token.",
                    )


_SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--password")


def _cli_secret(items: list[Any], i: int) -> str | None:
    """Why command/args item ``i`` is a literal secret: a token shape, or the value of a
    secret flag (``--api-key VALUE`` / ``--api-key=VALUE``) that is not a placeholder."""
    text = str(items[i])
    shape = _token_shape(text)
    if shape:
        return shape
    for flag in _SECRET_FLAGS:
        if text.startswith(flag + "="):
            value = text.split("=", 1)[1]
        elif i > 0 and str(items[i - 1]) == flag:
            value = text
        else:
            continue
        if not _PLACEHOLDER.match(value.strip()) and not value.startswith("$("):
            return f"the value of {flag}"
    return None


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return text


# --------------------------------------------------------------------------- network policy


def _restricts_ingress(policy: Manifest, pod: PodView) -> bool:
    spec = policy.body.get("spec")
    if not isinstance(spec, dict):
        return False
    if not selector_matches(spec.get("podSelector", {}), _ray_pod_labels(pod)):
        return False
    types = spec.get("policyTypes")
    if isinstance(types, list) and "Ingress" not in types:
        return False
    rules = spec.get("ingress")
    if not isinstance(rules, list):
        return True  # Ingress type with no rules: deny all
    # A rule without 'from' admits every source: the policy restricts nothing.
    return all(isinstance(r, dict) and r.get("from") for r in rules)


def _serving_workloads(inv: Inventory) -> list[tuple[Manifest, list[PodView]]]:
    """Workloads that serve requests: RayServices and workloads running a vLLM server, with
    their pod templates. RayClusters and RayJobs are out of scope: nothing in them says they
    serve (KubeRay's samples list Serve's port on training clusters too), and a warning on
    every batch cluster is the noise that hid the real findings."""
    all_pods = pods(inv)
    out: list[tuple[Manifest, list[PodView]]] = []
    for m in inv.manifests:
        mine = [p for p in all_pods if p.manifest is m]
        if not mine or m.kind in ("RayCluster", "RayJob"):
            continue
        if m.kind == "RayService" or any(
            container_engine(c, path)[0] for p in mine for c, path in p.containers()
        ):
            out.append((m, mine))
    return out


#: KubeRay adds ``spec.networkPolicy`` (and creates the policies) from 1.7.0.
KUBERAY_NETWORK_POLICY_FROM = Version("1.7")
#: KubeRay 1.7 ``spec.networkPolicy.mode`` values that deny ingress (the default is DenyAll).
_DENYING_INGRESS = ("DenyAll", "DenyAllIngress")


def _kuberay_policy(m: Manifest, inv: Inventory) -> tuple[bool, str]:
    """(KubeRay creates ingress-restricting policies for ``m``, why not when it does not)."""
    found = cluster_spec(m) if m.kind in RAY_KINDS else None
    cfg = found[0].get("networkPolicy") if found else None
    if not isinstance(cfg, dict):
        return False, ""
    mode = cfg.get("mode", "DenyAll")
    if mode not in _DENYING_INGRESS:
        return False, f" (spec.networkPolicy mode {mode} restricts egress only)"
    operators = sorted(named_versions(inv, KUBERAY), key=lambda v: normalise(v) or Version("0"))
    known = [normalise(v) for v in operators]
    if known and all(v is not None and v < KUBERAY_NETWORK_POLICY_FROM for v in known):
        return False, (
            f" (spec.networkPolicy is set, but the KubeRay operator in the input is "
            f"{', '.join(operators)}, older than 1.7 where the field appeared: its CRD prunes "
            "the field and no policy is created)"
        )
    gate = _network_policy_gate(inv)
    if gate is False:
        return False, (
            " (spec.networkPolicy is set, but the kuberay-operator values in the input leave "
            "the RayClusterNetworkPolicy feature gate off: KubeRay 1.7 then refuses the cluster)"
        )
    return True, ""


def _network_policy_gate(inv: Inventory) -> bool | None:
    """The RayClusterNetworkPolicy feature gate from kuberay-operator values (None: unknown)."""
    for values in inv.charts("kuberay-operator"):
        gates = values.get("featureGates")
        if not isinstance(gates, list):
            return False
        for g in gates:
            if isinstance(g, dict) and g.get("name") == "RayClusterNetworkPolicy":
                return g.get("enabled") is True
        return False
    return None


def _listed(items: list[str], most: int = 5) -> str:
    """``a; b; c`` with at most ``most`` items, then ``and N more``."""
    shown = "; ".join(items[:most])
    return shown + (f"; and {len(items) - most} more" if len(items) > most else "")


@rule("no-network-policy", versions={"kuberay": "all"})
def no_network_policy(inv: Inventory) -> Iterator[Finding]:
    """Serving pods need a NetworkPolicy that restricts who can reach them: said once per
    namespace, on the first open workload, naming all of them."""
    policies = inv.of_kind("NetworkPolicy")
    open_by_ns: dict[str, list[tuple[Manifest, list[PodView], str]]] = {}
    for m, serving_pods in _serving_workloads(inv):
        covered, why = _kuberay_policy(m, inv)
        if covered:
            continue
        local = [p for p in policies if p.namespace == m.namespace]
        open_pods = [p for p in serving_pods if not any(_restricts_ingress(np, p) for np in local)]
        if open_pods:
            which = ", ".join(p.label for p in open_pods)
            open_by_ns.setdefault(m.namespace, []).append((m, open_pods, f"{m.ref} ({which}){why}"))
    for namespace, items in open_by_ns.items():
        first = items[0][0]
        local = [p for p in policies if p.namespace == namespace]
        ray = any(m.kind in RAY_KINDS for m, _, _ in items)
        plain = any(m.kind not in RAY_KINDS for m, _, _ in items)
        exposure = []
        if ray:
            exposure.append(
                "the dashboard (8265), GCS (6379) and client (10001) ports of the Ray pods as "
                "well as Serve"
            )
        if plain:
            exposure.append(
                "the model servers directly, bypassing your gateway's authentication and rate "
                "limits"
            )
        yield Finding.at(
            "no-network-policy",
            "warning",
            first,
            "metadata",
            f"No NetworkPolicy in the input restricts ingress to the serving pods in namespace "
            f"{namespace!r}"
            + (f" ({len(local)} there, none restricting their ingress)" if local else "")
            + f": {_listed([text for _, _, text in items])}. Any pod in the cluster can reach "
            + " and ".join(exposure)
            + ".",
            "Add a NetworkPolicy for the namespace: deny ingress by default and allow only the "
            "Serve port (8000) from your gateway, plus Ray's own pod-to-pod traffic "
            "(podSelector ray.io/is-ray-node: 'yes'); or, with KubeRay 1.7 and its "
            "RayClusterNetworkPolicy feature gate, set the cluster's spec.networkPolicy "
            "(mode DenyAllIngress) and let the operator create them.",
        )


# --------------------------------------------------------------------------- multi-node vLLM


def _advisory_text(
    ch: Channel, v: KnownVersion | None, env: dict[str, str] | None = None
) -> tuple[str, bool]:
    """(what the advisories say about channel ``ch`` on release ``v``, whether ``v`` is
    affected by one). With no advisory: vLLM's security guide, no fix by design."""
    if not ch.advisories:
        return (
            "vLLM's security guide: inter-node traffic is unauthenticated and unencrypted, "
            "by design (no release adds authentication)",
            False,
        )
    parts: list[str] = []
    affected = False
    for adv in ch.advisories:
        known = v if adv.component == "vLLM" else None
        hit = adv.affects(known, env)
        if hit is True:
            affected = True
            assert known is not None
            parts.append(f"{known.describe()} is affected by {adv.cite()}")
        elif hit is None:
            parts.append(adv.cite())
        elif adv.fixed_in is not None and known is not None and known.at_least(adv.fixed_in):
            parts.append(f"{adv.ids} is fixed in {known.describe()}")
        else:
            assert known is not None
            parts.append(
                f"{adv.ids} affects only the V0 engine, which {known.describe()} runs only "
                "with VLLM_USE_V1=0"
            )
    return "; ".join(parts), affected


def _channel_summary(
    channels: list[Channel], v: KnownVersion | None, env: dict[str, str]
) -> tuple[str, bool]:
    texts: list[str] = []
    affected = False
    for ch in channels:
        text, hit = _advisory_text(ch, v, env)
        affected = affected or hit
        texts.append(f"port {ch.port}, {ch.what} [{text}]")
    return "; ".join(texts), affected


@rule("vllm-multinode-exposed", versions={"vllm": "all", "ray": "all"})
def vllm_multinode_exposed(inv: Inventory) -> Iterator[Finding]:
    """vLLM pods that listen for peers - a multi-node group (LeaderWorkerSet leader over Ray,
    --nnodes), data parallelism across pods, KV-cache transfer between prefill and decode
    pods - that no NetworkPolicy shields: none of those channels authenticates its callers."""
    policies = inv.of_kind("NetworkPolicy")
    for pod in pods(inv):
        found = vllm_channels(pod)
        if not found:
            continue
        local = [p for p in policies if p.namespace == pod.manifest.namespace]
        if any(_restricts_ingress(np, pod) for np in local):
            continue
        c, path, channels = found[0]
        v = vllm_version([str(c.get("image", ""))])
        summary, affected = _channel_summary(channels, v, _literal_env(c))
        span = f"spans {pod.hosts} pods over Ray and " if pod.hosts > 1 else ""
        yield Finding.at(
            "vllm-multinode-exposed",
            "error" if affected else "warning",
            pod.manifest,
            channels[0].path if channels[0].path != path else path,
            f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref} ({pod.label}) "
            f"{span}listens for its peers, and no NetworkPolicy in namespace "
            f"{pod.manifest.namespace!r} restricts ingress to it: any pod of any namespace "
            f"reaches {summary}.",
            "Add a NetworkPolicy that admits only the group's own pods (e.g. "
            "leaderworkerset.sigs.k8s.io/name, or the prefill/decode pods' labels) to every "
            "port but the API port, and the gateway to that one; run a vLLM release the "
            "advisories name as fixed.",
        )


def _literal_env(c: dict[str, Any]) -> dict[str, str]:
    env = c.get("env")
    return {
        str(e["name"]): str(e["value"])
        for e in (env if isinstance(env, list) else [])
        if isinstance(e, dict) and "name" in e and "value" in e
    }


def _service_targets(svc: Manifest, pod: PodView, c: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """(field path of the Service port, the container port it reaches) for each port of
    ``svc`` (a named targetPort resolved through the container's ports)."""
    declared = c.get("ports")
    named = {
        str(p.get("name")): p.get("containerPort")
        for p in (declared if isinstance(declared, list) else [])
        if isinstance(p, dict) and p.get("name")
    }
    ports = svc.get("spec.ports")
    for i, p in enumerate(ports if isinstance(ports, list) else []):
        if not isinstance(p, dict):
            continue
        target = p.get("targetPort", p.get("port"))
        if isinstance(target, str):
            target = named.get(target)
        if isinstance(target, int):
            yield f"spec.ports[{i}]", target


def _selected_pods(inv: Inventory, svc: Manifest) -> list[PodView]:
    sel = svc.get("spec.selector")
    if not isinstance(sel, dict) or not sel:
        return []
    return [
        p
        for p in pods(inv)
        if p.manifest.namespace == svc.namespace
        and all(p.labels.get(str(k)) == str(v) for k, v in sel.items())
    ]


def _route_backends(inv: Inventory) -> Iterator[tuple[Manifest, str, str, int | None]]:
    """(route object, field path, backend Service name, Service port) of every Ingress,
    Gateway API route and Istio VirtualService backend."""
    for m in inv.of_kind("Ingress", "VirtualService", "HTTPRoute", "TCPRoute", "GRPCRoute"):
        for path, node in _walk(m.body.get("spec"), "spec"):
            if not isinstance(node, dict):
                continue
            name: Any = None
            port: Any = None
            if m.kind == "Ingress" and isinstance(node.get("service"), dict):
                name = node["service"].get("name")
                sp = node["service"].get("port")
                port = sp.get("number") if isinstance(sp, dict) else None
            elif m.kind == "VirtualService" and isinstance(node.get("destination"), dict):
                name = str(node["destination"].get("host", "")).split(".")[0]
                dp = node["destination"].get("port")
                port = dp.get("number") if isinstance(dp, dict) else None
            elif m.kind.endswith("Route") and path.split(".")[-1].startswith("backendRefs"):
                if node.get("kind", "Service") != "Service":
                    continue
                name, port = node.get("name"), node.get("port")
            if isinstance(name, str) and name:
                yield m, path, name, port if isinstance(port, int) else None


@rule("vllm-internal-port-exposed", versions={"vllm": "all", "ray": "all"})
def vllm_internal_port_exposed(inv: Inventory) -> Iterator[Finding]:
    """A LoadBalancer/NodePort Service, Ingress or route that puts one of vLLM's internal
    listeners (KV transfer, data-parallel RPC, multi-node master, the group's Ray GCS) on
    the network: none authenticates, and several unpickled what they received."""
    services = {(s.namespace, s.name): s for s in inv.of_kind("Service")}
    fronts: list[tuple[Manifest, str, Manifest, int | None, tuple[str, bool]]] = []
    for svc in services.values():
        if svc.get("spec.type") in _EXPOSING_TYPES:
            reach = _reach(svc.get("spec.type"), svc.get("metadata.annotations"))
            fronts.append((svc, "spec.type", svc, None, reach))
    for route, path, name, port in _route_backends(inv):
        backend = services.get((route.namespace, name))
        if backend is not None:
            reach = (
                _ingress_reach(inv, route)
                if route.kind == "Ingress"
                else ("from outside the cluster through the Gateway", False)
            )
            fronts.append((route, path, backend, port, reach))
    for front, fpath, svc, only_port, (where, private) in fronts:
        for pod in _selected_pods(inv, svc):
            for c, _cpath, channels in vllm_channels(pod):
                by_port = {ch.port: ch for ch in channels}
                for ppath, target in _service_targets(svc, pod, c):
                    ch = by_port.get(target)
                    if ch is None:
                        continue
                    if only_port is not None and svc.get(f"{ppath}.port") != only_port:
                        continue
                    v = vllm_version([str(c.get("image", ""))])
                    text, _ = _advisory_text(ch, v, _literal_env(c))
                    via = (
                        f"Service {svc.name!r} of type {svc.get('spec.type')}"
                        if front is svc
                        else f"{front.ref} -> Service {svc.name!r}"
                    )
                    yield Finding.at(
                        "vllm-internal-port-exposed",
                        "warning" if private else "error",
                        front,
                        ppath if front is svc else fpath,
                        f"{via} makes port {target} of vLLM container "
                        f"{c.get('name', '?')!r} of {pod.manifest.ref} ({pod.label}), "
                        f"{ch.what}, reachable {where}: the channel asks for no credentials, "
                        f"so anyone who reaches it talks to the engine's internals [{text}].",
                        "Expose only vLLM's API port (keep the peer ports on a ClusterIP or "
                        "headless Service the group uses), admit only the group's pods to "
                        "them with a NetworkPolicy, and run a release the advisories name "
                        "as fixed.",
                    )


# --------------------------------------------------------------------------- vLLM without auth

#: Ingress annotations that put authentication in front of the backends: ingress-nginx's
#: external auth (oauth2-proxy's usual wiring) and basic auth, the AWS Load Balancer
#: Controller's OIDC/Cognito actions.
_INGRESS_AUTH = (
    "nginx.ingress.kubernetes.io/auth-url",
    "nginx.ingress.kubernetes.io/auth-type",
    "alb.ingress.kubernetes.io/auth-type",
)
#: Envoy Gateway SecurityPolicy fields that make a client authenticate (gateway.envoyproxy.io).
_SECURITY_POLICY_AUTH = ("extAuth", "jwt", "oidc", "apiKeyAuth", "basicAuth")
#: Istio's root namespace: an AuthorizationPolicy there without a selector covers the mesh.
_ISTIO_ROOT = "istio-system"


def _vllm_api_key(c: dict[str, Any]) -> bool:
    """Whether vLLM's own API key is set in the container: ``--api-key`` or ``VLLM_API_KEY``
    (a literal or a Secret reference: either way requests need it)."""
    words = [str(w) for key in ("command", "args") for w in (c.get(key) or [])]
    if any("--api-key" in w for w in words):
        return True
    env = c.get("env")
    return any(
        isinstance(e, dict) and e.get("name") == "VLLM_API_KEY"
        for e in (env if isinstance(env, list) else [])
    )


def _container_ports(c: dict[str, Any]) -> dict[int | str, int]:
    """containerPort by number and by name."""
    out: dict[int | str, int] = {}
    declared = c.get("ports")
    for p in declared if isinstance(declared, list) else []:
        if isinstance(p, dict) and isinstance(p.get("containerPort"), int):
            out[p["containerPort"]] = p["containerPort"]
            if p.get("name"):
                out[str(p["name"])] = p["containerPort"]
    return out


def _fronted_by_sidecar(pod: PodView, target: Any) -> str | None:
    """The container (not vLLM) that owns the port a Service sends to - an oauth2-proxy,
    Envoy or API-key sidecar in front of vLLM - or None when vLLM takes it (or it is
    unknown)."""
    if target is None:
        return None
    for c, path in pod.containers():
        if container_engine(c, path)[0] or not isinstance(c.get("ports"), list):
            continue
        if target in _container_ports(c):
            return str(c.get("name", "?"))
    return None


def _vllm_pods(
    inv: Inventory, namespace: str, selector: Any, target: Any = None
) -> list[tuple[PodView, bool]]:
    """(pod, its vLLM asks for an API key) of the vLLM servers a selector picks and the
    Service port ``target`` reaches (a sidecar that owns the port fronts vLLM instead)."""
    if not isinstance(selector, dict) or not selector:
        return []
    out = []
    for pod in pods(inv):
        if pod.manifest.namespace != namespace or pod.group is not None:
            continue
        if not all(pod.labels.get(str(k)) == str(v) for k, v in selector.items()):
            continue
        servers = [c for c, path in pod.containers() if container_engine(c, path)[0]]
        if servers and _fronted_by_sidecar(pod, target) is None:
            out.append((pod, all(_vllm_api_key(c) for c in servers)))
    return out


def _selects(selector: Any, pod: PodView, key: str = "matchLabels") -> bool:
    """An Istio/Envoy workload selector (``{matchLabels: ...}`` or ``{labels: ...}``) that
    picks ``pod``; no selector picks every pod of the namespace."""
    if not isinstance(selector, dict):
        return True
    labels = selector.get(key, selector.get("labels"))
    if not isinstance(labels, dict):
        return True
    return all(pod.labels.get(str(k)) == str(v) for k, v in labels.items())


def _istio_requires_auth(policy: Manifest) -> bool:
    """An AuthorizationPolicy that makes callers authenticate: CUSTOM (ext_authz), an ALLOW
    whose every rule names request principals / principals / JWT claims, or a DENY of
    requests without a principal."""
    spec = as_dict(policy.get("spec"))
    action = spec.get("action", "ALLOW")
    if action == "CUSTOM":
        return True
    rules = spec.get("rules")
    if not isinstance(rules, list) or not rules:
        return False  # ALLOW with no rules denies all; no rules on DENY allows all

    def authed(r: Any) -> bool:
        text = str(r)
        return any(k in text for k in ("requestPrincipals", "principals", "request.auth."))

    if action == "DENY":
        return any("notRequestPrincipals" in str(r) or "notPrincipals" in str(r) for r in rules)
    return all(isinstance(r, dict) and authed(r) for r in rules)


def _mesh_auth(inv: Inventory, pod: PodView) -> str | None:
    """The Istio or Envoy policy that authenticates requests to ``pod``, or None."""
    ns = pod.manifest.namespace
    for m in inv.of_kind("AuthorizationPolicy"):
        if not m.api_version.startswith("security.istio.io/"):
            continue
        spec = as_dict(m.get("spec"))
        in_scope = (m.namespace == ns and _selects(spec.get("selector"), pod)) or (
            m.namespace == _ISTIO_ROOT and "selector" not in spec
        )
        if in_scope and _istio_requires_auth(m):
            return m.ref
    for m in inv.of_kind("EnvoyFilter"):
        spec = as_dict(m.get("spec"))
        if (
            m.namespace in (ns, _ISTIO_ROOT)
            and "envoy.filters.http.ext_authz" in str(spec.get("configPatches"))
            and (
                m.namespace == _ISTIO_ROOT or _selects(spec.get("workloadSelector"), pod, "labels")
            )
        ):
            return m.ref
    return None


def _gateway_auth(inv: Inventory, route: Manifest) -> str | None:
    """An Envoy Gateway SecurityPolicy (authentication) attached to ``route`` or to a Gateway
    it attaches to, or an Istio/Envoy ext_authz at the gateway."""
    parents = {
        str(p.get("name")) for p in (route.get("spec.parentRefs") or []) if isinstance(p, dict)
    }
    for m in inv.of_kind("SecurityPolicy"):
        spec = as_dict(m.get("spec"))
        if not any(k in spec for k in _SECURITY_POLICY_AUTH):
            continue
        refs = spec.get("targetRefs") or ([spec["targetRef"]] if "targetRef" in spec else [])
        for ref in refs if isinstance(refs, list) else []:
            if not isinstance(ref, dict):
                continue
            if (ref.get("kind") == route.kind and ref.get("name") == route.name) or (
                ref.get("kind") == "Gateway" and ref.get("name") in parents
            ):
                return m.ref
    return None


def _gateway_reach(inv: Inventory, route: Manifest) -> tuple[str, bool] | None:
    """Reach of a Gateway API route from its parent Gateway's class: an internal class
    serves the VPC (a warning), an external one the internet (an error); None when the
    Gateway or its class says nothing (the finding is then a warning)."""
    parents = {
        str(p.get("name")) for p in (route.get("spec.parentRefs") or []) if isinstance(p, dict)
    }
    candidates = [
        gw
        for gw in inv.of_kind("Gateway")
        if gw.name in parents and gw.namespace == route.namespace
    ]

    # Alternatives of one name (production-stack ships gke/, istio/ and kgateway/ variants of
    # its inference-gateway): the one nearest the route's own file is the route's.
    # Equally near alternatives leave the Gateway unknown.
    def nearness(gw: Manifest) -> int:
        return len(os.path.commonpath([gw.file, route.file]) or "")

    best = max((nearness(gw) for gw in candidates), default=0)
    nearest = [gw for gw in candidates if nearness(gw) == best]
    for gw in nearest if len(nearest) == 1 else []:
        cls = str(gw.get("spec.gatewayClassName", ""))
        low = cls.lower()
        if "internal" in low or "rilb" in low or "ilb" in low.split("-"):
            return f"from inside the VPC (Gateway {gw.name!r}, class {cls})", True
        if "external" in low:
            return f"from the internet (Gateway {gw.name!r}, class {cls})", False
    return None


def _pool_pods(inv: Inventory, namespace: str, name: str) -> tuple[Manifest, dict[str, str]] | None:
    """(InferencePool, its pod selector) named ``name`` in ``namespace``."""
    for pool in inv.of_kind("InferencePool"):
        if pool.namespace != namespace or pool.name != name:
            continue
        sel = pool.get("spec.selector")
        if not isinstance(sel, dict):
            return None
        match = sel.get("matchLabels")
        labels: dict[Any, Any] = match if isinstance(match, dict) else sel
        return pool, {str(k): str(v) for k, v in labels.items() if not isinstance(v, dict | list)}
    return None


@rule("vllm-exposed-without-auth", versions={"vllm": "all"})
def vllm_exposed_without_auth(inv: Inventory) -> Iterator[Finding]:
    """vLLM reachable from outside the cluster with no credentials asked by vLLM, a sidecar,
    the mesh (Istio AuthorizationPolicy, Envoy ext_authz) or the gateway."""
    services = {(s.namespace, s.name): s for s in inv.of_kind("Service")}
    # (front object, field path, namespace, pod selector, target port, reach, via text)
    routes: list[tuple[Manifest, str, str, Any, Any, tuple[str, bool], str]] = []
    for svc in services.values():
        if svc.get("spec.type") in _EXPOSING_TYPES:
            reach = _reach(svc.get("spec.type"), svc.get("metadata.annotations"))
            ports = svc.get("spec.ports")
            for p in ports if isinstance(ports, list) else [None]:
                target = p.get("targetPort", p.get("port")) if isinstance(p, dict) else None
                routes.append(
                    (
                        svc,
                        "spec.type",
                        svc.namespace,
                        svc.get("spec.selector"),
                        target,
                        reach,
                        f"Service {svc.name!r}",
                    )
                )
    for ing in inv.of_kind("Ingress"):
        ann = as_dict(ing.get("metadata.annotations"))
        if any(key in ann for key in _INGRESS_AUTH):
            continue  # the gateway asks for credentials
        for path, value in _walk(ing.get("spec"), "spec"):
            if not path.endswith(".service.name") or not isinstance(value, str):
                continue
            target_svc = services.get((ing.namespace, value))
            if target_svc is not None:
                number = ing.get(path.rsplit(".", 1)[0] + ".port.number")
                target = _service_target(target_svc, number)
                routes.append(
                    (
                        ing,
                        path,
                        ing.namespace,
                        target_svc.get("spec.selector"),
                        target,
                        _ingress_reach(inv, ing),
                        f"{ing.ref} -> Service {value!r}",
                    )
                )
    for route in inv.of_kind("HTTPRoute", "GRPCRoute"):
        if _gateway_auth(inv, route) is not None:
            continue
        gw_reach = _gateway_reach(inv, route)
        for path, node in _walk(route.get("spec"), "spec"):
            if not isinstance(node, dict) or not path.split(".")[-1].startswith("backendRefs"):
                continue
            kind, name = node.get("kind", "Service"), node.get("name")
            if not isinstance(name, str):
                continue
            if kind == "Service" and (route.namespace, name) in services:
                svc = services[(route.namespace, name)]
                routes.append(
                    (
                        route,
                        path,
                        route.namespace,
                        svc.get("spec.selector"),
                        _service_target(svc, node.get("port")),
                        gw_reach or ("through the Gateway", True),
                        f"{route.ref} -> Service {name!r}",
                    )
                )
            elif kind == "InferencePool" and (found := _pool_pods(inv, route.namespace, name)):
                routes.append(
                    (
                        route,
                        path,
                        route.namespace,
                        found[1],
                        None,
                        gw_reach or ("through the Gateway", True),
                        f"{route.ref} -> {found[0].ref}",
                    )
                )
    seen: set[tuple[str, str, str]] = set()
    for front, path, ns, selector, target, (where, private), via in routes:
        open_pods = [
            p
            for p, keyed in _vllm_pods(inv, ns, selector, target)
            if not keyed and _mesh_auth(inv, p) is None
        ]
        if not open_pods or (front.ref, front.file, path) in seen:
            continue
        seen.add((front.ref, front.file, path))
        names = ", ".join(sorted({p.manifest.ref for p in open_pods}))
        yield Finding.at(
            "vllm-exposed-without-auth",
            "warning" if private else "error",
            front,
            path,
            f"{via} makes the vLLM server of {names} reachable {where}, and nothing asks for "
            "credentials - not vLLM (--api-key / VLLM_API_KEY), a sidecar in front of it, "
            "the mesh (Istio AuthorizationPolicy, Envoy ext_authz) nor the gateway: anyone "
            "who reaches it can use the model, exhaust the GPUs, and call every endpoint the "
            "server enables (LoRA loading, prompt embeddings).",
            "Set VLLM_API_KEY from a Secret (vLLM then requires 'Authorization: Bearer'), or "
            "put authentication in front (ingress-nginx auth-url with oauth2-proxy, ALB OIDC, "
            "an Istio RequestAuthentication plus an AuthorizationPolicy requiring "
            "requestPrincipals, an Envoy Gateway SecurityPolicy); keep the Service ClusterIP.",
        )


def _service_target(svc: Manifest, port: Any) -> Any:
    """The targetPort behind Service port ``port`` (None: any of them)."""
    ports = svc.get("spec.ports")
    for p in ports if isinstance(ports, list) else []:
        if isinstance(p, dict) and (port is None or p.get("port") == port):
            return p.get("targetPort", p.get("port"))
    return None
