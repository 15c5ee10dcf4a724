"""Scheduling facts, Kubernetes layer: node pools and the pods that must land on them.

Design note: a node pool (Karpenter NodePool, Node, or fleet-spec pool) answers, per label key,
"which values can a node have": template labels and ``karpenter.sh/nodepool`` exactly,
requirements as sets, Karpenter's well-known labels as any value, anything else as absent. A
pod's nodeSelector and required node affinity are matched against that, then its tolerations
against the pool's taints, as the scheduler does.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import (
    RAY_KINDS,
    as_dict,
    as_list,
    groups,
    is_accelerator_resource,
    pod_templates,
    try_quantity,
)

# --------------------------------------------------------------------------------------------
# Kubernetes layer: node pools, selectors, taints
# --------------------------------------------------------------------------------------------

#: Label prefixes Karpenter (and clouds) know values for without the NodePool declaring them.
_WELL_KNOWN_PREFIXES = (
    "kubernetes.io/",
    "node.kubernetes.io/",
    "topology.kubernetes.io/",
    "beta.kubernetes.io/",
    "failure-domain.beta.kubernetes.io/",
    "karpenter.sh/",
    "karpenter.k8s.aws/",
    "karpenter.azure.com/",
    "topology.k8s.aws/",
)


#: Karpenter (AWS) instance categories whose nodes carry accelerators: GPU (g, p), Inferentia
#: and Trainium (inf, trn), Gaudi (dl).
_ACCELERATOR_CATEGORIES = ("g", "p", "inf", "trn", "dl")
_ACCELERATOR_REQUIREMENTS = (
    "karpenter.k8s.aws/instance-gpu",
    "karpenter.k8s.aws/instance-accelerator",
)
#: Taint keys accelerator node groups use (nvidia.com/gpu, google.com/tpu, aws.amazon.com/neuron,
#: habana.ai/gaudi, amd.com/gpu...).
_ACCELERATOR_TAINT_WORDS = ("gpu", "tpu", "neuron", "gaudi", "habana")


def _accelerator_taint(taint: dict[str, str]) -> bool:
    key = taint.get("key", "").lower()
    return any(w in key for w in _ACCELERATOR_TAINT_WORDS)


@dataclass(frozen=True)
class Pool:
    """A node pool as the Kubernetes scheduler (or Karpenter) sees it."""

    name: str
    #: Where it came from, e.g. ``NodePool/default/gpu`` or ``fleet.yaml pool gpu``.
    source: str
    labels: dict[str, str]
    #: (key, operator, values) from Karpenter requirements.
    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]
    taints: tuple[dict[str, str], ...]
    #: Karpenter provisions from requirements (well-known labels have known values).
    karpenter: bool
    #: Its nodes carry accelerators (GPU, TPU, Neuron, Gaudi), by taints, labels or capacity.
    gpu: bool


def _karpenter_pool(m: Manifest) -> Pool:
    spec = as_dict(m.body.get("spec"))
    tpl = as_dict(spec.get("template"))
    meta = as_dict(tpl.get("metadata"))
    tspec = as_dict(tpl.get("spec"))
    labels = {str(k): str(v) for k, v in as_dict(meta.get("labels")).items()}
    labels["karpenter.sh/nodepool"] = m.name
    reqs = []
    for r in as_list(tspec.get("requirements")):
        if isinstance(r, dict) and isinstance(r.get("key"), str):
            values = tuple(str(v) for v in as_list(r.get("values")))
            reqs.append((r["key"], str(r.get("operator", "In")), values))
    taints = tuple(
        {str(k): str(v) for k, v in t.items()}
        for t in as_list(tspec.get("taints"))
        if isinstance(t, dict)
    )
    gpu = (
        any(_accelerator_taint(t) for t in taints)
        or any(
            k.startswith(
                ("karpenter.k8s.aws/instance-gpu", "karpenter.k8s.aws/instance-accelerator")
            )
            or (
                k == "karpenter.k8s.aws/instance-category"
                and set(v)
                and set(v) <= set(_ACCELERATOR_CATEGORIES)
            )
            for k, _, v in reqs
        )
        or labels.get("accelerator", "").lower() in ("nvidia", "gpu", "tpu", "neuron", "gaudi")
        or any(k.startswith("cloud.google.com/gke-tpu") for k in labels)
    )
    return Pool(m.name, m.ref, labels, tuple(reqs), taints, True, gpu)


def _node_pool(m: Manifest) -> Pool:
    meta = as_dict(m.body.get("metadata"))
    spec = as_dict(m.body.get("spec"))
    labels = {str(k): str(v) for k, v in as_dict(meta.get("labels")).items()}
    taints = tuple(
        {str(k): str(v) for k, v in t.items()}
        for t in as_list(spec.get("taints"))
        if isinstance(t, dict)
    )
    status = as_dict(m.body.get("status"))
    cap = as_dict(status.get("capacity"))
    gpu = any(
        is_accelerator_resource(str(k)) and (try_quantity(v) or 0) > 0 for k, v in cap.items()
    )
    gpu = gpu or any(_accelerator_taint(t) for t in taints)
    return Pool(m.name, m.ref, labels, (), taints, False, gpu)


def node_pools(inv: Inventory) -> list[Pool]:
    """Node pools from NodePool/Node manifests and fleet specs in the inputs."""
    pools = [_karpenter_pool(m) for m in inv.of_kind("NodePool")]
    pools += [_node_pool(m) for m in inv.of_kind("Node")]
    for fleet in inv.fleets:
        for p in fleet.spec.pools:
            taints = tuple(
                {"key": t.key, "value": t.value or "", "effect": t.effect} for t in p.taints
            )
            is_gpu = p.gpu is not None and p.gpu.count > 0
            pools.append(
                Pool(
                    p.name, f"{fleet.file} pool {p.name}", dict(p.labels), (), taints, False, is_gpu
                )
            )
    return pools


def _domain(pool: Pool, key: str) -> tuple[str, frozenset[str]]:
    """What values ``key`` may have on the pool's nodes: set | notin | any | absent."""
    if key in pool.labels:
        return "set", frozenset({pool.labels[key]})
    for k, op, values in pool.requirements:
        if k != key:
            continue
        if op == "In":
            return "set", frozenset(values)
        if op == "NotIn":
            return "notin", frozenset(values)
        if op == "DoesNotExist":
            return "absent", frozenset()
        return "any", frozenset()  # Exists, Gt, Lt
    if pool.karpenter and key.startswith(_WELL_KNOWN_PREFIXES):
        return "any", frozenset()
    return "absent", frozenset()


