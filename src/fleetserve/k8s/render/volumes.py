"""Volumes of the Ray pods: where the spec's local adapter paths live in the cluster (pure).

Design note. A replica loads a LoRA adapter from a path (``adapters[].source`` that is a
directory, or ``<adapter_dir>/<id>``) and the ingress lists ``adapter_dir`` to route
requests, so those paths must exist, with the same name, in every Ray pod: the head runs
the Serve controller that builds the app, and Serve may place the ingress and a model's
replicas on any worker. The operator names the storage in ``kubernetes.volumes`` (a
PersistentVolumeClaim, or a hostPath on dev clusters) and its ``mount_path``; render mounts
each volume in every Ray container and refuses a local adapter path no volume holds (the
pods would start, then fail on the first request for that adapter). An adapter given as a
HF repo id needs no volume: the replica downloads it with the model's ``hf_token``.

What must stay true: a volume is mounted at the same path in head and workers, read-only
unless the spec says otherwise, and each refused path is named by its spec field.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from fleetserve.adapters import is_local_source
from fleetserve.errors import RenderError
from fleetserve.spec import FleetSpec, VolumeSpec


def adapter_paths(spec: FleetSpec) -> list[tuple[int, str, str]]:
    """``(model index, field path, path)`` of every local path replicas read adapters from."""
    out: list[tuple[int, str, str]] = []
    for i, model in enumerate(spec.models):
        if model.adapter_dir is not None:
            out.append((i, f"models[{i}].adapter_dir", model.adapter_dir))
        for j, adapter in enumerate(model.adapters):
            if is_local_source(adapter.source):
                out.append((i, f"models[{i}].adapters[{j}].source", adapter.source))
    return out


def check_adapter_volumes(spec: FleetSpec) -> None:
    """Refuse a local adapter path that no ``kubernetes.volumes`` entry holds."""
    volumes = spec.kubernetes.volumes
    mounts = ", ".join(v.mount_path for v in volumes) or "none"
    for _, field, path in adapter_paths(spec):
        pod_path = PurePosixPath(path)
        if not pod_path.is_absolute() or ".." in pod_path.parts:
            raise RenderError(
                f"{field} '{path}' is not an absolute path: the pods cannot resolve it",
                hint="write the path the adapters have inside the pods (under a "
                "kubernetes.volumes[].mount_path)",
            )
        if not any(v.holds(str(pod_path)) for v in volumes):
            raise RenderError(
                f"{field} '{path}' is on no volume of the Ray pods (kubernetes.volumes "
                f"mount paths: {mounts}): the replicas could not load the adapter",
                hint="add a kubernetes.volumes entry (claim: <pvc> or host_path: <dir>) whose "
                "mount_path holds it, or give the adapter as a HF repo id",
            )


def _volume(v: VolumeSpec) -> dict[str, Any]:
    if v.claim is not None:
        return {
            "name": v.name,
            "persistentVolumeClaim": {"claimName": v.claim, "readOnly": v.read_only},
        }
    # Directory: fail the pod at mount time when the node lacks it, not at first request.
    return {"name": v.name, "hostPath": {"path": v.host_path, "type": "Directory"}}


def pod_volumes(spec: FleetSpec) -> list[dict[str, Any]]:
    """The spec's volumes as pod ``volumes`` entries (spec order)."""
    return [_volume(v) for v in spec.kubernetes.volumes]


def volume_mounts(spec: FleetSpec) -> list[dict[str, Any]]:
    """The spec's volumes as container ``volumeMounts`` entries (spec order)."""
    return [
        {"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only}
        for v in spec.kubernetes.volumes
    ]
