"""Rules: scheduling across the two layers (Kubernetes places pods, Ray places tasks, actors,
bundles).

Design note. Every rule here compares a DEMAND with a SUPPLY that live in different objects;
the facts are computed in ``_capacity`` (Ray layer: node types, Serve/Train/job demands) and
``_pools`` (Kubernetes layer: node pools, selectors, taints), so the rules only compare.
Placement for ``ingress-starved`` is first-fit decreasing (GPU bundles first, the way they
constrain), over the most pods each group may ever have.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest, ScalingConfigCall
from fleetserve.k8s.doctor.ray_objects import (
    RAY_KINDS,
    GroupView,
    env_value,
    fmt_num,
    groups,
    head_group,
    is_gpu_resource,
    try_quantity,
)
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._capacity import (
    EPS,
    UNBOUNDED,
    NodeType,
    ServeDemand,
    cpu_known,
    entrypoint_bundle,
    fmt_res,
    node_types,
    pack,
    placeable,
    replicas_per_pod,
    script_clusters,
    serve_demands,
    train_bundles,
    train_version,
    types_text,
)
from fleetserve.k8s.doctor.rules._pools import (
    blocking,
    mismatch,
    node_pools,
    placements,
    selector_ok,
    taint_text,
)


@rule("train-coordinator-cpu", versions={"ray": "all"})
def train_coordinator_cpu(inv: Inventory) -> Iterator[Finding]:
    """Ray Train v1 adds the trainer's CPU to bundle 0; no node type can hold it."""
    for call in inv.scaling_configs:
        for m in script_clusters(inv, call.file):
            v2, why = train_version(call, m)
            if v2 is True:
                continue
            built = train_bundles(call, v2=False)
            types = [t for t in node_types(m) if t.max_count > 0]
            if built is None or not types:
                continue
            worker, rank0, trainer_cpu = built
            if trainer_cpu <= 0 or any(t.fits(rank0) for t in types):
                continue
            if not any(t.fits(worker) for t in types):
                continue  # the worker bundle alone is infeasible: infeasible-request says so
            cpus = [t.capacity["CPU"] for t in types if "CPU" in t.capacity]
            best = max(cpus) if cpus else 0.0
            wcpu = worker.get("CPU", 0.0)
            who = (
                f"If this runs Ray Train v1 ({why}), it" if v2 is None else f"Ray Train v1 ({why})"
            )
            yield Finding.at(
                "train-coordinator-cpu",
                "error" if v2 is False else "warning",
                call,
                "resources_per_worker",
                f"{who} puts the trainer's {fmt_num(trainer_cpu)} CPU into the rank-0 "
                f"bundle: bundle 0 needs {fmt_num(rank0.get('CPU', 0))} CPU "
                f"({fmt_num(wcpu)} + {fmt_num(trainer_cpu)} trainer) {fmt_res(rank0)}, but the "
                f"largest node type of {m.ref} advertises {fmt_num(best)} CPU "
                f"({types_text(types)}). The job stays PENDING forever and the autoscaler calls "
                f"the request infeasible and adds no node, whatever num_workers "
                f"({_num_workers_text(call, m)}) is.",
                f"Raise the worker group's limits.cpu to {fmt_num(math.ceil(wcpu + trainer_cpu))} "
                f"(or num-cpus), or lower resources_per_worker CPU to "
                f"{fmt_num(max(best - trainer_cpu, 0))} so {fmt_num(max(best - trainer_cpu, 0))} "
                f"+ {fmt_num(trainer_cpu)} <= {fmt_num(best)}"
                + (
                    ""
                    if v2 is False and "RAY_TRAIN_V2_ENABLED" in why
                    else ", or run Train v2 (RAY_TRAIN_V2_ENABLED=1, the default from Ray 2.51), "
                    "whose rank-0 bundle carries no trainer resources"
                )
                + ".",
            )


def _num_workers_text(call: ScalingConfigCall, m: Manifest) -> str:
    """num_workers as the job will see it: the literal, or the env var the script reads."""
    if call.num_workers is not None:
        return str(call.num_workers)
    if call.num_workers_env is None:
        return "computed at run time"
    var, default = call.num_workers_env
    found = env_value(m, var)
    if found is not None:
        value, where = found
        return f"{value}, from {var} in {where}"
    if default is not None:
        return f"{default}, the script's default: {var} is not set in {m.ref}"
    return f"read from {var}, which {m.ref} does not set"


