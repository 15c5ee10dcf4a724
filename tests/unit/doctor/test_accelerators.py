"""What each accelerator family advertises to Ray, as KubeRay 1.7 and Ray's managers do.

KubeRay: a limit ending in ``gpu`` (NVIDIA, AMD) or an NVIDIA MIG slice is ``GPU``;
``google.com/tpu`` is ``TPU``; ``aws.amazon.com/neuroncore`` is ``neuron_cores``. Ray itself
detects Neuron devices (``neuron_cores``, count not written), Intel GPUs (``GPU``, count not
written) and Gaudi cards (``HPU``, one per card), and adds ``TPU-<type>-head`` on TPU hosts.
A trigger (the demand exceeds the pod) and a near miss per family.
"""

from __future__ import annotations

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_text
from fleetserve.k8s.doctor.ray_objects import accelerator_family, worker_groups
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import FIXTURES, findings_for


def _service(limit: str, amount: str, demand: str, params: str = "{}") -> str:
    return f"""apiVersion: ray.io/v1
kind: RayService
metadata: {{name: svc, namespace: ns}}
spec:
  serveConfigV2: |
    applications:
      - name: app
        import_path: app:build
        deployments:
          - name: D
            num_replicas: 1
            ray_actor_options: {{num_cpus: 1, {demand}}}
  rayClusterConfig:
    rayVersion: '2.52.0'
    headGroupSpec:
      rayStartParams: {{num-cpus: "0"}}
      template:
        spec:
          containers: [{{name: head, image: 'rayproject/ray:2.52.0'}}]
    workerGroupSpecs:
      - groupName: acc
        replicas: 1
        minReplicas: 1
        maxReplicas: 1
        rayStartParams: {params}
        template:
          spec:
            containers:
              - name: worker
                image: rayproject/ray:2.52.0
                resources:
                  limits: {{cpu: "16", memory: 64Gi, {limit}: "{amount}"}}
"""


def _infeasible(text: str) -> list[Finding]:
    return run_rules(load_text(text, "x.yaml"), {"infeasible-request"})


# (family, limit, amount, demand that fits, demand that does not; None = Ray's own count,
# unknown here, so nothing is infeasible)
FAMILIES = [
    ("NVIDIA GPU", "nvidia.com/gpu", "2", "num_gpus: 2", "num_gpus: 3"),
    ("NVIDIA GPU", "nvidia.com/mig-3g.40gb", "1", "num_gpus: 1", "num_gpus: 2"),
    ("AMD GPU", "amd.com/gpu", "4", "num_gpus: 4", "num_gpus: 8"),
    ("TPU", "google.com/tpu", "4", "resources: {TPU: 4}", "resources: {TPU: 8}"),
    ("AWS Neuron", "aws.amazon.com/neuroncore", "2", "resources: {neuron_cores: 2}",
     "resources: {neuron_cores: 4}"),
    ("Intel Gaudi", "habana.ai/gaudi", "8", "resources: {HPU: 8}", "resources: {HPU: 9}"),
    ("AWS Neuron", "aws.amazon.com/neuron", "1", "resources: {neuron_cores: 32}", None),
    ("Intel GPU", "gpu.intel.com/i915", "1", "num_gpus: 4", None),
]  # fmt: skip


@pytest.mark.parametrize(("family", "limit", "amount", "ok", "bad"), FAMILIES)
def test_family_trigger_and_near_miss(
    family: str, limit: str, amount: str, ok: str, bad: str | None
) -> None:
    text = _service(limit, amount, ok)
    (m,) = load_text(text, "x.yaml").manifests
    (g,) = worker_groups(m)
    assert accelerator_family(g) == family
    assert _infeasible(text) == [], f"{limit}: {ok} must fit"
    if bad is not None:
        (f,) = _infeasible(_service(limit, amount, bad))
        assert f.severity == "error"


def test_what_kuberay_and_ray_advertise() -> None:
    cases = {
        "google.com/tpu": ({"TPU": 4.0}, "limits.google.com/tpu"),
        "aws.amazon.com/neuroncore": ({"neuron_cores": 4.0}, "limits.aws.amazon.com/neuroncore"),
        "amd.com/gpu": ({"GPU": 4.0}, "limits.amd.com/gpu"),
    }
    for limit, (want, src) in cases.items():
        (m,) = load_text(_service(limit, "4", "num_gpus: 0"), "x.yaml").manifests
        (g,) = worker_groups(m)
        key = next(iter(want))
        assert g.advertised[key] == want[key]
        assert g.advertised_from[key] == src
    (m,) = load_text(_service("aws.amazon.com/neuron", "2", "num_gpus: 0"), "x.yaml").manifests
    (g,) = worker_groups(m)
    assert "neuron_cores" not in g.advertised
    assert "neuron_cores" in g.auto_detected


def test_ray_start_params_custom_accelerator_wins_over_the_limit() -> None:
    # KubeRay adds the TPU limit only when --resources names no TPU/neuron_cores already.
    text = _service(
        "google.com/tpu", "4", "resources: {TPU: 8}", params='{resources: \'"{\\"TPU\\": 8}"\'}'
    )
    (m,) = load_text(text, "x.yaml").manifests
    (g,) = worker_groups(m)
    assert g.advertised["TPU"] == 8
    assert _infeasible(text) == []


def test_tpu_head_resource_is_added_by_ray_only_on_tpu_hosts() -> None:
    tpu = _service("google.com/tpu", "4", 'resources: {TPU: 4, "TPU-v6e-16-head": 1}')
    assert _infeasible(tpu) == []
    gpu = _service("nvidia.com/gpu", "1", 'resources: {"TPU-v6e-16-head": 1}')
    assert len(_infeasible(gpu)) == 1


@pytest.mark.parametrize("name", ["near_miss_tpu.yaml", "near_miss_inferentia.yaml"])
def test_official_shaped_samples_get_no_infeasible_error(name: str) -> None:
    found = findings_for(FIXTURES / "infeasible-request" / name)
    assert not [f for f in found if f.severity == "error"], [f.message for f in found]


def test_tpu_trigger_names_the_tpu_supply() -> None:
    (f,) = [
        f
        for f in findings_for(FIXTURES / "infeasible-request" / "trigger_tpu.yaml")
        if f.rule == "infeasible-request"
    ]
    assert "TPU: 8" in f.message
    assert "worker group 'tpu-group' (TPU pods) {CPU: 24, memory: 168 GiB, TPU: 4}" in f.message


def test_accelerator_type_resources_are_left_to_ray() -> None:
    # @ray.remote(accelerator_type="A100") asks for "accelerator_type:A100": Ray adds it on
    # nodes it detects as such; the manifest cannot say, so it is assumed to fit.
    text = _service("nvidia.com/gpu", "1", 'resources: {"accelerator_type:A100": 0.001}')
    assert _infeasible(text) == []
    # A custom resource no group advertises is still infeasible.
    assert len(_infeasible(_service("nvidia.com/gpu", "1", "resources: {fast_disk: 1}"))) == 1
