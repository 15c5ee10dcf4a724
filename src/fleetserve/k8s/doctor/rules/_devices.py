"""GPU devices as the manifests describe them: pods, HAMi slices, card memory, tenants.

Design note: whether a slice fits, or two workloads may share a card, depends on facts spread
over several objects: the HAMi chart values (resource names, ``deviceMemoryScaling``,
scheduler switches), the pod's ``nvidia.com/gpu``/``gpumem``/``gpucores`` limits, and the card
behind the pod's node selector (a Karpenter NodePool requirement, a GPU feature-discovery
node label, an instance type, or a fleet spec pool). This module joins them once.

What must stay true: card memory is a *set of candidates* (a NodePool may allow several
instance types); rules that report "does not fit" compare against the LARGEST candidate, so
an unknown or ambiguous pool never produces a false positive. Unknown -> None -> no finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fleetserve.errors import SpecError
from fleetserve.k8s.doctor.inventory import HelmValues, Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import (
    LWS_KIND,
    RAY_KINDS,
    GroupView,
    groups,
    lws_size,
    pod_templates,
    try_quantity,
)
from fleetserve.k8s.doctor.rules._engines import container_engine, engine_replicas
from fleetserve.plan.gpus import gpu_type
from fleetserve.units import gib_to_mib_floor

# --------------------------------------------------------------------------- HAMi config


@dataclass(frozen=True)
class HamiConfig:
    """The HAMi chart settings that matter to workloads (chart defaults when no values)."""

    values: HelmValues | None
    resource_count: str = "nvidia.com/gpu"
    resource_mem: str = "nvidia.com/gpumem"
    resource_mem_percentage: str = "nvidia.com/gpumem-percentage"
    resource_cores: str = "nvidia.com/gpucores"
    scheduler_name: str = "hami-scheduler"
    kube_scheduler_enabled: bool = True
    webhook_enabled: bool = True
    force_overwrite_default_scheduler: bool = True
    device_memory_scaling: float = 1.0


def _bool(x: Any, default: bool) -> bool:
    if isinstance(x, bool):
        return x
    if isinstance(x, str) and x.lower() in ("true", "false"):
        return x.lower() == "true"
    return default


def hami_config(inv: Inventory) -> HamiConfig:
    """Settings from the (first) HAMi values document in the input, else the chart defaults."""
    found = inv.charts("hami")
    if not found:
        return HamiConfig(values=None)
    v = found[0]

    def s(path: str, default: str) -> str:
        val = v.get(path)
        return val if isinstance(val, str) and val else default

    scaling = try_quantity(v.get("devicePlugin.deviceMemoryScaling"))
    return HamiConfig(
        values=v,
        resource_count=s("resourceName", "nvidia.com/gpu"),
        resource_mem=s("resourceMem", "nvidia.com/gpumem"),
        resource_mem_percentage=s("resourceMemPercentage", "nvidia.com/gpumem-percentage"),
        resource_cores=s("resourceCores", "nvidia.com/gpucores"),
        scheduler_name=s("schedulerName", "hami-scheduler"),
        kube_scheduler_enabled=_bool(v.get("scheduler.kubeScheduler.enabled"), True),
        webhook_enabled=_bool(v.get("scheduler.admissionWebhook.enabled"), True),
        force_overwrite_default_scheduler=_bool(
            v.get("scheduler.forceOverwriteDefaultScheduler"), True
        ),
        device_memory_scaling=scaling if scaling and scaling > 0 else 1.0,
    )


# --------------------------------------------------------------------------- pods


@dataclass(frozen=True, eq=False)
class PodView:
    """One pod template of any workload (a Ray group, a Deployment, a bare Pod...)."""

    manifest: Manifest
    #: Field path of the pod ``spec``.
    path: str
    spec: dict[str, Any]
    #: Labels the pods will carry (template labels, plus KubeRay's for Ray groups).
    labels: dict[str, str]
    #: The Ray group, for RayService/RayCluster/RayJob pods.
    group: GroupView | None

    @property
    def label(self) -> str:
        """Human name: ``worker group 'gpu'`` / ``leader template`` / ``pod template``."""
        if self.group is not None:
            return self.group.label
        for key, name in (
            (".leaderTemplate.", "leader template"),
            (".workerTemplate.", "worker template"),
        ):
            if key in f"{self.path}.":
                return name  # a LeaderWorkerSet's two templates, told apart in messages
        return "pod template"

    def containers(self) -> list[tuple[dict[str, Any], str]]:
        """(container, field path) for init containers then containers."""
        out: list[tuple[dict[str, Any], str]] = []
        for key in ("initContainers", "containers"):
            items = self.spec.get(key)
            if isinstance(items, list):
                for i, c in enumerate(items):
                    if isinstance(c, dict):
                        out.append((c, f"{self.path}.{key}[{i}]"))
        return out

    def node_constraints(self) -> dict[str, set[str]]:
        """Node label key -> allowed values, from nodeSelector and required node affinity."""
        return node_constraints(self.spec)

    @property
    def hosts(self) -> int:
        """Pods one engine in this template spans: a LeaderWorkerSet leader's engine runs over
        its whole group (``size`` pods, joined by Ray); 1 otherwise."""
        if ".leaderTemplate." in f"{self.path}.":
            return lws_size(self.manifest)
        return 1

    def annotations(self) -> dict[str, str]:
        """The pod template's annotations (the Pod's own for a bare Pod)."""
        base = self.path[: -len(".spec")] if self.path.endswith(".spec") else ""
        meta = self.manifest.get(f"{base}.metadata" if base else "metadata")
        return _labels(meta.get("annotations")) if isinstance(meta, dict) else {}


def _labels(x: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in x.items()} if isinstance(x, dict) else {}


_WORKLOAD_KINDS = (
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "ReplicationController",
    LWS_KIND,
)


def pods(inv: Inventory) -> list[PodView]:
    """Every pod template in the input, in input order."""
    out: list[PodView] = []
    for m in inv.manifests:
        if m.kind in RAY_KINDS:
            for g in groups(m):
                tpl = g.spec.get("template")
                meta = tpl.get("metadata") if isinstance(tpl, dict) else None
                labels = _labels(meta.get("labels")) if isinstance(meta, dict) else {}
                labels.setdefault("ray.io/node-type", "head" if g.is_head else "worker")
                labels.setdefault("ray.io/group", "headgroup" if g.is_head else g.name)
                labels.setdefault("ray.io/is-ray-node", "yes")
                out.append(PodView(m, f"{g.path}.template.spec", g.pod_spec, labels, g))
            continue
        if m.kind not in _WORKLOAD_KINDS:
            continue  # e.g. a Karpenter NodePool also has spec.template.spec
        for spec, path in pod_templates(m):
            if m.kind == "Pod":
                labels = _labels(m.body.get("metadata", {}).get("labels"))
            else:
                tpl_path = path.rsplit(".spec", 1)[0]
                meta = m.get(f"{tpl_path}.metadata")
                labels = _labels(meta.get("labels")) if isinstance(meta, dict) else {}
            out.append(PodView(m, path, spec, labels, None))
    return out


def lws_worker(inv: Inventory, leader: PodView) -> PodView | None:
    """The worker template of the LeaderWorkerSet whose leader template is ``leader`` (LWS
    runs the leader template for the workers too when there is none); None for other pods."""
    if leader.hosts <= 1:
        return None
    for p in pods(inv):
        if p.manifest is leader.manifest and ".workerTemplate." in f"{p.path}.":
            return p
    return leader


def node_constraints(pod_spec: dict[str, Any]) -> dict[str, set[str]]:
    """Node label key -> allowed values (nodeSelector, and ``In`` terms of required affinity).

    Several nodeSelectorTerms are ORed: a key constrains only when every term constrains it.
    """
    out: dict[str, set[str]] = {}
    sel = pod_spec.get("nodeSelector")
    if isinstance(sel, dict):
        for k, v in sel.items():
            out[str(k)] = {str(v)}
    terms = (
        pod_spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
        if isinstance(pod_spec.get("affinity"), dict)
        else None
    )
    if isinstance(terms, list) and terms:
        per_term: list[dict[str, set[str]]] = []
        for term in terms:
            found: dict[str, set[str]] = {}
            exprs = term.get("matchExpressions") if isinstance(term, dict) else None
            for e in exprs if isinstance(exprs, list) else []:
                if isinstance(e, dict) and e.get("operator") == "In":
                    vals = e.get("values")
                    if isinstance(vals, list):
                        found[str(e.get("key"))] = {str(x) for x in vals}
            per_term.append(found)
        common = set.intersection(*(set(t) for t in per_term))
        for key in common:
            allowed = set().union(*(t[key] for t in per_term))
            out[key] = out[key] & allowed if key in out else allowed
    return out


# --------------------------------------------------------------------------- HAMi slices


@dataclass(frozen=True)
class Slice:
    """The GPU resources one container asks for, read as HAMi reads them."""

    #: ``nvidia.com/gpu``: physical cards to slice from (0 when absent).
    count: int
    #: ``nvidia.com/gpumem`` in MiB per card, when set.
    mem_mib: float | None
    #: ``nvidia.com/gpumem-percentage`` per card, when set.
    mem_percent: float | None
    #: ``nvidia.com/gpucores`` per card (percent of SMs), when set.
    cores: float | None

    @property
    def is_hami(self) -> bool:
        """True when a HAMi-only resource (memory or cores) is requested."""
        return self.mem_mib is not None or self.mem_percent is not None or self.cores is not None

    def memory_of(self, card_mib: float) -> float:
        """MiB this slice holds on a card of ``card_mib`` (whole card when unset)."""
        if self.mem_mib is not None:
            return self.mem_mib
        if self.mem_percent is not None:
            return card_mib * self.mem_percent / 100
        return card_mib


def container_slice(container: dict[str, Any], cfg: HamiConfig) -> Slice | None:
    """The container's GPU slice (limits, else requests), or None when it asks for no GPU."""
    res = container.get("resources")
    if not isinstance(res, dict):
        return None
    merged: dict[str, Any] = {}
    for key in ("requests", "limits"):  # limits win, as for extended resources
        table = res.get(key)
        if isinstance(table, dict):
            merged.update({str(k): v for k, v in table.items()})
    count = try_quantity(merged.get(cfg.resource_count))
    mem = try_quantity(merged.get(cfg.resource_mem))
    pct = try_quantity(merged.get(cfg.resource_mem_percentage))
    cores = try_quantity(merged.get(cfg.resource_cores))
    if count is None and mem is None and pct is None and cores is None:
        return None
    # HAMi's webhook gives a container with memory/cores but no count one card (defaultGPUNum).
    n = int(count) if count is not None else 1
    return Slice(count=n, mem_mib=mem, mem_percent=pct, cores=cores)