# --------------------------------------------------------------------------------------------
# infeasible-request
# --------------------------------------------------------------------------------------------


@rule("infeasible-request", versions={"ray": "all", "kuberay": "all"})
def infeasible_request(inv: Inventory) -> Iterator[Finding]:
    """A replica, bundle, Train worker or job driver that no node type can hold, even empty."""
    for m in inv.of_kind(*RAY_KINDS):
        types = node_types(m)
        if not any(t.max_count > 0 for t in types):
            continue
        for d in serve_demands(m):
            problems = placeable(d, types)
            if problems:
                yield Finding.at(
                    "infeasible-request",
                    "error",
                    m,
                    d.path,
                    f"Serve deployment {d.name}: {'; '.join(problems)} ({d.source}), but no "
                    f"node type can hold it even empty ({types_text(types)}). Ray logs "
                    '"No available node types can fulfill resource request" and the autoscaler '
                    "never scales up for it: the replica stays PENDING.",
                    "Lower the request (num_cpus/num_gpus/bundles) to fit a worker group, or "
                    "add/enlarge a worker group (limits or rayStartParams) that can hold it.",
                )
        spec = m.body.get("spec")
        if m.kind == "RayJob" and isinstance(spec, dict):
            bundle = entrypoint_bundle(spec)
            if bundle and not any(t.fits(bundle) for t in types if t.max_count > 0):
                key = next(
                    (k for k in ("entrypointNumCpus", "entrypointNumGpus") if k in spec),
                    "entrypointResources",
                )
                yield Finding.at(
                    "infeasible-request",
                    "error",
                    m,
                    f"spec.{key}",
                    f"The job driver needs {fmt_res(bundle)} but no node type can hold it "
                    f"({types_text(types)}): the entrypoint never starts.",
                    "Lower entrypointNumCpus/entrypointNumGpus/entrypointResources, or give a "
                    "group the resources.",
                )
    for call in inv.scaling_configs:
        for m in script_clusters(inv, call.file):
            types = [t for t in node_types(m) if t.max_count > 0]
            built = train_bundles(call, v2=True)
            if built is None or not types:
                continue
            worker = built[0]
            if not any(t.fits(worker) for t in types):
                yield Finding.at(
                    "infeasible-request",
                    "error",
                    call,
                    "resources_per_worker",
                    f"Each Train worker needs {fmt_res(worker)} but no node type of {m.ref} can "
                    f"hold it even empty ({types_text(types)}): every worker stays PENDING and "
                    "the autoscaler reports the request infeasible.",
                    "Lower resources_per_worker, or add a worker group whose pods advertise at "
                    "least that much.",
                )
    for req in inv.ray_requests:
        bundles = list(req.bundles)
        if req.strategy == "STRICT_PACK":
            total: dict[str, float] = {}
            for b in bundles:
                for k, v in b.items():
                    total[k] = total.get(k, 0.0) + v
            bundles = [total]
        for m in script_clusters(inv, req.file):
            types = [t for t in node_types(m) if t.max_count > 0]
            if not types:
                continue
            bad = [(i, b) for i, b in enumerate(bundles) if not any(t.fits(b) for t in types)]
            if not bad:
                continue
            what = (
                f"@ray.remote {req.name}"
                if req.kind == "remote" and not req.name.endswith("(...)")
                else req.name
            )
            needs = "; ".join(
                (
                    "all bundles together (STRICT_PACK)"
                    if req.strategy == "STRICT_PACK"
                    else f"bundle {i}"
                    if req.kind == "placement_group"
                    else "it"
                )
                + f" needs {fmt_res(b)}"
                for i, b in bad
            )
            yield Finding.at(
                "infeasible-request",
                "error",
                req,
                "placement_group" if req.kind == "placement_group" else "resources",
                f"{what}: {needs}, but no node type of {m.ref} can hold it even empty "
                f'({types_text(types)}): Ray logs "No available node types can fulfill '
                'resource request" and it stays pending; the autoscaler never adds a node for it.',
                "Lower the request to fit a worker group, or add a group whose pods advertise it.",
            )


# --------------------------------------------------------------------------------------------
# ingress-starved
# --------------------------------------------------------------------------------------------


