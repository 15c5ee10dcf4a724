"""Version-aware rules: each boundary below, at and above, and the wording with no version.

Boundaries (checked in the released Ray wheels): Serve's new names from 2.10, the old names
dropped silently from 2.33; Ray Train v2 the default from 2.51; vLLM's V1 engine (chunked
prefill always on) from 0.8.
"""

from __future__ import annotations

import textwrap

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory
from fleetserve.k8s.doctor.loader import load_python_text, load_text
from fleetserve.k8s.doctor.registry import run_rules
from fleetserve.k8s.doctor.rules._versions import (
    normalise,
    ray_version,
    vllm_version_of_image,
)

from .conftest import FIXTURES


def _service(deployment: str, ray: str | None, image_tag: str | None = None) -> str:
    """A RayService with one GPU deployment; ``ray`` None = no rayVersion and a custom image."""
    image = f"rayproject/ray:{image_tag or ray}-py311" if (image_tag or ray) else "acme/llm:1.4"
    version = f"    rayVersion: '{ray}'\n" if ray else ""
    return (
        "apiVersion: ray.io/v1\nkind: RayService\nmetadata:\n  name: svc\n  namespace: ns\n"
        "spec:\n  serveConfigV2: |\n    applications:\n      - name: app\n"
        "        import_path: app:build\n        runtime_env:\n          env_vars:\n"
        '            MODEL_ID: "org/model"\n            MAX_NUM_SEQS: "4"\n'
        "        deployments:\n"
        + textwrap.indent(textwrap.dedent(deployment).strip("\n"), " " * 10)
        + "\n  rayClusterConfig:\n"
        + version
        + "    headGroupSpec:\n      rayStartParams: {num-cpus: '0'}\n      template:\n"
        f"        spec:\n          containers:\n            - name: ray-head\n"
        f"              image: {image}\n"
        "    workerGroupSpecs:\n      - groupName: gpu\n        replicas: 1\n"
        "        minReplicas: 1\n        maxReplicas: 2\n        rayStartParams: {}\n"
        "        template:\n          spec:\n            containers:\n"
        f"              - name: ray-worker\n                image: {image}\n"
        "                resources:\n                  limits: {cpu: 8, memory: 32Gi, "
        "nvidia.com/gpu: 1}\n"
    )


OLD = """
- name: D
  max_concurrent_queries: 100
  autoscaling_config:
    min_replicas: 1
    max_replicas: 2
    target_num_ongoing_requests_per_replica: 20
  ray_actor_options: {num_gpus: 1}
"""
NEW = """
- name: D
  max_ongoing_requests: 100
  autoscaling_config:
    min_replicas: 1
    max_replicas: 2
    target_ongoing_requests: 20
  ray_actor_options: {num_gpus: 1}
"""


def _run(text: str, *rules: str) -> list[Finding]:
    return [f for f in run_rules(load_text(text, "x.yaml"), set(rules)) if f.rule in rules]


def test_version_is_read_from_ray_version_then_images() -> None:
    (m,) = load_text(_service(OLD, "2.9.0"), "x.yaml").manifests
    v = ray_version(m)
    assert v is not None
    assert str(v.version) == "2.9.0"
    assert v.source == "rayVersion"
    (m,) = load_text(_service(OLD, None, image_tag="2.41.0"), "x.yaml").manifests
    v = ray_version(m)
    assert v is not None
    assert v.describe() == "Ray 2.41.0 (image rayproject/ray:2.41.0-py311)"
    (m,) = load_text(_service(OLD, None), "x.yaml").manifests
    assert ray_version(m) is None  # a custom image's tag is not Ray's version


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.6.3", "0.6.3"),
        ("docker.io/vllm/vllm-openai:v0.10.1.1", "0.10.1"),
        ("vllm/vllm-openai:latest", None),
        ("rayproject/ray:2.9.0", None),
    ],
)
def test_vllm_version_of_image(image: str, version: str | None) -> None:
    assert vllm_version_of_image(image) == version


def test_normalise() -> None:
    assert str(normalise("v2.9")) == "2.9.0"
    assert str(normalise("2.33.0-py310-gpu")) == "2.33.0"
    assert normalise("nightly") is None


# ------------------------------------------------------------------ Serve field names