def hami_in_use(inv: Inventory, cfg: HamiConfig) -> bool:
    """HAMi is evidently installed: its values, a HAMi-only resource, or its scheduler name."""
    if cfg.values is not None:
        return True
    for pod in pods(inv):
        if pod.spec.get("schedulerName") == cfg.scheduler_name:
            return True
        for c, _ in pod.containers():
            s = container_slice(c, cfg)
            if s is not None and s.is_hami:
                return True
    return False


# --------------------------------------------------------------------------- card memory

#: GPU names that do not identify one memory size (Karpenter ``instance-gpu-name: a100`` is
#: both p4d's 40 GB and p4de's 80 GB card).
_AMBIGUOUS: dict[str, tuple[float, ...]] = {
    "a100": (40960, 81920),
    "v100": (16384, 32768),
    "tesla-v100": (16384, 32768),
    "nvidia-tesla-a100": (40960,),  # GKE: the 40 GB A100
    "nvidia-tesla-v100": (16384,),
    "t4g": (15360,),
}
#: Cloud instance families -> memory (MiB) of their card.
_INSTANCE_FAMILIES: dict[str, tuple[float, ...]] = {
    "g4dn": (15360,),
    "g5": (23028,),
    "g5g": (15360,),
    "g6": (23034,),
    "gr6": (23034,),
    "g6e": (46068,),
    "p3": (16384,),
    "p3dn": (32768,),
    "p4d": (40960,),
    "p4de": (81920,),
    "p5": (81559,),
    "p5e": (143771,),
    "p5en": (143771,),
    "a2-highgpu": (40960,),
    "a2-megagpu": (40960,),
    "a2-ultragpu": (81920,),
    "a3-highgpu": (81559,),
    "a3-megagpu": (81559,),
    "g2-standard": (23034,),
}
_NAME_KEYS = (
    "nvidia.com/gpu.product",
    "karpenter.k8s.aws/instance-gpu-name",
    "cloud.google.com/gke-accelerator",
    "gpu-type",
    "accelerator-type",
)
_MIB_KEYS = ("nvidia.com/gpu.memory", "karpenter.k8s.aws/instance-gpu-memory")
_TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


