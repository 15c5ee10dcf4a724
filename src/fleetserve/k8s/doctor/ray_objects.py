"""Shared views over KubeRay objects (RayService, RayCluster, RayJob) for the rules.

Design note: a Ray node group is seen by two schedulers. Kubernetes sees the pod's container
``resources`` (requests/limits); Ray sees what ``ray start`` advertises, which KubeRay derives:
``num-cpus`` from rayStartParams, else the group-level ``resources`` map, else the ray
container's CPU limit, else its request, rounded UP to an integer (``Quantity.Value()``);
``num-gpus`` from the first limit named ``*gpu`` (``nvidia.com/gpu``, ``amd.com/gpu``, MIG
slices), ``TPU``/``neuron_cores`` from ``google.com/tpu``/``aws.amazon.com/neuroncore``, and
what Ray detects by itself (Neuron devices, Intel GPUs, Gaudi ``HPU``); ``memory`` from the
memory limit in bytes; custom resources from the ``resources`` JSON in rayStartParams.
:func:`groups` computes both views once so every rule agrees on them. The ray container is
the pod's first container (KubeRay's ``RayContainerIndex`` is 0).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from fleetserve.k8s.doctor.inventory import Manifest

RAY_KINDS = ("RayService", "RayCluster", "RayJob")

_SUFFIX: dict[str, float] = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)


def parse_quantity(q: str | int | float) -> float:
    """A Kubernetes quantity (``"500m"``, ``"4"``, ``"16Gi"``, ``2``) as a float.

    Raises ValueError for anything that is not a quantity (rules skip such values; schema
    validation reports them).
    """
    if isinstance(q, bool):
        raise ValueError(f"not a quantity: {q!r}")
    if isinstance(q, int | float):
        return float(q)
    m = _QUANTITY.match(str(q).strip())
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def as_dict(x: Any) -> dict[str, Any]:
    """``x`` when it is a mapping, else ``{}`` (rules read untrusted YAML defensively)."""
    return x if isinstance(x, dict) else {}


def as_list(x: Any) -> list[Any]:
    """``x`` when it is a list, else ``[]``."""
    return x if isinstance(x, list) else []


def try_quantity(q: Any) -> float | None:
    """:func:`parse_quantity`, or None when ``q`` is missing or malformed."""
    if q is None:
        return None
    try:
        return parse_quantity(q)
    except ValueError:
        return None


def fmt_num(x: float) -> str:
    """Numbers in messages: ``4`` not ``4.0``, ``0.5`` stays."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True, eq=False)
class GroupView:
    """The head group or one worker group, as both Kubernetes and Ray see it."""

    manifest: Manifest
    #: ``head`` or the worker ``groupName``.
    name: str
    #: Field path of the group spec, e.g. ``spec.rayClusterConfig.workerGroupSpecs[0]``.
    path: str
    is_head: bool
    #: The group's spec dict (headGroupSpec or one workerGroupSpecs item).
    spec: dict[str, Any]
    #: rayStartParams, values as strings.
    ray_start_params: dict[str, str]
    #: The ray container (first container of the pod template), ``{}`` when absent.
    container: dict[str, Any]
    #: Index of the ray container in ``containers``.
    container_index: int
    #: The pod template's ``spec``.
    pod_spec: dict[str, Any]
    #: Container limits / requests as written (strings).
    limits: dict[str, str]
    requests: dict[str, str]
    #: The group-level ``resources`` map (KubeRay >= 1.4), ``{}`` when absent.
    group_resources: dict[str, str]
    #: What Ray will see on one pod of this group: ``CPU``, ``GPU``, ``memory`` (bytes) and
    #: custom resources. A key is absent when Ray would auto-detect it (unknown here).
    advertised: dict[str, float]
    #: Where each advertised value came from, e.g. ``{"CPU": "limits.cpu"}``.
    advertised_from: dict[str, str]
    #: Resources Ray detects in the pod in an amount the manifest does not say (``neuron_cores``
    #: of ``aws.amazon.com/neuron`` devices; ``prefix*`` for ``accelerator_type:*``, ``TPU-*``).
    auto_detected: frozenset[str]
    replicas: int | None
    min_replicas: int | None
    max_replicas: int | None

    @property
    def container_path(self) -> str:
        """Field path of the ray container."""
        return f"{self.path}.template.spec.containers[{self.container_index}]"

    @property
    def label(self) -> str:
        """Human name for messages: ``head group`` or ``worker group 'gpu'``."""
        return "head group" if self.is_head else f"worker group {self.name!r}"

    @property
    def gpus_per_pod(self) -> float:
        """GPUs one pod gets, as Ray sees it (0 when none)."""
        return self.advertised.get("GPU", 0.0)


