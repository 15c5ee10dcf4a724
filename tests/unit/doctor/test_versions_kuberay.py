"""rayservice-head-service-name follows the KubeRay version the input names (issue #11 pt 1):
KubeRay refuses the name from 1.3.0 (ValidateRayServiceSpec); 1.2.x accepts it. Below the
boundary: nothing; at and above: an error naming the version; unknown: a warning that says
which versions reject it."""

from __future__ import annotations

import pytest

from fleetserve.k8s.doctor.crds import KUBERAY
from fleetserve.k8s.doctor.loader import load_text
from fleetserve.k8s.doctor.registry import rule_info, run_rules

SERVICE = """\
apiVersion: ray.io/v1
kind: RayService
metadata: {name: chat}
spec:
  serveConfigV2: "applications: []"
  rayClusterConfig:
    headGroupSpec:
      headService:
        metadata: {name: chat}
      rayStartParams: {num-cpus: "0"}
      template:
        spec:
          containers: [{name: ray-head, image: rayproject/ray:2.60.0}]
"""


def _operator(tag: str) -> str:
    return f"""\
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: kuberay-operator}}
spec:
  selector: {{matchLabels: {{app: kuberay}}}}
  template:
    metadata: {{labels: {{app: kuberay}}}}
    spec:
      containers: [{{name: op, image: "quay.io/kuberay/operator:{tag}"}}]
"""


def _found(text: str) -> list[tuple[str, str]]:
    found = run_rules(load_text(text), {"rayservice-head-service-name"})
    return [(f.severity, f.message) for f in found]


@pytest.mark.parametrize("tag", ["v1.3.0", "v1.7.0"])
def test_at_and_above_the_boundary_is_an_error(tag: str) -> None:
    [(severity, message)] = _found(SERVICE + _operator(tag))
    assert severity == "error"
    # The message names the file that supplied the version (issue #30: say which file).
    image = f"quay.io/kuberay/operator:{tag}"
    assert f"KubeRay {tag.lstrip('v')} (operator image {image} in <input>) rejects" in message


def test_below_the_boundary_says_nothing() -> None:
    assert _found(SERVICE + _operator("v1.2.2")) == []


def test_chart_values_name_the_version() -> None:
    values = "---\nimage: {repository: quay.io/kuberay/operator, tag: v1.1.1}\nfeatureGates: []\n"
    assert _found(SERVICE + values) == []


def test_unknown_version_is_a_warning_in_the_conservative_wording() -> None:
    [(severity, message)] = _found(SERVICE)
    assert severity == "warning"
    assert "as every release from 1.3 does" in message
    assert "1.2 and older accept" in message
    # The release assumed is the one the schema check assumes, and the message says so (#30).
    assert f"KubeRay {KUBERAY.newest} (assumed: the input names no operator version" in message


def test_the_rule_declares_the_range() -> None:
    info = rule_info()["rayservice-head-service-name"]
    assert dict(info.versions) == {"kuberay": ">=1.3"}
    assert not info.applies("kuberay", "1.2.2")
    assert info.applies("kuberay", "1.3.0")
