"""dashboard-exposed through an Ingress says from where the head is reachable (issue #11 pt 5):
an internal load balancer (AWS ALB scheme, GKE gce-internal, Azure private IP) serves the VPC,
a warning; an internet-facing one is an error. Manifests written here, in the KubeRay sample's
shape (an ALB Ingress in front of the head Service's dashboard port)."""

from __future__ import annotations

import pytest

from fleetserve.k8s.doctor.loader import load_text
from fleetserve.k8s.doctor.registry import run_rules

INGRESS = """\
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: dash
  annotations:
{annotations}
spec:
  ingressClassName: {cls}
  rules:
  - http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: raycluster-head-svc
            port:
              number: 8265
"""


def _found(annotations: str, cls: str = "alb") -> list[tuple[str, str]]:
    text = INGRESS.format(annotations=annotations, cls=cls)
    found = run_rules(load_text(text), {"dashboard-exposed"})
    return [(f.severity, f.message) for f in found]


@pytest.mark.parametrize(
    ("annotations", "cls"),
    [
        ("    alb.ingress.kubernetes.io/scheme: internal", "alb"),
        ("    appgw.ingress.kubernetes.io/use-private-ip: 'true'", "azure-application-gateway"),
        ("    kubernetes.io/ingress.class: gce-internal", "x"),
        ("    team: ml", "gce-internal"),
    ],
)
def test_internal_load_balancer_is_a_warning_that_says_vpc(annotations: str, cls: str) -> None:
    [(severity, message)] = _found(annotations, cls)
    assert severity == "warning"
    assert "from inside the VPC" in message
    assert "not from the internet" in message


def test_internet_facing_ingress_is_an_error() -> None:
    [(severity, message)] = _found("    alb.ingress.kubernetes.io/scheme: internet-facing")
    assert severity == "error"
    assert "reachable from outside the cluster" in message


CLUSTER = """\
---
apiVersion: ray.io/v1
kind: RayCluster
metadata:
  name: rc
spec:
  rayVersion: "2.53.0"
{auth}
  headGroupSpec:
    rayStartParams: {{}}
    template:
      spec:
        containers:
        - name: ray-head
          image: rayproject/ray:2.53.0
          env:
{env}
"""
TLS_ENV = """\
          - {name: RAY_USE_TLS, value: "1"}
          - {name: RAY_TLS_SERVER_CERT, value: /etc/ray/tls/tls.crt}
          - {name: RAY_TLS_SERVER_KEY, value: /etc/ray/tls/tls.key}
          - {name: RAY_TLS_CA_CERT, value: /etc/ray/tls/ca.crt}"""
NO_ENV = "          - {name: X, value: y}"


def _behind_ingress(port: int, env: str, auth: str = "") -> list[tuple[str, str]]:
    ingress = (
        INGRESS.format(annotations="    team: ml", cls="nginx")
        .replace("raycluster-head-svc", "rc-head-svc")
        .replace("number: 8265", f"number: {port}")
    )
    text = ingress + CLUSTER.format(env=env, auth=auth)
    found = run_rules(load_text(text), {"dashboard-exposed"})
    return [(f.severity, f.message) for f in found if f.object.startswith("Ingress/")]


def test_ray_client_behind_mutual_tls_is_a_warning() -> None:
    [(severity, message)] = _behind_ingress(10001, TLS_ENV)
    assert severity == "warning"
    assert "mutual TLS is on" in message


def test_mutual_tls_does_not_cover_the_dashboard() -> None:
    [(severity, _)] = _behind_ingress(8265, TLS_ENV)
    assert severity == "error"


def test_ray_client_without_tls_is_an_error() -> None:
    [(severity, _)] = _behind_ingress(10001, NO_ENV)
    assert severity == "error"


def test_token_auth_of_the_cluster_behind_an_ingress_counts() -> None:
    [(severity, message)] = _behind_ingress(8265, NO_ENV, "  authOptions: {mode: token}")
    assert severity == "warning"
    assert "token authentication is on" in message


NGINX_VALUES = """\
---
controller:
  service:
    annotations:
      service.beta.kubernetes.io/aws-load-balancer-scheme: {scheme}
    targetPorts: {{http: http, https: http}}
"""


@pytest.mark.parametrize(
    ("scheme", "cls", "severity"),
    [
        ("internal", "nginx", "warning"),  # the controller behind the Ingress is internal
        ("internet-facing", "nginx", "error"),
        ("internal", "alb", "error"),  # another controller serves this Ingress
    ],
)
def test_ingress_nginx_values_decide_the_reach(scheme: str, cls: str, severity: str) -> None:
    text = INGRESS.format(annotations="    team: ml", cls=cls) + NGINX_VALUES.format(scheme=scheme)
    inv = load_text(text)
    assert [h.chart for h in inv.helm_values] == ["ingress-nginx"]
    [f] = run_rules(inv, {"dashboard-exposed"})
    assert f.severity == severity
    if severity == "warning":
        assert "from inside the VPC" in f.message
        assert "the nginx controller's Service" in f.message


def test_other_charts_with_a_controller_key_are_not_ingress_nginx() -> None:
    karpenter_like = "controller:\n  resources: {requests: {cpu: 1}}\n  env: []\n"
    assert load_text(karpenter_like).helm_values == ()