def cluster_spec(m: Manifest) -> tuple[dict[str, Any], str] | None:
    """The RayCluster spec inside a RayService/RayCluster/RayJob and its field path."""
    spec = m.body.get("spec")
    if not isinstance(spec, dict):
        return None
    if m.kind == "RayCluster":
        return spec, "spec"
    key = {"RayService": "rayClusterConfig", "RayJob": "rayClusterSpec"}.get(m.kind)
    if key is None:
        return None
    inner = spec.get(key)
    if not isinstance(inner, dict):
        return None
    return inner, f"spec.{key}"


def _str_map(x: Any) -> dict[str, str]:
    if not isinstance(x, dict):
        return {}
    return {str(k): _scalar_str(v) for k, v in x.items()}


def _scalar_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def custom_resources(params: dict[str, str]) -> dict[str, float] | None:
    """The ``resources`` JSON of rayStartParams (KubeRay writes it quoted: ``'"{...}"'``)."""
    raw = params.get("resources")
    if raw is None:
        return None
    text = raw.strip()
    # KubeRay examples quote the JSON for the shell: '"{\"TPU\": 4}"' or "'{...}'".
    for quote in ('"', "'"):
        if len(text) >= 2 and text[0] == quote and text[-1] == quote:
            text = text[1:-1].replace('\\"', '"')
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    out: dict[str, float] = {}
    for k, v in parsed.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[str(k)] = float(v)
    return out


_MIG = re.compile(r"nvidia\.com/mig-\d+g\.\d+gb$")


def is_gpu_resource(name: str) -> bool:
    """KubeRay's ``IsGPUResourceKey``: a limit whose name ends in ``gpu`` (``nvidia.com/gpu``,
    ``amd.com/gpu``) or an NVIDIA MIG slice (``nvidia.com/mig-2g.32gb``) is Ray's ``GPU``."""
    return name.endswith("gpu") or bool(_MIG.search(name))


#: KubeRay 1.7's ``customAcceleratorToRayResourceMap`` (common/pod.go): container limits it
#: turns into a custom Ray resource in ``--resources``; only the first one (sorted) is added,
#: and none when rayStartParams already names one of these Ray resources.
KUBERAY_ACCELERATORS: dict[str, str] = {
    "aws.amazon.com/neuroncore": "neuron_cores",
    "google.com/tpu": "TPU",
}
#: Devices KubeRay leaves alone but Ray's accelerator managers detect inside the pod
#: (ray/_private/accelerators): limit -> the Ray resource. The count Ray finds is not written
#: (Neuron devices hold 2+ cores each; Intel GPUs need the oneAPI runtime in the image), so
#: the amount is unknown: rules assume it fits rather than guess.
RAY_DETECTED: dict[str, str] = {
    "aws.amazon.com/neuron": "neuron_cores",
    "aws.amazon.com/neurondevice": "neuron_cores",
    "gpu.intel.com/i915": "GPU",
    "gpu.intel.com/xe": "GPU",
}
#: Devices Ray detects one for one (the HPU manager counts the Gaudi cards the pod sees).
RAY_DETECTED_COUNT: dict[str, str] = {"habana.ai/gaudi": "HPU"}
#: Resources Ray adds by itself on top of the accelerators: ``accelerator_type:<type>``
#: everywhere, and on TPU hosts ``TPU-<pod type>-head`` (worker 0) and the slice name.
AUTO_EXTRA_PREFIXES = ("accelerator_type:",)
TPU_EXTRA_PREFIXES = ("TPU-",)


def is_accelerator_resource(name: str) -> bool:
    """A container resource that is an accelerator device: a GPU (any vendor, MIG, HAMi
    ``gpumem``), a TPU, AWS Neuron devices/cores, Intel Gaudi or Intel GPUs."""
    return (
        is_gpu_resource(name)
        or "gpumem" in name
        or name in KUBERAY_ACCELERATORS
        or name in RAY_DETECTED
        or name in RAY_DETECTED_COUNT
        or name.startswith(("gpu.intel.com/", "habana.ai/", "aws.amazon.com/neuron"))
    )