def memory_of_gpu_name(name: str) -> tuple[float, ...]:
    """Candidate memory sizes (MiB) of a GPU named as node labels name it; () if unknown."""
    low = name.strip().lower()
    if low in _AMBIGUOUS:
        return _AMBIGUOUS[low]
    stripped = re.sub(r"^(nvidia-)?(tesla-)?", "", low)
    if stripped in _AMBIGUOUS:
        return _AMBIGUOUS[stripped]
    for probe in (name, stripped):
        try:
            return (float(gpu_type(probe).memory_mib),)
        except SpecError:  # not in the catalogue
            continue
    # An unknown product that names its size ("NVIDIA-L20-48GB"): marketing GB read as GiB,
    # an over-estimate, which is the safe side for "does not fit" checks.
    size = re.search(r"(\d+)\s*gb", low)
    if size:
        return (float(size.group(1)) * 1024,)
    return ()


def _memory_from_labels(constraints: dict[str, set[str]]) -> tuple[tuple[float, ...], str] | None:
    for key in _MIB_KEYS:
        if key in constraints:
            vals = [try_quantity(v) for v in constraints[key]]
            mibs = tuple(v for v in vals if v)
            if mibs:
                return mibs, f"{key} in {sorted(constraints[key])}"
    for key in _NAME_KEYS:
        if key in constraints:
            mibs_l: list[float] = []
            for v in sorted(constraints[key]):
                found = memory_of_gpu_name(v)
                if not found:
                    return None  # one unknown card makes the whole set unknown
                mibs_l.extend(found)
            return tuple(mibs_l), f"{key} in {sorted(constraints[key])}"
    for key in _TYPE_KEYS:
        if key in constraints:
            mibs_l = []
            for v in sorted(constraints[key]):
                family = v.split(".")[0]
                if family not in _INSTANCE_FAMILIES:
                    family = "-".join(v.split("-")[:2])
                found = _INSTANCE_FAMILIES.get(family, ())
                if not found:
                    return None
                mibs_l.extend(found)
            return tuple(mibs_l), f"{key} in {sorted(constraints[key])}"
    return None