@pytest.mark.parametrize("ray", ["2.9.0", "2.9.3"])
def test_below_2_10_old_names_are_current(ray: str) -> None:
    assert _run(_service(OLD, ray), "deprecated-serve-field") == []


def test_below_2_10_new_names_are_dropped() -> None:
    found = {
        f.path.rsplit(".", 1)[-1]: f for f in _run(_service(NEW, "2.9.0"), "deprecated-serve-field")
    }
    assert set(found) == {"max_ongoing_requests", "target_ongoing_requests"}
    f = found["max_ongoing_requests"]
    assert f.severity == "error"
    assert "Ray 2.9.0 (rayVersion) does not know it" in f.message
    assert "max_concurrent_queries = 100 (its default)" in f.message
    assert "max_concurrent_queries: 100" in f.fix  # the fix keeps the pinned version working
    assert "target_num_ongoing_requests_per_replica = 1 (its default)" in (
        found["target_ongoing_requests"].message
    )


@pytest.mark.parametrize("ray", ["2.10.0", "2.24.0", "2.32.0"])
def test_2_10_to_2_32_old_names_still_work(ray: str) -> None:
    found = _run(_service(OLD, ray), "deprecated-serve-field")
    assert len(found) == 2
    for f in found:
        assert f.severity == "warning"
        assert f"Ray {ray} (rayVersion) still honours" in f.message
        assert "dropped" not in f.message.split(";")[0]  # never "dropped" for this version
    assert _run(_service(NEW, ray), "deprecated-serve-field") == []


@pytest.mark.parametrize("ray", ["2.33.0", "2.35.0", "2.60.0"])
def test_from_2_33_old_names_are_dropped(ray: str) -> None:
    found = {
        f.path.rsplit(".", 1)[-1]: f for f in _run(_service(OLD, ray), "deprecated-serve-field")
    }
    assert {f.severity for f in found.values()} == {"error"}
    assert f"Ray {ray} (rayVersion) accepts the config without a word and drops it" in (
        found["max_concurrent_queries"].message
    )
    assert (
        "max_ongoing_requests = 5 (Ray's default), not 100"
        in found["max_concurrent_queries"].message
    )
    assert _run(_service(NEW, ray), "deprecated-serve-field") == []


def test_unknown_version_is_a_warning_that_names_both_ranges() -> None:
    found = _run(_service(OLD, None), "deprecated-serve-field")
    assert {f.severity for f in found} == {"warning"}
    for f in found:
        assert "the manifest names no Ray version" in f.message
        assert "Ray 2.10-2.32 still honour it" in f.message


def test_version_from_image_when_ray_version_is_absent() -> None:
    found = _run(_service(OLD, None, image_tag="2.35.0"), "deprecated-serve-field")
    assert {f.severity for f in found} == {"error"}
    assert all("image rayproject/ray:2.35.0-py311" in f.message for f in found)


def test_catalogue_fixtures_for_the_versions_exist() -> None:
    folder = FIXTURES / "deprecated-serve-field"
    assert (folder / "near_miss_ray_2_9.yaml").is_file()
    assert (folder / "trigger_ray_2_9_new_names.yaml").is_file()


# ------------------------------------------------------------------ one report, one story


def test_batching_target_follows_the_same_version_facts() -> None:
    old_and_seqs = OLD  # target 20 (old name) vs MAX_NUM_SEQS 4
    # 2.35: the old target is dropped: no max_num_seqs finding may cite it.
    text = _service(old_and_seqs, "2.35.0")
    both = run_rules(
        load_text(text, "x.yaml"), {"deprecated-serve-field", "max-num-batched-tokens"}
    )
    assert any(f.rule == "deprecated-serve-field" and "drops it" in f.message for f in both)
    assert not any(
        f.rule == "max-num-batched-tokens" and "target_num_ongoing" in f.message for f in both
    )
    # 2.24: the old name still works, so it is the target that matters.
    (f,) = _run(_service(old_and_seqs, "2.24.0"), "max-num-batched-tokens")
    assert "autoscaling_config.target_num_ongoing_requests_per_replica, Ray 2.24.0" in f.message
    # No version: only the new name is used, with the assumption said.
    assert _run(_service(old_and_seqs, None), "max-num-batched-tokens") == []
    (f,) = _run(_service(NEW, None), "max-num-batched-tokens")
    assert "assuming Ray 2.10 or later" in f.message
    # 2.9: the new name is ignored by Ray, so it cannot be the target.
    assert _run(_service(NEW, "2.9.0"), "max-num-batched-tokens") == []