def accelerator_family(group: GroupView) -> str | None:
    """The group's accelerator in words (``NVIDIA GPU``, ``TPU``...), or None for CPU pods."""
    for name in sorted(group.limits):
        low = name.lower()
        if try_quantity(group.limits[name]) in (None, 0.0):
            continue
        if low.startswith("nvidia.com/"):
            return "NVIDIA GPU"
        if low == "amd.com/gpu":
            return "AMD GPU"
        if low.startswith("gpu.intel.com/"):
            return "Intel GPU"
        if low == "google.com/tpu":
            return "TPU"
        if low.startswith("aws.amazon.com/neuron"):
            return "AWS Neuron"
        if low.startswith("habana.ai/"):
            return "Intel Gaudi"
        if is_gpu_resource(low):
            return "GPU"
    return None


def _advertised(
    params: dict[str, str],
    group_res: dict[str, str],
    limits: dict[str, str],
    requests: dict[str, str],
) -> tuple[dict[str, float], dict[str, str], frozenset[str]]:
    # Mirrors KubeRay 1.7 (common/pod.go): the group ``resources`` map overrides
    # rayStartParams (updateRayStartParamsResources); else rayStartParams as written; else
    # num-cpus = ceil(limits.cpu) or ceil(requests.cpu), memory = limits.memory,
    # num-gpus = the first limit (sorted) that IsGPUResourceKey, and the first TPU/Neuron-core
    # limit as a custom resource (addWellKnownAcceleratorResources). Then what Ray itself
    # detects in the pod (Neuron devices, Intel GPUs, Gaudi), unknown amounts kept apart.
    adv: dict[str, float] = {}
    src: dict[str, str] = {}
    unknown: set[str] = set()

    def put(key: str, value: float, origin: str) -> None:
        adv[key] = value
        src[key] = origin

    for key, raw in group_res.items():
        amount = try_quantity(raw)
        if amount is None:
            continue
        low = key.lower()
        if low == "cpu":
            put("CPU", float(math.ceil(amount)), f"resources.{key}")
        elif low == "memory":
            put("memory", amount, f"resources.{key}")
        elif is_gpu_resource(low):
            put("GPU", float(math.ceil(amount)), f"resources.{key}")
        else:
            put(key, amount, f"resources.{key}")

    for ray_key, param in (("CPU", "num-cpus"), ("GPU", "num-gpus"), ("memory", "memory")):
        val = try_quantity(params.get(param))
        if ray_key not in adv and val is not None:
            put(ray_key, val, f"rayStartParams.{param}")
    for key, amount in (custom_resources(params) or {}).items():
        if key not in adv:
            put(key, amount, "rayStartParams.resources")

    if "CPU" not in adv:
        for where, table in (("limits", limits), ("requests", requests)):
            val = try_quantity(table.get("cpu"))
            if val is not None and val > 0:
                put("CPU", float(math.ceil(val)), f"{where}.cpu")
                break
    if "memory" not in adv:
        val = try_quantity(limits.get("memory"))
        if val is not None and val > 0:
            put("memory", val, "limits.memory")
    custom_added = any(r in adv for r in KUBERAY_ACCELERATORS.values())
    for name in sorted(limits):
        val = try_quantity(limits[name])
        if val is None or val <= 0:
            continue
        if "GPU" not in adv and is_gpu_resource(name):
            put("GPU", float(math.ceil(val)), f"limits.{name}")
        ray_name = KUBERAY_ACCELERATORS.get(name)
        if ray_name is not None and not custom_added:
            custom_added = True
            if ray_name not in adv:
                put(ray_name, val, f"limits.{name}")
        detected = RAY_DETECTED.get(name)
        if detected is not None and detected not in adv:
            unknown.add(detected)
        counted = RAY_DETECTED_COUNT.get(name)
        if counted is not None and counted not in adv:
            put(counted, float(math.floor(val)), f"limits.{name} (Ray detects each card)")
    unknown.update(f"{p}*" for p in AUTO_EXTRA_PREFIXES)
    if "TPU" in adv or "google.com/tpu" in limits:
        unknown.update(f"{p}*" for p in TPU_EXTRA_PREFIXES)
    return adv, src, frozenset(unknown)


