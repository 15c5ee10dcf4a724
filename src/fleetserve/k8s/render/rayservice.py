"""The RayService (ray.io/v1, KubeRay 1.7) of a fleet (pure).

What must stay true (KubeRay controller rules the CRD schema does not show, see pitfalls):
no ``headService`` (the operator names head services for blue/green upgrades), the name is a
DNS-1035 label of at most 47 characters, ``rayVersion`` equals the Ray version in the image
tag, the head advertises ``num-cpus: "0"`` so no replica lands on it, resources are set
only through the container limits (never both ``rayStartParams`` and the group
``resources`` map), in-tree autoscaling v2 is on, and the deprecated
``serviceUnhealthySecondThreshold``/``deploymentUnhealthySecondThreshold`` are not set.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from fleetserve.errors import RenderError
from fleetserve.k8s.render.groups import WorkerGroup
from fleetserve.k8s.render.naming import common_labels
from fleetserve.k8s.render.options import RenderOptions
from fleetserve.k8s.render.pods import container_security_context, head_template, worker_template
from fleetserve.k8s.render.secrets import SecretEnv
from fleetserve.spec import FleetSpec, PoolSpec

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IMAGE_RAY_VERSION = re.compile(r":(?:[^/]*?-)?(\d+\.\d+\.\d+)(?:[-.][^/]*)?$")
#: KubeRay's limit for RayService names (it appends suffixes to RayCluster names).
MAX_RAYSERVICE_NAME = 47


def image_ray_version(image: str) -> str | None:
    """The Ray version in an image tag (``rayproject/ray-llm:2.60.0-py311-cu128`` -> 2.60.0)."""
    if "@" in image:
        image = image.split("@", 1)[0]
    match = _IMAGE_RAY_VERSION.search(image)
    return match.group(1) if match else None


def check_cluster_settings(spec: FleetSpec) -> None:
    """Refuse names/versions the KubeRay controller would reject after ``kubectl apply``."""
    k8s = spec.kubernetes
    if len(k8s.name) > MAX_RAYSERVICE_NAME or not _DNS_1035.match(k8s.name):
        raise RenderError(
            f"kubernetes.name '{k8s.name}' is not a DNS-1035 label of at most "
            f"{MAX_RAYSERVICE_NAME} characters (KubeRay rejects the RayService)",
            hint="use lower-case letters, digits and '-', starting with a letter",
        )
    tag_version = image_ray_version(k8s.image)
    if tag_version is not None and tag_version != k8s.ray_version:
        raise RenderError(
            f"kubernetes.ray_version ({k8s.ray_version}) differs from the Ray version in "
            f"kubernetes.image ({k8s.image}: {tag_version})",
            hint=f"set kubernetes.ray_version: '{tag_version}' or use an image of Ray "
            f"{k8s.ray_version}",
        )


class _LiteralDumper(yaml.SafeDumper):
    """YAML dumper that writes multi-line strings as ``|`` blocks (readable serveConfigV2)
    and never emits anchors/aliases (each manifest stands alone, as kubectl shows it)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_LiteralDumper.add_representer(str, _str_presenter)


def dump_yaml(data: Any) -> str:
    """Deterministic YAML (insertion order kept, no line folding, multi-line as blocks)."""
    return yaml.dump(
        data, Dumper=_LiteralDumper, sort_keys=False, width=1_000_000, allow_unicode=True
    )


def rayservice(
    spec: FleetSpec,
    groups: list[WorkerGroup],
    serve: dict[str, Any],
    *,
    options: RenderOptions,
    head_pool: PoolSpec | None,
    secrets: list[SecretEnv],
    hami: bool,
) -> dict[str, Any]:
    """The RayService object (``hami``: GPU pods get HAMi slices and its scheduler)."""
    check_cluster_settings(spec)
    k8s = spec.kubernetes
    worker_groups = [
        {
            "groupName": group.name,
            "replicas": group.min_replicas,
            "minReplicas": group.min_replicas,
            "maxReplicas": group.max_replicas,
            "rayStartParams": {},
            # The model's resource: only that model's replicas (or, for a replica over
            # several pods, its GPU bundles: one unit per card) fit.
            "resources": {group.ray_resource: str(group.ray_units)},
            "template": worker_template(spec, group, hami=hami, secrets=secrets),
        }
        for group in groups
    ]
    cluster: dict[str, Any] = {
        "rayVersion": k8s.ray_version,
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "version": "v2",
            "upscalingMode": "Default",
            "idleTimeoutSeconds": options.idle_timeout_s,
            "resources": {
                "limits": {"cpu": "500m", "memory": "512Mi"},
                "requests": {"cpu": "500m", "memory": "512Mi"},
            },
            "securityContext": container_security_context(),
        },
        "headGroupSpec": {
            # Zero CPUs: the head runs the GCS and the Serve controller, never a replica
            # (a head restart would otherwise take serving down with it).
            "rayStartParams": {"num-cpus": "0"},
            "template": head_template(
                spec,
                pool=head_pool,
                cpu=options.head_cpu,
                memory_gib=options.head_memory_gib,
                secrets=secrets,
            ),
        },
        "workerGroupSpecs": worker_groups,
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {
            "name": k8s.name,
            "namespace": k8s.namespace,
            "labels": common_labels(k8s.name),
        },
        "spec": {
            "upgradeStrategy": {"type": "NewCluster"},
            "serveConfigV2": dump_yaml(serve),
            "rayClusterConfig": cluster,
        },
    }