def _vllm_pod(tag: str, chunked: str = "") -> str:
    return (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: llm, namespace: ns}\n"
        "spec:\n  template:\n    spec:\n      containers:\n        - name: vllm\n"
        f"          image: vllm/vllm-openai:{tag}\n"
        "          args: [--model, org/m, --max-model-len, '8192', "
        f"--max-num-batched-tokens, '2048'{chunked}]\n"
    )


@pytest.mark.parametrize(
    ("tag", "hit"), [("v0.6.3", True), ("v0.7.3", True), ("v0.8.0", False), ("v0.10.1", False)]
)
def test_vllm_v0_leaves_chunked_prefill_off(tag: str, hit: bool) -> None:
    found = _run(_vllm_pod(tag), "max-num-batched-tokens")
    assert bool(found) is hit
    if hit:
        assert (
            f"vLLM {tag.lstrip('v')} (image vllm/vllm-openai:{tag}) (V0 engine)" in found[0].message
        )


def test_vllm_unknown_version_keeps_chunked_default_on() -> None:
    assert _run(_vllm_pod("latest"), "max-num-batched-tokens") == []
    assert _run(_vllm_pod("v0.6.3", ", --enable-chunked-prefill"), "max-num-batched-tokens") == []


# ------------------------------------------------------------------ Ray Train v1 / v2

CLUSTER = (FIXTURES / "train-coordinator-cpu" / "trigger" / "raycluster.yaml").read_text(
    encoding="utf-8"
)
TRAIN = (FIXTURES / "train-coordinator-cpu" / "trigger" / "train.py").read_text(encoding="utf-8")


def _train(cluster: str, script: str = TRAIN) -> list[Finding]:
    inv = Inventory(
        load_text(cluster, "c.yaml").manifests,
        (),
        load_python_text(script, "train.py").scaling_configs,
    )
    return run_rules(inv, {"train-coordinator-cpu"})


@pytest.mark.parametrize(("ray", "v1"), [("2.50.1", True), ("2.51.0", False), ("2.52.0", False)])
def test_train_default_flips_at_2_51(ray: str, v1: bool) -> None:
    found = _train(CLUSTER.replace("2.41.0", ray))
    assert bool(found) is v1
    if v1:
        assert f"Ray Train v1 (Ray {ray} (rayVersion): Train v1 is its default)" in found[0].message
        assert found[0].severity == "error"


def test_train_unknown_version_is_a_conditional_warning() -> None:
    cluster = CLUSTER.replace('rayVersion: "2.41.0"', "").replace("2.41.0", "custom")
    (f,) = _train(cluster)
    assert f.severity == "warning"
    assert f.message.startswith("If this runs Ray Train v1")
    assert "RAY_TRAIN_V2_ENABLED=1" in f.fix


def test_num_workers_from_an_env_var_in_the_manifest() -> None:
    script = TRAIN.replace("num_workers=4", 'num_workers=int(os.environ.get("NUM_WORKERS", "2"))')
    script = "import os\n" + script
    (f,) = _train(CLUSTER, script)
    assert "whatever num_workers (2, the script's default: NUM_WORKERS is not set" in f.message
    head = "          - name: ray-head\n"
    with_env = CLUSTER.replace(
        head, head + '            env: [{name: NUM_WORKERS, value: "6"}]\n', 1
    )
    assert with_env != CLUSTER
    (f,) = _train(with_env, script)
    assert "whatever num_workers (6, from NUM_WORKERS in the head container's env" in f.message


@pytest.mark.parametrize(("ray", "on"), [("2.51.0", False), ("2.52.0", True), ("2.53.1", True)])
def test_token_auth_exists_from_2_52(ray: str, on: bool) -> None:
    text = _service(OLD, ray).replace(
        "    headGroupSpec:\n",
        "    authOptions: {mode: token}\n    headGroupSpec:\n      serviceType: NodePort\n",
        1,
    )
    (f,) = _run(text, "dashboard-exposed")
    assert f.severity == ("warning" if on else "error")
    assert ("token authentication is on" in f.message) is on
    if not on:
        assert f"Ray {ray} (rayVersion) predates Ray's token authentication" in f.message