@rule("ingress-starved", versions="all")
def ingress_starved(inv: Inventory) -> Iterator[Finding]:
    """At min replicas, replicas and bundles leave no CPU for another deployment (the ingress)."""
    for m in inv.of_kind("RayService"):
        types = [t for t in node_types(m) if t.max_count > 0]
        if not types or not cpu_known(types):
            continue
        demands = [d for d in serve_demands(m) if not placeable(d, types)]
        items: list[tuple[str, dict[str, float]]] = []
        for d in demands:
            for r in range(d.min_replicas):
                bundles = [d.per_replica] if d.strategy == "STRICT_PACK" else list(d.bundles)
                for b_i, b in enumerate(bundles):
                    items.append((f"{d.name}#{r}.{b_i}", b))
        if not items:
            continue
        unplaced = pack(items, types, slots=len(items))
        starved = sorted({n.split("#", 1)[0] for n in unplaced})
        cpu_only = [
            n
            for n in starved
            if all(d.per_replica.get("GPU", 0) == 0 for d in demands if d.name == n)
        ]
        if not cpu_only:
            continue  # only GPU replicas left over: serve-replicas-exceed-workers' business
        need = sum(b.get("CPU", 0.0) for _, b in items)
        have = sum(t.capacity.get("CPU", 0.0) * min(t.max_count, len(items)) for t in types)
        parts = ", ".join(
            f"{d.name} {d.min_replicas}×{fmt_num(d.per_replica.get('CPU', 0))}"
            for d in demands
            if d.min_replicas > 0
        )
        path = next(d.path for d in demands if d.name == cpu_only[0])
        yield Finding.at(
            "ingress-starved",
            "error",
            m,
            path,
            f"At min replicas the Serve deployments need {fmt_num(need)} CPU ({parts}) but "
            f"the cluster can offer at most {fmt_num(have)} CPU ({types_text(types)}), and "
            f'{", ".join(cpu_only)} cannot be placed: its replica stays pending ("total '
            'resources available: {}") and requests through it hang.',
            f"Give the cluster CPU for {', '.join(cpu_only)}: a CPU worker group, a larger CPU "
            "limit on the GPU group, or fewer CPUs per replica/bundle (num_cpus: 0 for a "
            "router that only forwards).",
        )


# --------------------------------------------------------------------------------------------
# serve-replicas-exceed-workers
# --------------------------------------------------------------------------------------------