def is_unknown(key: str, unknown: frozenset[str]) -> bool:
    """Whether Ray may advertise ``key`` in an amount the manifest does not say."""
    if key in unknown:
        return True
    return any(p.endswith("*") and key.startswith(p[:-1]) for p in unknown)


def _group(m: Manifest, spec: dict[str, Any], path: str, name: str, is_head: bool) -> GroupView:
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    assert isinstance(template, dict)
    pod_spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    assert isinstance(pod_spec, dict)
    containers = pod_spec.get("containers")
    container: dict[str, Any] = {}
    if isinstance(containers, list) and containers and isinstance(containers[0], dict):
        container = containers[0]
    res = container.get("resources") if isinstance(container.get("resources"), dict) else {}
    assert isinstance(res, dict)
    limits = _str_map(res.get("limits"))
    requests = _str_map(res.get("requests"))
    params = _str_map(spec.get("rayStartParams"))
    group_res = _str_map(spec.get("resources"))
    adv, src, unknown = _advertised(params, group_res, limits, requests)
    return GroupView(
        manifest=m,
        name=name,
        path=path,
        is_head=is_head,
        spec=spec,
        ray_start_params=params,
        container=container,
        container_index=0,
        pod_spec=pod_spec,
        limits=limits,
        requests=requests,
        group_resources=group_res,
        advertised=adv,
        advertised_from=src,
        auto_detected=unknown,
        replicas=_int_or_none(spec.get("replicas")),
        min_replicas=_int_or_none(spec.get("minReplicas")),
        max_replicas=_int_or_none(spec.get("maxReplicas")),
    )


def head_group(m: Manifest) -> GroupView | None:
    """The head group of a Ray object, or None."""
    found = cluster_spec(m)
    if found is None:
        return None
    spec, path = found
    head = spec.get("headGroupSpec")
    if not isinstance(head, dict):
        return None
    return _group(m, head, f"{path}.headGroupSpec", "head", True)


def worker_groups(m: Manifest) -> list[GroupView]:
    """The worker groups of a Ray object (in order), skipping malformed items."""
    found = cluster_spec(m)
    if found is None:
        return []
    spec, path = found
    workers = spec.get("workerGroupSpecs")
    out: list[GroupView] = []
    if isinstance(workers, list):
        for i, w in enumerate(workers):
            if isinstance(w, dict):
                name = str(w.get("groupName", f"#{i}"))
                out.append(_group(m, w, f"{path}.workerGroupSpecs[{i}]", name, False))
    return out


def groups(m: Manifest) -> list[GroupView]:
    """Head group (first, when present) then worker groups."""
    head = head_group(m)
    return ([head] if head else []) + worker_groups(m)


def autoscaling_enabled(m: Manifest) -> bool:
    """``enableInTreeAutoscaling`` of the cluster spec."""
    found = cluster_spec(m)
    return bool(found and found[0].get("enableInTreeAutoscaling") is True)


def serve_config(m: Manifest) -> tuple[dict[str, Any], str] | None:
    """The parsed ``serveConfigV2`` (a YAML string) of a RayService, and its field path.

    None when absent or not parseable (schema/serve rules report unparseable configs).
    """
    if m.kind != "RayService":
        return None
    spec = m.body.get("spec")
    if not isinstance(spec, dict):
        return None
    raw = spec.get("serveConfigV2")
    if isinstance(raw, dict):
        return raw, "spec.serveConfigV2"
    if not isinstance(raw, str):
        return None
    try:
        parsed = yaml.safe_load(raw)
    except yaml.YAMLError:
        return None
    if not isinstance(parsed, dict):
        return None
    return parsed, "spec.serveConfigV2"


@dataclass(frozen=True, eq=False)
class ServeDeployment:
    """One ``deployments[]`` item of a Serve application, as written."""

    #: ``app/deployment`` (``#j`` when unnamed).
    name: str
    #: Field path, e.g. ``spec.serveConfigV2:applications[0].deployments[1]``.
    path: str
    #: Position in the application's ``deployments`` list.
    index: int
    body: dict[str, Any]