def nodepool_constraints(pool: Manifest) -> dict[str, set[str]]:
    """Labels a Karpenter NodePool's nodes carry: template labels and ``In`` requirements."""
    out: dict[str, set[str]] = {"karpenter.sh/nodepool": {pool.name}}
    labels = pool.get("spec.template.metadata.labels")
    if isinstance(labels, dict):
        for k, v in labels.items():
            out[str(k)] = {str(v)}
    reqs = pool.get("spec.template.spec.requirements")
    for r in reqs if isinstance(reqs, list) else []:
        if isinstance(r, dict) and r.get("operator") == "In" and isinstance(r.get("values"), list):
            out[str(r.get("key"))] = {str(x) for x in r["values"]}
    return out


def _compatible(want: dict[str, set[str]], have: dict[str, set[str]]) -> bool:
    """A pod's constraints can be met by nodes with label sets ``have``."""
    return all(key in have and want[key] & have[key] for key in want)


@dataclass(frozen=True)
class CardMemory:
    """The card(s) a pod may land on: candidate memory sizes (MiB) and where that came from."""

    candidates: tuple[float, ...]
    source: str

    @property
    def largest(self) -> float:
        return max(self.candidates)


#: HAMi's pod annotation restricting the card types a pod may be given (comma-separated
#: names, matched against the device's type: HAMi docs, "Specify GPU type").
HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
#: Ray's resource naming the accelerator of a node (``accelerator_type:A10G``).
RAY_ACCELERATOR_PREFIX = "accelerator_type:"


def _declared_card(pod: PodView) -> CardMemory | None:
    """The card a pod asks for by type: HAMi's ``nvidia.com/use-gputype`` annotation, or a
    Ray group that advertises ``accelerator_type:<T>`` as written in the manifest (a custom
    resource Ray's scheduler matches, so replicas pinned by it land on that card)."""
    wanted = pod.annotations().get(HAMI_USE_GPUTYPE, "")
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    source = f"HAMi annotation {HAMI_USE_GPUTYPE}: {wanted}"
    if not names and pod.group is not None:
        names = [
            k.removeprefix(RAY_ACCELERATOR_PREFIX)
            for k in pod.group.advertised
            if k.startswith(RAY_ACCELERATOR_PREFIX)
        ]
        source = "Ray resource " + ", ".join(RAY_ACCELERATOR_PREFIX + n for n in names)
    mibs: list[float] = []
    for name in names:
        found = memory_of_gpu_name(name)
        if not found:
            return None  # a type we cannot size: no single answer, so none
        mibs.extend(found)
    return CardMemory(tuple(mibs), source) if mibs else None