@rule("serve-replicas-exceed-workers", versions="all")
def serve_replicas_exceed_workers(inv: Inventory) -> Iterator[Finding]:
    """Serve GPU demand at max replicas vs the GPUs the worker groups can ever have."""
    for m in inv.of_kind("RayService"):
        types = node_types(m)
        gpu_types = [t for t in types if t.capacity.get("GPU", 0) > 0]
        demands = [d for d in serve_demands(m) if d.per_replica.get("GPU", 0) > 0]
        if not demands or not gpu_types:
            continue
        supply_max = sum(t.capacity["GPU"] * t.max_count for t in gpu_types)
        supply_min = sum(t.capacity["GPU"] * t.min_count for t in gpu_types)
        need_max = sum(d.per_replica["GPU"] * d.max_replicas for d in demands)
        need_min = sum(d.per_replica["GPU"] * d.min_replicas for d in demands)
        groups_text = ", ".join(
            f"{t.label}: {'unbounded' if t.max_count >= UNBOUNDED else t.max_count} pods × "
            f"{fmt_num(t.capacity['GPU'])} GPU"
            for t in gpu_types
        )
        demand_text = ", ".join(
            f"{d.name}: max_replicas {d.max_replicas} × {fmt_num(d.per_replica['GPU'])} GPU"
            for d in demands
        )
        first = demands[0]
        if len(demands) == 1 and need_max <= supply_max + EPS:
            # GPUs suffice in total, but a pod may hold fewer replicas than its GPUs suggest
            # (CPU or memory run out first): count whole replicas per pod.
            fit = {t.label: replicas_per_pod(first, t) for t in gpu_types}
            room = sum(fit[t.label] * t.max_count for t in gpu_types)
            if 0 < room < first.max_replicas:
                fits_text = ", ".join(
                    f"{t.label}: {fit[t.label]} per pod × "
                    f"{'unbounded' if t.max_count >= UNBOUNDED else t.max_count} pods"
                    for t in gpu_types
                )
                yield Finding.at(
                    "serve-replicas-exceed-workers",
                    "error",
                    m,
                    first.path,
                    f"Serve may run {first.max_replicas} replicas of {first.name} "
                    f"({fmt_res(first.per_replica)} each) but the worker groups can place only "
                    f"{room} ({fits_text}): a pod runs out of CPU or memory before its GPUs, so "
                    "the extra replicas stay PENDING.",
                    "Give the GPU pods enough CPU/memory for one replica per GPU, raise "
                    "maxReplicas, or lower max_replicas.",
                )
        if need_max > supply_max + EPS:
            group = gpu_types[0].group
            per_pod = gpu_types[0].capacity["GPU"]
            pods = math.ceil((need_max - (supply_max - per_pod * gpu_types[0].max_count)) / per_pod)
            yield Finding.at(
                "serve-replicas-exceed-workers",
                "error",
                m,
                first.path,
                f"Serve may ask for {fmt_num(need_max)} GPUs ({demand_text}) but the worker "
                f"groups can hold at most {fmt_num(supply_max)} ({groups_text}): the Serve "
                "autoscaler will request replicas the cluster can never place, and they stay "
                "PENDING.",
                f"Set maxReplicas of {group.label} to at least {pods}, or lower max_replicas "
                "so max_replicas × GPUs per replica fits.",
            )
        if supply_min > need_min + EPS:
            min_text = ", ".join(
                f"{t.label}: minReplicas {t.min_count} × {fmt_num(t.capacity['GPU'])} GPU"
                for t in gpu_types
                if t.min_count
            )
            yield Finding.at(
                "serve-replicas-exceed-workers",
                "warning",
                m,
                f"{gpu_types[0].group.path}.minReplicas",
                f"The worker groups keep {fmt_num(supply_min)} GPUs at minimum ({min_text}) "
                f"but Serve needs only {fmt_num(need_min)} at min_replicas: "
                f"{fmt_num(supply_min - need_min)} GPU(s) stay allocated and idle.",
                _idle_fix(gpu_types, demands, need_min, supply_min),
            )


def _idle_fix(
    gpu_types: list[NodeType], demands: list[ServeDemand], need_min: float, supply_min: float
) -> str:
    """Advice that really frees the idle GPUs. Pods are the unit: a group's minimum can only
    drop to the pods that still hold what Serve needs; when it already is that, lowering it
    frees nothing, so the advice is to use the GPUs or cut the pods smaller."""
    if len(gpu_types) != 1:
        return (
            "Lower the GPU groups' minReplicas to what min_replicas needs, or raise min_replicas."
        )
    t = gpu_types[0]
    raw_hosts = t.group.spec.get("numOfHosts", 1)
    hosts = raw_hosts if isinstance(raw_hosts, int) and raw_hosts > 0 else 1
    per_pod = t.capacity["GPU"]
    pods = math.ceil(need_min / (per_pod * hosts) - EPS) if need_min > 0 else 0
    current = t.min_count // hosts
    if pods < current:
        return (
            f"Set minReplicas of the {t.label} to {pods}: {pods} pod(s) × "
            f"{fmt_num(per_pod * hosts)} GPU hold the {fmt_num(need_min)} GPU(s) Serve needs "
            "at min_replicas."
        )
    per_replica = max(d.per_replica.get("GPU", 0.0) for d in demands)
    more = math.floor(supply_min / per_replica + EPS) if per_replica > 0 else 0
    smaller = math.ceil(need_min / max(pods * hosts, 1) - EPS)
    return (
        f"The pod is the unit: {current} pod(s) of the {t.label} is the least that holds "
        f"{fmt_num(need_min)} GPU(s), so lowering minReplicas frees nothing. Use the GPUs "
        f"(raise min_replicas so the minimum fills them: up to {more} replica(s) of "
        f"{fmt_num(per_replica)} GPU), or cut the pods smaller (a group with {smaller} GPU(s) "
        "per pod for the minimum)."
    )


# --------------------------------------------------------------------------------------------
# Group-level checks: head-schedulable, advertised-vs-limit, cpu-rounding
# --------------------------------------------------------------------------------------------


