"""LoRA adapters in the cluster: kubernetes.volumes mounted in every Ray pod, and render
refusing a local adapter path that no volume holds (the replica would 400/404 at the first
request for it instead)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from fleetserve.errors import RenderError, SpecError
from fleetserve.k8s.render import render
from fleetserve.serve.control.app import BuildArgs
from fleetserve.spec import parse_spec


def _templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rs,) = [o for o in objects if o["kind"] == "RayService"]
    cluster = rs["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]
    return [head] + [g["template"] for g in cluster["workerGroupSpecs"]]


def _fleet(kit: Any, **model: Any) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(kit.WHOLE_SPEC)
    data["kubernetes"]["volumes"] = copy.deepcopy(kit.LORA_VOLUMES)
    data["models"][0].update(model)
    return data


def _render(kit: Any, data: dict[str, Any]) -> list[dict[str, Any]]:
    _, plan_min, plan_max = kit.whole_fleet()
    return render(parse_spec(data), plan_min, plan_max)


def test_every_ray_pod_mounts_every_volume_at_its_path(kit: Any) -> None:
    templates = _templates(render(*kit.lora_fleet()))
    assert len(templates) >= 2  # head and at least one worker group
    for template in templates:
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["adapters"]["persistentVolumeClaim"] == {
            "claimName": "lora-adapters",
            "readOnly": True,
        }
        assert volumes["scratch"]["hostPath"] == {"path": "/mnt/lora", "type": "Directory"}
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["adapters"] == {
            "name": "adapters",
            "mountPath": "/adapters",
            "readOnly": True,
        }
        assert mounts["scratch"]["mountPath"] == "/scratch"
        assert mounts["scratch"]["readOnly"] is False
        assert mounts["ray-tmp"]["mountPath"] == "/tmp/ray"  # Ray's own volume stays


def test_the_app_gets_the_adapter_paths_the_pods_mount(kit: Any) -> None:
    objects = render(*kit.lora_fleet())
    (rs,) = [o for o in objects if o["kind"] == "RayService"]
    args = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]
    model = BuildArgs.model_validate(args).load_spec().models[0]
    assert model.adapter_dir == "/scratch/llama"
    assert {a.name: a.source for a in model.adapters} == {
        "sql": "/adapters/sql",
        "chat": "acme/llama-70b-chat-lora",
    }


def test_without_volumes_only_rays_temp_dir_is_mounted(kit: Any) -> None:
    for template in _templates(render(*kit.whole_fleet())):
        assert [v["name"] for v in template["spec"]["volumes"]] == ["ray-tmp"]


def test_hub_adapters_need_no_volume(kit: Any) -> None:
    data = _fleet(kit, adapters=[{"name": "chat", "source": "acme/llama-70b-chat-lora"}])
    data["kubernetes"].pop("volumes")
    assert _render(kit, data)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"adapter_dir": "/data/llama"}, "models[0].adapter_dir '/data/llama'"),
        # a prefix of the mount path's spelling is not inside it
        (
            {"adapters": [{"name": "sql", "source": "/adapters-old/sql"}]},
            "models[0].adapters[0].source '/adapters-old/sql'",
        ),
    ],
)
def test_a_local_adapter_path_on_no_volume_is_refused(
    kit: Any, model: dict[str, Any], field: str
) -> None:
    with pytest.raises(RenderError, match="on no volume") as err:
        _render(kit, _fleet(kit, **model))
    assert field in str(err.value)
    assert "/adapters, /scratch" in str(err.value)
    assert "kubernetes.volumes" in (err.value.hint or "")


def test_a_relative_adapter_path_is_refused(kit: Any) -> None:
    data = _fleet(kit, adapters=[{"name": "sql", "source": "./adapters/sql"}])
    with pytest.raises(RenderError, match=r"models\[0\].adapters\[0\].source .* not an absolute"):
        _render(kit, data)


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        ({"mount_path": "/a"}, "exactly one of claim"),
        ({"mount_path": "/a", "claim": "c", "host_path": "/x"}, "exactly one of claim"),
        ({"mount_path": "adapters", "claim": "c"}, "mount_path: 'adapters' must be an absolute"),
        ({"mount_path": "/a/../etc", "claim": "c"}, "mount_path: '/a/../etc' must not contain"),
        ({"mount_path": "/tmp/ray/x", "claim": "c"}, "Ray's temp directory"),
        ({"mount_path": "/a", "host_path": "mnt"}, "host_path: 'mnt' must be an absolute"),
    ],
)
def test_volume_spec_errors_name_the_field(kit: Any, volume: dict[str, Any], message: str) -> None:
    data = copy.deepcopy(kit.WHOLE_SPEC)
    data["kubernetes"]["volumes"] = [{"name": "v", **volume}]
    with pytest.raises(SpecError, match=r"kubernetes\.volumes") as err:
        parse_spec(data)
    assert message in str(err.value)


def test_volume_names_and_mount_paths_are_distinct(kit: Any) -> None:
    data = copy.deepcopy(kit.WHOLE_SPEC)
    data["kubernetes"]["volumes"] = [
        {"name": "a", "claim": "c", "mount_path": "/adapters"},
        {"name": "b", "claim": "d", "mount_path": "/adapters/"},
    ]
    with pytest.raises(SpecError, match=r"volumes\[1\].mount_path '/adapters' is also"):
        parse_spec(data)
    data["kubernetes"]["volumes"] = [{"name": "ray-tmp", "claim": "c", "mount_path": "/x"}]
    with pytest.raises(SpecError, match="render's own volume"):
        parse_spec(data)


def _workers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _templates(objects)[1:]


def test_compile_cache_volume_becomes_vllm_cache_root_in_every_worker(kit: Any) -> None:
    data = _fleet(kit)
    data["kubernetes"]["compile_cache"] = "scratch"  # the writable hostPath volume
    objects = _render(kit, data)
    for template in _workers(objects):
        (container,) = template["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["VLLM_CACHE_ROOT"] == "/scratch/vllm"
        # what a vllm-cpu engine's restart reuses (engine/compile_cache.py)
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/inductor"
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["scratch"]["readOnly"] is False
    # The head runs no engine: no cache there.
    (head_container,) = _templates(objects)[0]["spec"]["containers"]
    assert not CACHE_VARIABLES & {e["name"] for e in head_container.get("env", [])}


CACHE_VARIABLES = {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"}


def test_without_compile_cache_no_worker_gets_the_variables(kit: Any) -> None:
    objects = render(*kit.lora_fleet())
    for template in _workers(objects):
        (container,) = template["spec"]["containers"]
        assert not CACHE_VARIABLES & {e["name"] for e in container.get("env", [])}


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ("nowhere", "compile_cache 'nowhere' names no kubernetes.volumes entry"),
        ("adapters", "the volume is read_only"),
    ],
)
def test_compile_cache_must_name_a_writable_volume(kit: Any, cache: str, message: str) -> None:
    data = _fleet(kit)
    data["kubernetes"]["compile_cache"] = cache
    with pytest.raises(SpecError, match=message) as err:
        parse_spec(data)
    assert "kubernetes" in str(err.value)
