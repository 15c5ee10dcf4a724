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