@rule("head-schedulable", versions="all")
def head_schedulable(inv: Inventory) -> Iterator[Finding]:
    """A RayService head that advertises CPUs/GPUs receives replicas."""
    for m in inv.of_kind("RayService"):
        head = head_group(m)
        if head is None:
            continue
        cpu = head.advertised.get("CPU")
        gpu = head.advertised.get("GPU", 0.0)
        if cpu == 0 and gpu == 0:
            continue
        shown = "auto-detected (all of the node's CPUs)" if cpu is None else fmt_num(cpu)
        src = head.advertised_from.get("CPU", "nothing set")
        yield Finding.at(
            "head-schedulable",
            "warning",
            m,
            f"{head.path}.rayStartParams",
            f"The head advertises CPU {shown} ({src})"
            + (f" and GPU {fmt_num(gpu)}" if gpu else "")
            + ": Ray will place Serve replicas and tasks on it, and a head restart (upgrade, "
            "OOM, eviction) then kills serving along with the GCS.",
            'Set headGroupSpec.rayStartParams.num-cpus: "0" (and keep GPUs off the head) so '
            "only worker pods run replicas.",
        )


@rule("advertised-vs-limit", versions="all")
def advertised_vs_limit(inv: Inventory) -> Iterator[Finding]:
    """rayStartParams / group resources disagree with the container's limits."""
    for m in inv.of_kind(*RAY_KINDS):
        for g in groups(m):
            checks = (("CPU", "cpu", "num-cpus"), ("GPU", None, "num-gpus"))
            for ray_key, k8s_key, param in checks:
                src = g.advertised_from.get(ray_key, "")
                if not (src.startswith("rayStartParams.") or src.startswith("resources.")):
                    continue
                advertised = g.advertised[ray_key]
                if g.is_head and ray_key == "CPU" and advertised == 0:
                    continue  # num-cpus "0" on the head is the recommended setting
                if k8s_key is not None:
                    limit = try_quantity(g.limits.get(k8s_key))
                    where = "limits.cpu"
                    if limit is None:
                        limit = try_quantity(g.requests.get(k8s_key))
                        where = "requests.cpu"
                else:
                    gpu_keys = [k for k in g.limits if is_gpu_resource(k)]
                    limit = try_quantity(g.limits[gpu_keys[0]]) if gpu_keys else None
                    where = f"limits.{gpu_keys[0]}" if gpu_keys else ""
                if limit is None:
                    if ray_key == "GPU" and advertised > 0:
                        device = _gpu_device_hint(g)
                        yield Finding.at(
                            "advertised-vs-limit",
                            "warning",
                            m,
                            f"{g.path}.{src}",
                            f"{g.label} advertises {fmt_num(advertised)} GPU ({src}) but its "
                            "container requests no GPU: Kubernetes gives the pod none, and Ray "
                            "will place GPU replicas that find no device.",
                            f"Add {device} to the container's limits, or drop {src}.",
                        )
                    continue
                if abs(limit - advertised) < EPS:
                    continue
                more = "fewer" if advertised < limit else "more"
                yield Finding.at(
                    "advertised-vs-limit",
                    "warning",
                    m,
                    f"{g.path}.{src}",
                    f"{g.label}: Kubernetes gives each pod {fmt_num(limit)} {ray_key} ({where}) "
                    f"but Ray sees {fmt_num(advertised)} ({src}): Ray schedules {more} "
                    f"{ray_key}s than the pod has"
                    + (
                        ", so tasks will contend for CPU time."
                        if advertised > limit
                        else "; the rest stays idle unless that is intended (e.g. room for "
                        "non-Ray processes)."
                    ),
                    f'Make them equal ({param}: "{fmt_num(limit)}" or {where}: '
                    f"{fmt_num(advertised)}), or keep the difference on purpose.",
                )


def _gpu_device_hint(g: GroupView) -> str:
    """The GPU device resource to suggest: AMD when the pod is AMD's, else NVIDIA's."""
    image = str(g.container.get("image", "")).lower()
    return "amd.com/gpu" if "rocm" in image or "amd" in image else "nvidia.com/gpu"