@dataclass(frozen=True, eq=False)
class ServeApp:
    """One application of a RayService's Serve config, as written."""

    #: ``name`` (``#i`` when unnamed).
    name: str
    #: Field path, e.g. ``spec.serveConfigV2:applications[0]``.
    path: str
    body: dict[str, Any]
    #: Its ``deployments`` items that are mappings, in order.
    deployments: tuple[ServeDeployment, ...]

    @property
    def import_path(self) -> str:
        """``import_path`` ("" when absent)."""
        return str(self.body.get("import_path", ""))

    @property
    def is_serve_llm(self) -> bool:
        """A Ray Serve LLM builder app (its deployments come from ``args.llm_configs``)."""
        return "serve.llm" in self.import_path or "build_openai_app" in self.import_path


def serve_apps(m: Manifest) -> list[ServeApp]:
    """The one walk over a RayService's Serve applications and their deployments.

    Every rule that reads the Serve config starts here, so names (``app/deployment``, ``#i``
    for unnamed items) and field paths are the same in every finding.
    """
    found = serve_config(m)
    if found is None:
        return []
    cfg, root = found
    apps = cfg.get("applications")
    out: list[ServeApp] = []
    for i, app in enumerate(apps if isinstance(apps, list) else []):
        if not isinstance(app, dict):
            continue
        name = str(app.get("name", f"#{i}"))
        path = f"{root}:applications[{i}]"
        deps = app.get("deployments")
        items = tuple(
            ServeDeployment(f"{name}/{d.get('name', f'#{j}')}", f"{path}.deployments[{j}]", j, d)
            for j, d in enumerate(deps if isinstance(deps, list) else [])
            if isinstance(d, dict)
        )
        out.append(ServeApp(name, path, app, items))
    return out


def env_value(m: Manifest, name: str) -> tuple[str, str] | None:
    """(value, where) of env var ``name`` as a Ray job's driver sees it: the RayJob's
    ``runtimeEnvYAML`` env_vars, else a literal in the head container's env."""
    raw = m.get("spec.runtimeEnvYAML") if m.kind == "RayJob" else None
    if isinstance(raw, str):
        try:
            parsed = yaml.safe_load(raw)
        except yaml.YAMLError:
            parsed = None
        env = as_dict(as_dict(parsed).get("env_vars"))
        if name in env and env[name] is not None:
            return _scalar_str(env[name]), "spec.runtimeEnvYAML env_vars"
    head = head_group(m)
    for e in as_list(head.container.get("env")) if head else []:
        if isinstance(e, dict) and e.get("name") == name and e.get("value") is not None:
            assert head is not None
            return _scalar_str(e["value"]), f"the head container's env ({head.path})"
    return None


#: LeaderWorkerSet (kubernetes-sigs/lws): multi-node inference groups, vLLM's multi-host form.
LWS_KIND = "LeaderWorkerSet"


def lws_size(m: Manifest) -> int:
    """Pods in one LeaderWorkerSet group (``leaderWorkerTemplate.size``, default 1); 1 for
    any other kind."""
    if m.kind != LWS_KIND:
        return 1
    size = m.get("spec.leaderWorkerTemplate.size", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1


def pod_templates(m: Manifest) -> list[tuple[dict[str, Any], str]]:
    """Pod specs of any workload kind with their field paths (Ray groups, Deployment, Job...)."""
    if m.kind in RAY_KINDS:
        return [(g.pod_spec, f"{g.path}.template.spec") for g in groups(m)]
    spec = m.body.get("spec")
    if not isinstance(spec, dict):
        return []
    if m.kind == "Pod":
        return [(spec, "spec")]
    if m.kind == "CronJob":
        tpl = spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
        return [(tpl, "spec.jobTemplate.spec.template.spec")] if isinstance(tpl, dict) else []
    if m.kind == LWS_KIND:
        # A LeaderWorkerSet's group: one leader pod and size - 1 workers (the worker template
        # defaults to the leader's when absent, as the LWS controller does).
        lwt = spec.get("leaderWorkerTemplate")
        out: list[tuple[dict[str, Any], str]] = []
        for key in ("leaderTemplate", "workerTemplate"):
            tpl = lwt.get(key) if isinstance(lwt, dict) else None
            if isinstance(tpl, dict) and isinstance(tpl.get("spec"), dict):
                out.append((tpl["spec"], f"spec.leaderWorkerTemplate.{key}.spec"))
        return out
    tpl = spec.get("template")
    if isinstance(tpl, dict) and isinstance(tpl.get("spec"), dict):
        return [(tpl["spec"], "spec.template.spec")]
    return []