def _numeric_ok(values: frozenset[str], op: str, bound: str) -> bool:
    try:
        b = int(bound)
        nums = [int(v) for v in values]
    except ValueError:
        return False
    return any(n > b if op == "Gt" else n < b for n in nums)


def _expr_ok(pool: Pool, key: str, op: str, values: tuple[str, ...]) -> bool:
    kind, known = _domain(pool, key)
    want = frozenset(values)
    if op == "In":
        return {"set": bool(known & want), "notin": bool(want - known), "any": True}.get(
            kind, False
        )
    if op == "NotIn":
        return bool(known - want) if kind == "set" else True
    if op == "Exists":
        return kind != "absent"
    if op == "DoesNotExist":
        return kind in ("absent", "notin")
    if op in ("Gt", "Lt") and values:
        if kind == "set":
            return _numeric_ok(known, op, values[0])
        return kind != "absent"
    return True


@dataclass(frozen=True)
class PodPlacement:
    """The scheduling constraints of one pod template."""

    manifest: Manifest
    path: str
    label: str
    node_selector: dict[str, str]
    #: OR of terms; each term an AND of (key, operator, values).
    terms: tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...]
    tolerations: tuple[dict[str, str], ...]
    wants_gpu: bool


def placements(inv: Inventory) -> list[PodPlacement]:
    out = []
    for m in inv.manifests:
        if m.kind in ("NodePool", "Node"):
            continue
        templates = pod_templates(m)
        labels = [g.label for g in groups(m)] if m.kind in RAY_KINDS else ["pod"] * len(templates)
        for (pod, path), label in zip(templates, labels, strict=False):
            if pod.get("nodeName"):
                continue
            selector = {str(k): str(v) for k, v in as_dict(pod.get("nodeSelector")).items()}
            terms = []
            affinity = as_dict(as_dict(pod.get("affinity")).get("nodeAffinity"))
            req = as_dict(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
            for term in as_list(req.get("nodeSelectorTerms")):
                exprs = []
                for e in as_list(as_dict(term).get("matchExpressions")):
                    if isinstance(e, dict) and isinstance(e.get("key"), str):
                        vals = tuple(str(v) for v in as_list(e.get("values")))
                        exprs.append((e["key"], str(e.get("operator", "In")), vals))
                terms.append(tuple(exprs))
            tols = tuple(
                {str(k): str(v) for k, v in t.items()}
                for t in as_list(pod.get("tolerations"))
                if isinstance(t, dict)
            )
            wants_gpu = False
            for c in as_list(pod.get("containers")):
                res = c.get("resources") if isinstance(c, dict) else None
                lim = res.get("limits") if isinstance(res, dict) else None
                if isinstance(lim, dict) and any(is_accelerator_resource(str(k)) for k in lim):
                    wants_gpu = True
            out.append(PodPlacement(m, path, label, selector, tuple(terms), tols, wants_gpu))
    return out


def selector_ok(p: PodPlacement, pool: Pool) -> bool:
    if not all(_expr_ok(pool, k, "In", (v,)) for k, v in p.node_selector.items()):
        return False
    if not p.terms:
        return True
    return any(all(_expr_ok(pool, *e) for e in term) for term in p.terms)


def mismatch(p: PodPlacement, pool: Pool) -> str:
    for k, v in p.node_selector.items():
        if not _expr_ok(pool, k, "In", (v,)):
            kind, known = _domain(pool, k)
            has = (
                f"has {k}={'/'.join(sorted(known))}"
                if kind == "set"
                else f'has no label "{k}"'
                if kind == "absent"
                else f"constrains {k}"
            )
            return f"{pool.source} {has}"
    return f"{pool.source} matches no required node-affinity term"


def _tolerates(tols: tuple[dict[str, str], ...], taint: dict[str, str]) -> bool:
    for t in tols:
        effect = t.get("effect", "")
        if effect and effect != taint.get("effect", ""):
            continue
        op = t.get("operator", "Equal")
        key = t.get("key", "")
        if not key and op == "Exists":
            return True
        if key != taint.get("key"):
            continue
        if op == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def blocking(p: PodPlacement, pool: Pool) -> list[dict[str, str]]:
    return [
        t
        for t in pool.taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(p.tolerations, t)
    ]


def taint_text(t: dict[str, str]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"