@rule("cpu-rounding", versions="all")
def cpu_rounding(inv: Inventory) -> Iterator[Finding]:
    """A fractional CPU limit without num-cpus: KubeRay advertises it rounded UP."""
    for m in inv.of_kind(*RAY_KINDS):
        for g in groups(m):
            src = g.advertised_from.get("CPU", "")
            if src not in ("limits.cpu", "requests.cpu"):
                continue
            table = g.limits if src == "limits.cpu" else g.requests
            raw = table.get("cpu")
            value = try_quantity(raw)
            if value is None or float(value).is_integer():
                continue
            advertised = g.advertised["CPU"]
            yield Finding.at(
                "cpu-rounding",
                "warning",
                m,
                f"{g.container_path}.resources.{src}",
                f"{g.label}: {src} is {raw} ({fmt_num(value)} CPU) and rayStartParams has no "
                f"num-cpus, so KubeRay advertises num-cpus {fmt_num(advertised)} (rounded UP): "
                f"Ray will schedule {fmt_num(advertised)} CPU of work into {fmt_num(value)} CPU "
                "and the pod is throttled.",
                f"Use a whole-CPU limit ({math.ceil(value)} or {max(math.floor(value), 1)}), or "
                f'set rayStartParams num-cpus: "{max(math.floor(value), 0)}" explicitly.',
            )


@rule("node-selector-no-pool", versions="all")
def node_selector_no_pool(inv: Inventory) -> Iterator[Finding]:
    """The pod's nodeSelector/required affinity matches no known node pool."""
    pools = node_pools(inv)
    if not pools:
        return
    for p in placements(inv):
        if not p.node_selector and not p.terms:
            continue
        if any(selector_ok(p, pool) for pool in pools):
            continue
        wanted = ", ".join(f"{k}: {v}" for k, v in p.node_selector.items()) or "node affinity"
        why = "; ".join(sorted({mismatch(p, pool) for pool in pools}))
        # Propose labels of pools of the pod's kind: a GPU/TPU/Neuron group's fix names an
        # accelerator pool's labels, never the CPU pool's (and the other way round).
        kind = [pool for pool in pools if pool.gpu == p.wants_gpu] or pools
        hints = sorted(
            {f"karpenter.sh/nodepool: {pool.name}" for pool in kind if pool.karpenter}
            | {
                f"{k}: {v}"
                for pool in kind
                for k, v in pool.labels.items()
                if k != "karpenter.sh/nodepool"
            }
        )
        which = (
            "an accelerator pool"
            if p.wants_gpu and kind is not pools
            else "a CPU pool"
            if kind is not pools
            else "a pool"
        )
        yield Finding.at(
            "node-selector-no-pool",
            "error",
            p.manifest,
            f"{p.path}.nodeSelector" if p.node_selector else f"{p.path}.affinity",
            f"{p.label} selects nodes by {{{wanted}}} but no node pool in the input matches "
            f"({why}): the "
            "pod stays Pending with FailedScheduling \"didn't match Pod's node "
            'affinity/selector" (Karpenter: "label ... does not have known values").',
            f"Select labels {which} really carries, e.g. " + "; ".join(hints[:4]) + ".",
        )


@rule("missing-gpu-toleration", versions="all")
def missing_gpu_toleration(inv: Inventory) -> Iterator[Finding]:
    """A GPU pod that tolerates none of the taints of the pools it could land on."""
    pools = node_pools(inv)
    if not pools:
        return
    for p in placements(inv):
        if not p.wants_gpu:
            continue
        candidates = [pool for pool in pools if selector_ok(p, pool)]
        gpu_candidates = [pool for pool in candidates if pool.gpu]
        if gpu_candidates:
            candidates = gpu_candidates
        if not candidates:
            candidates = [pool for pool in pools if pool.gpu]
        if not candidates or any(not blocking(p, pool) for pool in candidates):
            continue
        blocked = {taint_text(t): t for pool in candidates for t in blocking(p, pool)}
        first = blocked[min(blocked)]
        yield Finding.at(
            "missing-gpu-toleration",
            "error",
            p.manifest,
            f"{p.path}.tolerations",
            f"{p.label} requests accelerators but tolerates none of the taints on the pools it "
            "can use "
            f"({', '.join(sorted({pool.source for pool in candidates}))}: "
            f"{', '.join(sorted(blocked))}): "
            'it never lands on an accelerator node (FailedScheduling "had untolerated taint").',
            f'Add tolerations: [{{key: "{first.get("key")}", operator: "Exists", effect: '
            f'"{first.get("effect")}"}}] to the pod template.',
        )
