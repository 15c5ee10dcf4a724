"""What each layer sees: KubeRay's advertised resources, quantities, Serve deployments."""

from __future__ import annotations

import pytest

from fleetserve.k8s.doctor.loader import load_text
from fleetserve.k8s.doctor.ray_objects import (
    cluster_spec,
    groups,
    parse_quantity,
    serve_apps,
)


@pytest.mark.parametrize(
    ("q", "v"),
    [("500m", 0.5), ("4", 4.0), (2, 2.0), ("16Gi", 16 * 2**30), ("12G", 12e9), ("1.5", 1.5)],
)
def test_parse_quantity(q: str | int, v: float) -> None:
    assert parse_quantity(q) == v


@pytest.mark.parametrize("q", ["lots", "", "4 cpus", True])
def test_parse_quantity_rejects(q: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(q)


def _cluster(worker: str, kind: str = "RayCluster") -> str:
    spec_key = {"RayCluster": "spec:", "RayJob": "spec:\n  rayClusterSpec:"}[kind]
    indent = "  " if kind == "RayCluster" else "    "
    body = f"""headGroupSpec:
  rayStartParams: {{num-cpus: "0"}}
  template:
    spec:
      containers: [{{name: h, image: i}}]
workerGroupSpecs:
  - groupName: w
    minReplicas: 1
    maxReplicas: 3
{worker}"""
    body = "\n".join(indent + line for line in body.splitlines())
    return f"apiVersion: ray.io/v1\nkind: {kind}\nmetadata: {{name: c}}\n{spec_key}\n{body}\n"


W = """    rayStartParams: {params}
    {extra}
    template:
      spec:
        containers:
          - name: w
            image: i
            resources: {resources}"""


@pytest.mark.parametrize(
    ("params", "extra", "resources", "cpu", "src"),
    [
        ("{}", "", "{limits: {cpu: '4'}}", 4, "limits.cpu"),
        ("{}", "", "{limits: {cpu: 2500m}}", 3, "limits.cpu"),
        ("{}", "", "{requests: {cpu: '2'}}", 2, "requests.cpu"),
        ("{num-cpus: '1'}", "", "{limits: {cpu: '8'}}", 1, "rayStartParams.num-cpus"),
        ("{}", "resources: {CPU: '6'}", "{limits: {cpu: '8'}}", 6, "resources.CPU"),
    ],
)
def test_advertised_cpu(params: str, extra: str, resources: str, cpu: int, src: str) -> None:
    worker = W.format(params=params, extra=extra, resources=resources)
    [m] = load_text(_cluster(worker)).manifests
    g = groups(m)[1]
    assert g.advertised["CPU"] == cpu
    assert g.advertised_from["CPU"] == src


def test_advertised_gpu_memory_custom() -> None:
    worker = W.format(
        params="""{resources: '"{\\"TPU\\": 4}"'}""",
        extra="",
        resources="{limits: {nvidia.com/gpu: 2, memory: 16Gi}, requests: {memory: 8Gi}}",
    )
    [m] = load_text(_cluster(worker)).manifests
    g = groups(m)[1]
    assert g.advertised["GPU"] == 2
    assert g.advertised["memory"] == 16 * 2**30  # from the limit, never the request
    assert g.advertised["TPU"] == 4
    assert "CPU" not in g.advertised  # auto-detected by Ray: unknown here
    assert (g.min_replicas, g.max_replicas, g.name) == (1, 3, "w")
    assert g.path == "spec.workerGroupSpecs[0]"


def test_rayjob_cluster_spec_path() -> None:
    worker = W.format(params="{}", extra="", resources="{}")
    [m] = load_text(_cluster(worker, "RayJob")).manifests
    found = cluster_spec(m)
    assert found is not None
    assert found[1] == "spec.rayClusterSpec"
    assert groups(m)[1].path == "spec.rayClusterSpec.workerGroupSpecs[0]"


def test_serve_deployments_from_yaml_string() -> None:
    text = """apiVersion: ray.io/v1
kind: RayService
metadata: {name: s}
spec:
  serveConfigV2: |
    applications:
      - name: app
        deployments:
          - name: A
          - name: B
"""
    [m] = load_text(text).manifests
    names = [(d.name, d.path) for app in serve_apps(m) for d in app.deployments]
    assert names == [
        ("app/A", "spec.serveConfigV2:applications[0].deployments[0]"),
        ("app/B", "spec.serveConfigV2:applications[0].deployments[1]"),
    ]