def card_of_type(name: str | None, source: str) -> CardMemory | None:
    """The memory of a card named by type (Ray Serve LLM's ``accelerator_type: L4``)."""
    mibs = memory_of_gpu_name(name) if name else ()
    return CardMemory(tuple(mibs), source) if mibs else None


def card_memory(pod: PodView, inv: Inventory) -> CardMemory | None:
    """Memory of the card behind ``pod``: its node selector, the card type it asks for (HAMi's
    use-gputype, Ray's accelerator_type), the NodePools it may land on, or fleet pools."""
    want = pod.node_constraints()
    direct = _memory_from_labels(want)
    if direct is not None:
        return CardMemory(direct[0], f"node selector {direct[1]}")
    declared = _declared_card(pod)
    if declared is not None:
        return declared
    if not want:
        return None  # could land on any node: no single card to reason about
    cands: list[float] = []
    sources: list[str] = []
    for pool in inv.of_kind("NodePool"):
        have = nodepool_constraints(pool)
        if not _compatible(want, have):
            continue
        found = _memory_from_labels(have)
        if found is None:
            return None
        cands.extend(found[0])
        sources.append(f"NodePool/{pool.name} ({found[1]})")
    for fleet in inv.fleets:
        for p in fleet.spec.pools:
            if p.gpu is None or not all(p.labels.get(k) in v for k, v in want.items()):
                continue
            if p.gpu.memory_gb is not None:
                cands.append(gib_to_mib_floor(p.gpu.memory_gb))  # the spec's GiB, as a card
            elif p.gpu.type is not None:
                mib = memory_of_gpu_name(p.gpu.type)
                if not mib:
                    return None
                cands.extend(mib)
            sources.append(f"pool {p.name!r} of {fleet.file}")
    if not cands:
        return None
    return CardMemory(tuple(cands), ", ".join(sources))


def may_share_nodes(a: PodView, b: PodView) -> bool:
    """False only when the node selectors prove the two pods land on different nodes."""
    ca, cb = a.node_constraints(), b.node_constraints()
    return all(not (key in cb and not ca[key] & cb[key]) for key in ca)


# --------------------------------------------------------------------------- tenants

_TENANT_KEYS = ("fleetserve.io/tenant", "tenant", "app.kubernetes.io/tenant")


def tenant_of(pod: PodView) -> tuple[str, str] | None:
    """(tenant, where it was read) from the pod's labels, the object's labels or annotations,
    or - for a Ray worker group - the tenant of the Serve replicas pinned to it (fleetserve's
    app carries its fleet spec; a replica is pinned to the groups advertising its custom
    resources)."""
    if pod.group is not None and not pod.group.is_head:
        custom = {k for k in pod.group.advertised if k not in ("CPU", "GPU", "memory")}
        tenants = {
            (r.tenant, r.name)
            for r in engine_replicas(pod.manifest)
            if r.tenant is not None and custom & set(r.pins)
        }
        if len({t for t, _ in tenants}) == 1:
            tenant, name = sorted(tenants)[0]
            return tenant, f"the fleet spec's tenant of Serve replica {name!r}"
    meta = pod.manifest.body.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    for where, table in (
        ("pod label", pod.labels),
        ("label", _labels(meta.get("labels"))),
        ("annotation", _labels(meta.get("annotations"))),
    ):
        for key in _TENANT_KEYS:
            if table.get(key):
                return table[key], f"{where} {key}"
        for key, value in sorted(table.items()):
            if key.endswith("/tenant") and value:
                return value, f"{where} {key}"
    return None


def server_engines(
    inv: Inventory,
) -> Iterator[tuple[PodView, dict[str, Any], str, dict[str, Any], dict[str, str]]]:
    """(pod, container, its path, engine args, their paths) of plain vLLM server containers
    (``vllm serve`` in a Deployment/StatefulSet/Pod, not Ray)."""
    for pod in pods(inv):
        if pod.group is not None:
            continue
        for c, path in pod.containers():
            engine, paths = container_engine(c, path)
            if engine:
                yield pod, c, path, engine, paths
