"""KubeRay controller rules the CRD schema does not show (KubeRay v1.7.0).

``kubectl apply`` accepts these objects; then the operator's validation
(``ray-operator/controllers/ray/utils/validation.go``) refuses them, logs an
``InvalidRayServiceSpec``/``InvalidRayClusterSpec`` event, and no RayCluster appears. Each rule
below mirrors one check of that file, and its message quotes what the operator says, so a user
can grep the operator's events for it.

What must stay true: these rules read only the object itself (no cross-object joins), report
one finding per violated check, and stay silent on anything the operator accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fleetserve.k8s.doctor.crds import KUBERAY
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import (
    RAY_KINDS,
    autoscaling_enabled,
    cluster_spec,
    groups,
    head_group,
    worker_groups,
)
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._versions import (
    KUBERAY_REJECTS_HEAD_SERVICE_NAME_FROM,
    kuberay_version,
)

#: Name limits from KubeRay's utils/constant.go: MaxRayClusterNameLength = 53, and RayService/
#: RayJob 6 less (GenerateRayClusterName appends a 6-character suffix).
MAX_NAME_LENGTH = {"RayCluster": 53, "RayService": 47, "RayJob": 47}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
UPGRADE_TYPES = ("NewCluster", "NewClusterWithIncrementalUpgrade", "None")
FT_ANNOTATION = "ray.io/ft-enabled"
EXTERNAL_STORAGE_ANNOTATION = "ray.io/external-storage-namespace"


def _ray_objects(inv: Inventory) -> list[Manifest]:
    return inv.of_kind(*RAY_KINDS)


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    """Container env as name -> literal value (None for valueFrom)."""
    out: dict[str, str | None] = {}
    env = container.get("env")
    if isinstance(env, list):
        for item in env:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                value = item.get("value")
                out[item["name"]] = None if value is None else str(value)
    return out


def _annotations(m: Manifest) -> dict[str, str]:
    meta = m.body.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, dict) else None
    return {str(k): str(v) for k, v in ann.items()} if isinstance(ann, dict) else {}


@rule("rayservice-head-service-name", versions={"kuberay": ">=1.3"})
def head_service_name(inv: Inventory) -> Iterator[Finding]:
    """RayService must not name its head service (the operator renames it per cluster).

    KubeRay checks this from 1.3: an error when the input names KubeRay >= 1.3, nothing when
    it names an older one, and a warning (the conservative wording) when it names none."""
    v = kuberay_version(inv)
    if v is not None and not v.at_least(KUBERAY_REJECTS_HEAD_SERVICE_NAME_FROM):
        return
    for m in inv.of_kind("RayService"):
        head = head_group(m)
        if head is None:
            continue
        svc = head.spec.get("headService")
        meta = svc.get("metadata") if isinstance(svc, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if name:
            path = f"{head.path}.headService.metadata.name"
            who = (
                f"{v.describe()} rejects the RayService"
                if v is not None
                else f"KubeRay {KUBERAY.newest} (assumed: the input names no operator version, "
                "and the schema check assumes the same release) rejects the RayService, as every "
                "release from 1.3 does (1.2 and older accept the name)"
            )
            yield Finding.at(
                "rayservice-head-service-name",
                "error" if v is not None else "warning",
                m,
                path,
                f"headService.metadata.name is set to {name!r}: {who} "
                '("spec.rayClusterConfig.headGroupSpec.headService.metadata.name should not be '
                'set") and creates no RayCluster; kubectl apply still succeeds.',
                f"Delete headService.metadata (or the whole headService block). KubeRay names the "
                f"services itself: {m.name}-head-svc and {m.name}-serve-svc stay stable across "
                "blue/green upgrades.",
            )


@rule("name-too-long", versions="all")
def name_too_long(inv: Inventory) -> Iterator[Finding]:
    """RayCluster <= 53 chars, RayService/RayJob <= 47, and a DNS-1035 label."""
    for m in _ray_objects(inv):
        if not m.name or m.name_is_template:
            continue  # generateName, or a placeholder filled in later: not the real name
        limit = MAX_NAME_LENGTH[m.kind]
        if len(m.name) > limit:
            yield Finding.at(
                "name-too-long",
                "error",
                m,
                "metadata.name",
                f"{m.kind} name {m.name!r} has {len(m.name)} characters: KubeRay rejects it "
                f'("{m.kind} name should be no more than {limit} characters"): '
                + (
                    "the pod and service names it derives must fit Kubernetes' 63."
                    if m.kind == "RayCluster"
                    else "it appends 6 characters to name the RayCluster, which must stay "
                    "within 53 so derived pod and service names fit Kubernetes' 63."
                ),
                f"Shorten metadata.name to at most {limit} characters.",
            )
        if not _DNS1035.match(m.name) or len(m.name) > 63:
            yield Finding.at(
                "name-too-long",
                "error",
                m,
                "metadata.name",
                f"{m.kind} name {m.name!r} is not a DNS-1035 label: KubeRay rejects it "
                f'("{m.kind} name should be a valid DNS1035 label"): lower-case letters, '
                "digits and '-', starting with a letter and ending with a letter or digit.",
                "Rename it, e.g. "
                + repr(re.sub(r"[^a-z0-9-]", "-", m.name.lower()).strip("-").lstrip("0123456789-"))
                + ".",
            )


def _int_field(spec: dict[str, Any], key: str) -> int | None:
    v = spec.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@rule("upgrade-strategy", versions="all")
def upgrade_strategy(inv: Inventory) -> Iterator[Finding]:
    """RayService upgradeStrategy type and incremental-upgrade options (ValidateRayServiceSpec)."""
    for m in inv.of_kind("RayService"):
        spec = m.body.get("spec")
        strategy = spec.get("upgradeStrategy") if isinstance(spec, dict) else None
        if not isinstance(strategy, dict):
            continue
        kind = strategy.get("type")
        base = "spec.upgradeStrategy"
        if kind is not None and kind not in UPGRADE_TYPES:
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{base}.type",
                f"upgradeStrategy.type {kind!r} is invalid: KubeRay rejects the RayService "
                f"(valid options are {', '.join(UPGRADE_TYPES)}).",
                "Use NewCluster (blue/green, the default), NewClusterWithIncrementalUpgrade, "
                "or None.",
            )
            continue
        if kind != "NewClusterWithIncrementalUpgrade":
            continue
        if not autoscaling_enabled(m):
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{base}.type",
                "NewClusterWithIncrementalUpgrade without enableInTreeAutoscaling: KubeRay "
                'rejects it ("Ray Autoscaler is required for NewClusterWithIncrementalUpgrade").',
                "Set spec.rayClusterConfig.enableInTreeAutoscaling: true, or use NewCluster.",
            )
        opts = strategy.get("clusterUpgradeOptions")
        opath = f"{base}.clusterUpgradeOptions"
        if not isinstance(opts, dict):
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                base,
                "NewClusterWithIncrementalUpgrade without clusterUpgradeOptions: KubeRay "
                'rejects it ("ClusterUpgradeOptions are required").',
                "Add clusterUpgradeOptions with maxSurgePercent, stepSizePercent, "
                "intervalSeconds and gatewayClassName.",
            )
            continue
        surge = _int_field(opts, "maxSurgePercent")
        step = _int_field(opts, "stepSizePercent")
        interval = _int_field(opts, "intervalSeconds")
        surge_eff = 100 if surge is None else surge  # KubeRay defaults it to 100
        if not 0 <= surge_eff <= 100:
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{opath}.maxSurgePercent",
                f"maxSurgePercent is {surge_eff}: KubeRay requires 0..100.",
                "Set maxSurgePercent between 0 and 100 (it defaults to 100).",
            )
        if step is None or not 0 <= step <= 100:
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{opath}.stepSizePercent",
                f"stepSizePercent is {'unset' if step is None else step}: KubeRay requires "
                "it, between 0 and 100.",
                "Set stepSizePercent, e.g. 10 (traffic moved per step).",
            )
        elif step > surge_eff:
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{opath}.stepSizePercent",
                f"stepSizePercent ({step}) > maxSurgePercent ({surge_eff}): a traffic step "
                "cannot move more than the new cluster's surge capacity can serve.",
                f"Lower stepSizePercent to at most {surge_eff}, or raise maxSurgePercent.",
            )
        if interval is None or interval <= 0:
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{opath}.intervalSeconds",
                f"intervalSeconds is {'unset' if interval is None else interval}: KubeRay "
                'requires it ("intervalSeconds must be greater than 0").',
                "Set intervalSeconds, e.g. 30.",
            )
        if not opts.get("gatewayClassName"):
            yield Finding.at(
                "upgrade-strategy",
                "error",
                m,
                f"{opath}.gatewayClassName",
                "gatewayClassName is not set: KubeRay rejects the RayService "
                '("gatewayClassName is required for NewClusterWithIncrementalUpgrade"); the '
                "incremental upgrade shifts traffic through a Gateway API HTTPRoute.",
                "Set gatewayClassName to the GatewayClass of your Gateway API implementation "
                "(e.g. istio).",
            )


def _autoscaler_v2(m: Manifest) -> tuple[bool, str]:
    """Whether KubeRay considers autoscaler v2 enabled (utils.IsAutoscalingV2Enabled).

    Only ``autoscalerOptions.version: v2`` counts there: the head env var
    RAY_enable_autoscaler_v2 switches Ray's autoscaler but not the operator's validation.
    """
    found = cluster_spec(m)
    if found is None:
        return False, ""
    spec, path = found
    opts = spec.get("autoscalerOptions")
    if isinstance(opts, dict) and opts.get("version") == "v2":
        return True, f"{path}.autoscalerOptions.version"
    return False, ""


@rule("autoscaler-v2-restart-policy", versions="all")
def autoscaler_v2_restart_policy(inv: Inventory) -> Iterator[Finding]:
    """Autoscaler v2: pods must have restartPolicy Never or unset (and v2 needs autoscaling)."""
    for m in _ray_objects(inv):
        found = cluster_spec(m)
        head = head_group(m)
        if found is None or head is None:
            continue
        spec, path = found
        enabled = autoscaling_enabled(m)
        env_value = _env(head.container).get("RAY_enable_autoscaler_v2")
        if not enabled and env_value in ("1", "true"):
            yield Finding.at(
                "autoscaler-v2-restart-policy",
                "error",
                m,
                f"{head.container_path}.env",
                f"RAY_enable_autoscaler_v2={env_value} while enableInTreeAutoscaling is false: "
                "KubeRay rejects the cluster (autoscaler v2 needs the in-tree autoscaler).",
                "Set enableInTreeAutoscaling: true, or remove the env var.",
            )
            continue
        if not enabled:
            continue
        opts = spec.get("autoscalerOptions")
        if isinstance(opts, dict) and opts.get("version") is not None and env_value is not None:
            yield Finding.at(
                "autoscaler-v2-restart-policy",
                "error",
                m,
                f"{path}.autoscalerOptions.version",
                "Both autoscalerOptions.version and the head env RAY_enable_autoscaler_v2 are "
                'set: KubeRay rejects the cluster ("please only use the former").',
                "Keep autoscalerOptions.version: v2 and remove RAY_enable_autoscaler_v2.",
            )
        v2, where = _autoscaler_v2(m)
        if not v2:
            continue
        for g in groups(m):
            policy = g.pod_spec.get("restartPolicy")
            if policy not in (None, "", "Never"):
                who = "head Pod" if g.is_head else f"worker group {g.name}"
                yield Finding.at(
                    "autoscaler-v2-restart-policy",
                    "error",
                    m,
                    f"{g.path}.template.spec.restartPolicy",
                    f"restartPolicy is {policy!r} with autoscaler v2 (enabled by {where}): "
                    f'KubeRay rejects the cluster ("restartPolicy for {who} should be Never or '
                    'unset when using autoscaler V2"); v2 replaces failed pods itself.',
                    "Remove restartPolicy (KubeRay sets Never) or set it to Never.",
                )


@rule("gcs-ft-conflict", versions="all")
def gcs_ft_conflict(inv: Inventory) -> Iterator[Finding]:
    """GCS fault tolerance configured two ways, or Redis set without enabling it."""
    for m in _ray_objects(inv):
        found = cluster_spec(m)
        head = head_group(m)
        if found is None or head is None:
            continue
        spec, path = found
        ann = _annotations(m)
        options = spec.get("gcsFaultToleranceOptions")
        has_options = options is not None
        env = _env(head.container)
        env_path = f"{head.container_path}.env"
        if ann.get(FT_ANNOTATION) and has_options:
            yield Finding.at(
                "gcs-ft-conflict",
                "error",
                m,
                f"{path}.gcsFaultToleranceOptions",
                f"The {FT_ANNOTATION} annotation ({ann[FT_ANNOTATION]!r}) and "
                "gcsFaultToleranceOptions are both set: KubeRay rejects the cluster "
                '("Please use only GcsFaultToleranceOptions to configure GCS fault tolerance").',
                f"Remove the {FT_ANNOTATION} annotation; keep gcsFaultToleranceOptions.",
            )
        ft_enabled = has_options or ann.get(FT_ANNOTATION) == "true"
        if not ft_enabled and "RAY_REDIS_ADDRESS" in env:
            yield Finding.at(
                "gcs-ft-conflict",
                "error",
                m,
                env_path,
                "RAY_REDIS_ADDRESS is set on the head, which implicitly enables GCS fault "
                "tolerance, but gcsFaultToleranceOptions is not: KubeRay rejects the cluster.",
                "Move the address to gcsFaultToleranceOptions.redisAddress (and the password to "
                "gcsFaultToleranceOptions.redisPassword).",
            )
        if has_options:
            conflicts = [
                (
                    "redis-password" in head.ray_start_params,
                    f"{head.path}.rayStartParams.redis-password",
                    "rayStartParams redis-password",
                    "gcsFaultToleranceOptions.redisPassword",
                ),
                (
                    "REDIS_PASSWORD" in env,
                    env_path,
                    "head env REDIS_PASSWORD",
                    "gcsFaultToleranceOptions.redisPassword",
                ),
                (
                    "RAY_REDIS_ADDRESS" in env,
                    env_path,
                    "head env RAY_REDIS_ADDRESS",
                    "gcsFaultToleranceOptions.redisAddress",
                ),
                (
                    EXTERNAL_STORAGE_ANNOTATION in ann,
                    "metadata.annotations",
                    f"annotation {EXTERNAL_STORAGE_ANNOTATION}",
                    "gcsFaultToleranceOptions.externalStorageNamespace",
                ),
            ]
            for present, where, what, instead in conflicts:
                if present:
                    yield Finding.at(
                        "gcs-ft-conflict",
                        "error",
                        m,
                        where,
                        f"{what} is set while gcsFaultToleranceOptions is enabled: KubeRay "
                        f"rejects the cluster (use {instead} instead).",
                        f"Remove {what}; set {instead}.",
                    )


@rule("deprecated-threshold", versions="all")
def deprecated_threshold(inv: Inventory) -> Iterator[Finding]:
    """serviceUnhealthySecondThreshold / deploymentUnhealthySecondThreshold are ignored."""
    for m in inv.of_kind("RayService"):
        spec = m.body.get("spec")
        if not isinstance(spec, dict):
            continue
        for key in ("serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold"):
            if key in spec:
                yield Finding.at(
                    "deprecated-threshold",
                    "info",
                    m,
                    f"spec.{key}",
                    f"{key}: {spec[key]} is deprecated and ignored by current KubeRay (1.7; "
                    '"This field is not used anymore", ray-project/kuberay#1685): the operator '
                    "no longer restarts clusters on these timers, so the setting neither "
                    "protects a slow model load nor cuts a hung one short.",
                    f"Delete {key}. For slow model loads, rely on Serve health checks "
                    "(health_check_period_s / health_check_timeout_s) and the "
                    "ray.io/initializing-timeout annotation.",
                )


@rule("replicas-min-gt-max", versions="all")
def replicas_min_gt_max(inv: Inventory) -> Iterator[Finding]:
    """Worker group replica bounds KubeRay rejects (negative, or min > max)."""
    for m in _ray_objects(inv):
        for g in worker_groups(m):
            # The CRD defaults minReplicas to 0 and maxReplicas to 2147483647, so an unset
            # bound never trips the controller; only explicit values are checked.
            lo, hi = g.min_replicas, g.max_replicas
            for key, val in (("minReplicas", lo), ("maxReplicas", hi), ("replicas", g.replicas)):
                if val is not None and val < 0:
                    yield Finding.at(
                        "replicas-min-gt-max",
                        "error",
                        m,
                        f"{g.path}.{key}",
                        f"{g.label} has negative {key} {val}: KubeRay rejects the cluster "
                        f'("worker group {g.name} has negative {key} {val}").',
                        f"Set {key} to 0 or more.",
                    )
            if lo is not None and hi is not None and lo > hi >= 0:
                yield Finding.at(
                    "replicas-min-gt-max",
                    "error",
                    m,
                    f"{g.path}.minReplicas",
                    f"{g.label} has minReplicas {lo} greater than maxReplicas {hi}: KubeRay "
                    f'rejects the cluster ("worker group {g.name} has minReplicas {lo} greater '
                    f'than maxReplicas {hi}").',
                    f"Set minReplicas <= maxReplicas (e.g. minReplicas: {hi}, or maxReplicas: "
                    f"{lo}).",
                )


@rule("resources-set-twice", versions={"kuberay": ">=1.4"})
def resources_set_twice(inv: Inventory) -> Iterator[Finding]:
    """rayStartParams resource fields and the group ``resources`` map both set."""
    for m in _ray_objects(inv):
        for g in groups(m):
            keys = ("num-cpus", "num-gpus", "memory", "resources")
            in_params = [k for k in keys if g.ray_start_params.get(k)]
            if in_params and g.group_resources:
                group = "Head" if g.is_head else g.name
                yield Finding.at(
                    "resources-set-twice",
                    "error",
                    m,
                    f"{g.path}.resources",
                    f"{g.label} sets {', '.join(in_params)} in rayStartParams and also the group "
                    f"resources map ({', '.join(sorted(g.group_resources))}): KubeRay rejects "
                    f'the cluster ("resource fields should not be set in both rayStartParams and '
                    f'Resources for {group} group; please use only one").',
                    f"Keep one: delete {', '.join(in_params)} from rayStartParams, or delete the "
                    "group-level resources map.",
                )
