"""Scheduling across the two layers: Kubernetes places pods, Ray places tasks, actors, bundles.

Design note. Every rule here compares a DEMAND with a SUPPLY that live in different objects:
- supply, Ray layer: each node group advertises resources (``ray_objects.GroupView.advertised``:
  ``num-cpus``, else the CPU limit/request rounded up, ...); a group can have at most
  ``maxReplicas × numOfHosts`` pods (``replicas`` when autoscaling is off);
- demand, Ray layer: Serve replicas (``ray_actor_options``, ``placement_group_bundles``, Ray
  Serve LLM's per-model placement groups plus its ingress), Ray Train ``ScalingConfig`` bundles
  (v1 adds the trainer's ``{"CPU": 1}`` to bundle 0), a RayJob's entrypoint resources;
- supply, Kubernetes layer: node pools (Karpenter NodePools, Node objects, or a fleet spec's
  pools) with their labels, requirements and taints; demand: pod nodeSelector, required node
  affinity and tolerations.
A value Ray would auto-detect at run time (a group with no CPU limit, request or num-cpus) is
unknown here: rules then assume it fits, because a false alarm costs as much trust as a miss.
Placement for ``ingress-starved`` is first-fit decreasing (GPU bundles first, the way they
constrain), over the most pods each group may ever have.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest, ScalingConfigCall
from fleetserve.k8s.doctor.ray_objects import (
    RAY_KINDS,
    GroupView,
    as_dict,
    as_list,
    autoscaling_enabled,
    env_value,
    fmt_num,
    groups,
    head_group,
    is_gpu_resource,
    is_unknown,
    pod_templates,
    serve_config,
    try_quantity,
    worker_groups,
)
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._versions import TRAIN_V2_DEFAULT_FROM, ray_version

#: KubeRay's CRD default for an unset maxReplicas (int32 max): "unbounded".
UNBOUNDED = 2_147_483_647
_EPS = 1e-9


def _fmt_res(res: dict[str, float]) -> str:
    parts = []
    for k in sorted(res, key=lambda k: (k not in ("CPU", "GPU", "memory"), k)):
        v = res[k]
        if v <= 0 and k != "CPU":
            continue
        parts.append(f"{k}: {v / 2**30:.3g} GiB" if k == "memory" else f"{k}: {fmt_num(v)}")
    return "{" + ", ".join(parts) + "}"


# --------------------------------------------------------------------------------------------
# Supply: node types of a Ray cluster
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NodeType:
    """One Ray node group with how many pods it may have."""

    group: GroupView
    #: What one pod advertises to Ray (keys absent = auto-detected, unknown).
    capacity: dict[str, float]
    #: Pods at most (autoscaling: maxReplicas × numOfHosts; else replicas × numOfHosts).
    max_count: int
    #: Pods always present.
    min_count: int

    @property
    def label(self) -> str:
        return self.group.label

    def describe(self) -> str:
        return f"{self.label} {_fmt_res(self.capacity)}"

    @property
    def unknown(self) -> frozenset[str]:
        """Resources Ray detects in an amount the manifest does not say (assumed to fit)."""
        return self.group.auto_detected

    def fits(self, bundle: dict[str, float]) -> bool:
        """Whether ``bundle`` fits one empty pod of this type."""
        return fits(bundle, self.capacity, self.unknown)


def node_types(m: Manifest) -> list[NodeType]:
    """The head and worker groups of a Ray object as node types (suspended groups dropped)."""
    auto = autoscaling_enabled(m)
    out: list[NodeType] = []
    head = head_group(m)
    if head is not None:
        out.append(NodeType(head, dict(head.advertised), 1, 1))
    for g in worker_groups(m):
        if g.spec.get("suspend") is True:
            continue
        hosts = g.spec.get("numOfHosts", 1)
        hosts = hosts if isinstance(hosts, int) and hosts > 0 else 1
        lo = max(g.min_replicas or 0, 0)
        hi = g.max_replicas if g.max_replicas is not None else UNBOUNDED
        hi = max(hi, 0)
        if auto:
            max_count, min_count = hi, min(lo, hi)
        else:
            n = min(max(g.replicas or 0, lo), hi)
            max_count = min_count = n
        out.append(
            NodeType(
                g,
                dict(g.advertised),
                min(max_count * hosts, UNBOUNDED),
                min(min_count * hosts, UNBOUNDED),
            )
        )
    return out


def fits(
    bundle: dict[str, float], capacity: dict[str, float], unknown: frozenset[str] = frozenset()
) -> bool:
    """Whether one bundle fits one empty node. CPU/memory absent from capacity, and resources
    Ray detects in an unwritten amount (``unknown``), are unknown: they fit."""
    for k, v in bundle.items():
        if v <= 0:
            continue
        if (k in ("CPU", "memory") and k not in capacity) or is_unknown(k, unknown):
            continue
        if capacity.get(k, 0.0) + _EPS < v:
            return False
    return True


def _cpu_known(types: list[NodeType]) -> bool:
    return all("CPU" in t.capacity for t in types if t.max_count > 0)


# --------------------------------------------------------------------------------------------
# Demand: Serve replicas
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeDemand:
    """What one replica of a Serve deployment reserves, and how many replicas there are."""

    name: str
    path: str
    min_replicas: int
    max_replicas: int
    #: Bundles reserved per replica (one bundle, the actor itself, when no placement group).
    bundles: tuple[dict[str, float], ...]
    strategy: str = "PACK"
    #: Where the resources come from (for messages), e.g. ``ray_actor_options``.
    source: str = "ray_actor_options"
    notes: tuple[str, ...] = field(default=())

    @property
    def per_replica(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + v
        return total


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x)
    return try_quantity(x) if isinstance(x, str) else None


def _bundle_of(d: Any) -> dict[str, float] | None:
    if not isinstance(d, dict):
        return None
    out: dict[str, float] = {}
    for k, v in d.items():
        n = _num(v)
        if n is None:
            return None
        out[str(k)] = n
    return out


def _actor_resources(opts: Any) -> dict[str, float] | None:
    """Resources of a replica actor from ``ray_actor_options`` (Serve's default num_cpus: 1)."""
    opts = opts if isinstance(opts, dict) else {}
    cpu = _num(opts.get("num_cpus", 1))
    gpu = _num(opts.get("num_gpus", 0))
    if cpu is None or gpu is None:
        return None
    res = {"CPU": cpu, "GPU": gpu}
    if "memory" in opts:
        mem = _num(opts["memory"])
        if mem is None:
            return None
        res["memory"] = mem
    custom = opts.get("resources")
    if isinstance(custom, dict):
        extra = _bundle_of(custom)
        if extra is None:
            return None
        res.update(extra)
    return res


def _replica_bounds(cfg: dict[str, Any]) -> tuple[int, int] | None:
    auto = cfg.get("autoscaling_config")
    if isinstance(auto, dict):
        lo, hi = auto.get("min_replicas", 1), auto.get("max_replicas", 1)
        if isinstance(lo, int) and isinstance(hi, int):
            return lo, max(hi, lo)
        return None
    n = cfg.get("num_replicas", 1)
    if n == "auto":  # Serve's "auto": autoscaling with min 1 / max 100 defaults
        return 1, 100
    if isinstance(n, int) and not isinstance(n, bool):
        return n, n
    return None


def _deployment_demand(name: str, dep: dict[str, Any], path: str) -> ServeDemand | None:
    bounds = _replica_bounds(dep)
    actor = _actor_resources(dep.get("ray_actor_options"))
    if bounds is None or actor is None:
        return None
    raw = dep.get("placement_group_bundles")
    if isinstance(raw, list) and raw:
        bundles = [_bundle_of(b) for b in raw]
        if any(b is None for b in bundles):
            return None
        strategy = dep.get("placement_group_strategy", "PACK")
        return ServeDemand(
            name,
            path,
            bounds[0],
            bounds[1],
            tuple(b for b in bundles if b is not None),
            str(strategy),
            "placement_group_bundles",
        )
    return ServeDemand(name, path, bounds[0], bounds[1], (actor,))


def _llm_demands(app: dict[str, Any], app_name: str, path: str) -> list[ServeDemand]:
    """Ray Serve LLM apps (``ray.serve.llm`` builders): one LLMServer per model + the ingress.

    Mirrors ray.llm 2.60: the engine's placement group has one ``{GPU: 1}`` bundle per
    TP × PP rank unless ``placement_group_config`` gives bundles; the replica actor's own
    resources (``num_cpus`` default 1) are merged into bundle 0; the OpenAI ingress is a plain
    Serve deployment (1 CPU) whose min replicas is 0 only when every model scales to zero.
    """
    args = app.get("args")
    configs = args.get("llm_configs") if isinstance(args, dict) else None
    if not isinstance(configs, list):
        return []
    out: list[ServeDemand] = []
    all_zero = True
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, dict):
            continue
        model = cfg.get("model_loading_config")
        model_id = model.get("model_id") if isinstance(model, dict) else None
        dep = as_dict(cfg.get("deployment_config"))
        bounds = _replica_bounds(dep)
        opts = as_dict(dep.get("ray_actor_options"))
        actor = _actor_resources(opts)
        engine = as_dict(cfg.get("engine_kwargs"))
        tp, pp = engine.get("tensor_parallel_size", 1), engine.get("pipeline_parallel_size", 1)
        if bounds is None or actor is None or not isinstance(tp, int) or not isinstance(pp, int):
            continue
        if bounds[0] > 0:
            all_zero = False
        pg = cfg.get("placement_group_config")
        bundles: list[dict[str, float]]
        strategy = "PACK"
        if isinstance(pg, dict):
            strategy = str(pg.get("strategy", "PACK"))
            per_worker = _bundle_of(pg.get("bundle_per_worker"))
            explicit = pg.get("bundles")
            if per_worker is not None:
                bundles = [dict(per_worker) for _ in range(tp * pp)]
            elif isinstance(explicit, list) and explicit:
                parsed = [_bundle_of(b) for b in explicit]
                if any(b is None for b in parsed):
                    continue
                bundles = [b for b in parsed if b is not None]
            else:
                continue
        else:
            bundles = [{"GPU": 1.0} for _ in range(tp * pp)]
        first = dict(bundles[0])
        for k, v in actor.items():
            first[k] = first.get(k, 0.0) + v
        bundles[0] = first
        out.append(
            ServeDemand(
                f"{app_name}/LLMServer:{model_id or i}",
                f"{path}.args.llm_configs[{i}]",
                bounds[0],
                bounds[1],
                tuple(bundles),
                strategy,
                "Ray Serve LLM placement group",
            )
        )
    if out:
        out.append(
            ServeDemand(
                f"{app_name}/OpenAiIngress",
                path,
                0 if all_zero else 1,
                1,
                ({"CPU": 1.0, "GPU": 0.0},),
                source="Serve default num_cpus: 1",
            )
        )
    return out


def serve_demands(m: Manifest) -> list[ServeDemand]:
    """Every Serve deployment whose resources can be read from a RayService's serveConfigV2."""
    found = serve_config(m)
    if found is None:
        return []
    cfg, base = found
    apps = cfg.get("applications")
    out: list[ServeDemand] = []
    if not isinstance(apps, list):
        return out
    for i, app in enumerate(apps):
        if not isinstance(app, dict):
            continue
        app_name = str(app.get("name", f"#{i}"))
        app_path = f"{base}:applications[{i}]"
        import_path = str(app.get("import_path", ""))
        llm: list[ServeDemand] = []
        if "serve.llm" in import_path or "build_openai_app" in import_path:
            llm = _llm_demands(app, app_name, app_path)
            out.extend(llm)
        deps = app.get("deployments")
        # A Serve LLM app's `deployments` entries only override options of the deployments
        # its builder creates (counted above); counting them again would double the demand.
        if isinstance(deps, list) and not llm:
            for j, dep in enumerate(deps):
                if isinstance(dep, dict):
                    name = f"{app_name}/{dep.get('name', f'#{j}')}"
                    d = _deployment_demand(name, dep, f"{app_path}.deployments[{j}]")
                    if d is not None:
                        out.append(d)
    return out


def _placeable(d: ServeDemand, types: list[NodeType]) -> list[str]:
    """Why ``d``'s bundles fit no node type (empty when every bundle fits somewhere)."""
    usable = [t for t in types if t.max_count > 0]
    bundles = list(d.bundles)
    if d.strategy == "STRICT_PACK":
        bundles = [d.per_replica]
    problems = []
    for i, b in enumerate(bundles):
        if not any(t.fits(b) for t in usable):
            which = (
                "all bundles together (STRICT_PACK)"
                if d.strategy == "STRICT_PACK"
                else (f"bundle {i}" if len(d.bundles) > 1 else "one replica")
            )
            problems.append(f"{which} needs {_fmt_res(b)}")
    return problems


def _types_text(types: list[NodeType]) -> str:
    parts = []
    for t in types:
        if t.max_count > 0:
            parts.append(t.describe())
        elif not t.group.is_head:
            parts.append(f"{t.describe()} with 0 pods (replicas 0, autoscaling off)")
    return "; ".join(parts) or "no node group can have pods"


# --------------------------------------------------------------------------------------------
# Demand: Ray Train
# --------------------------------------------------------------------------------------------


def _train_v2_env(m: Manifest) -> bool | None:
    for g in groups(m):
        env = g.container.get("env")
        if isinstance(env, list):
            for e in env:
                if isinstance(e, dict) and e.get("name") == "RAY_TRAIN_V2_ENABLED":
                    return str(e.get("value", "")).strip().lower() in ("1", "true")
    return None


def _train_bundles(
    call: ScalingConfigCall, v2: bool
) -> tuple[dict[str, float], dict[str, float], float] | None:
    """(worker bundle, rank-0 bundle, trainer CPU) as Ray Train builds them; None if unknown."""
    if "resources_per_worker" in call.unresolved or "use_gpu" in call.unresolved:
        return None
    if call.resources_per_worker is None:
        worker = {"GPU": 1.0} if call.use_gpu else {"CPU": 1.0}
    else:
        worker = {k: v for k, v in call.resources_per_worker.items() if v != 0}
    if call.use_gpu:
        worker.setdefault("GPU", 1.0)
    if v2:
        return worker, dict(worker), 0.0
    if "trainer_resources" in call.unresolved:
        return None
    trainer = call.trainer_resources if call.trainer_resources is not None else {"CPU": 1.0}
    rank0 = dict(worker)
    for k, v in trainer.items():
        rank0[k] = rank0.get(k, 0.0) + v
    return worker, rank0, trainer.get("CPU", 0.0)


def _script_clusters(inv: Inventory, file: str) -> list[Manifest]:
    """Clusters a script runs on: RayJobs whose entrypoint names the file, else all clusters."""
    base = PurePath(file).name
    jobs = [
        m
        for m in inv.of_kind("RayJob")
        if isinstance(m.body.get("spec"), dict)
        and base in str(m.body["spec"].get("entrypoint", ""))
    ]
    if jobs:
        return jobs
    return inv.of_kind("RayCluster", "RayJob")


def _train_version(call: ScalingConfigCall, m: Manifest) -> tuple[bool | None, str]:
    """(Train v2?, why) for a script on cluster ``m``; None when nothing says which.

    RAY_TRAIN_V2_ENABLED in the script, else in the cluster's env, else the default of the
    Ray version the cluster runs (v2 from Ray 2.51; below it, Train v1 puts the trainer's
    resources into bundle 0).
    """
    if call.train_v2 is not None:
        return call.train_v2, f"RAY_TRAIN_V2_ENABLED={int(call.train_v2)} in {call.file}"
    env = _train_v2_env(m)
    if env is not None:
        return env, f"RAY_TRAIN_V2_ENABLED={int(env)} in the pods of {m.ref}"
    v = ray_version(m)
    if v is None:
        return None, f"{m.ref} names no Ray version; Train v2 is the default from Ray 2.51"
    v2 = v.at_least(TRAIN_V2_DEFAULT_FROM)
    return v2, f"{v.describe()}: Train {'v2' if v2 else 'v1'} is its default"


@rule("train-coordinator-cpu", versions={"ray": "all"})
def train_coordinator_cpu(inv: Inventory) -> Iterator[Finding]:
    """Ray Train v1 adds the trainer's CPU to bundle 0; no node type can hold it."""
    for call in inv.scaling_configs:
        for m in _script_clusters(inv, call.file):
            v2, why = _train_version(call, m)
            if v2 is True:
                continue
            built = _train_bundles(call, v2=False)
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
                f"({fmt_num(wcpu)} + {fmt_num(trainer_cpu)} trainer) {_fmt_res(rank0)}, but the "
                f"largest node type of {m.ref} advertises {fmt_num(best)} CPU "
                f"({_types_text(types)}). The job stays PENDING forever and the autoscaler calls "
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


def _entrypoint_bundle(spec: dict[str, Any]) -> dict[str, float] | None:
    res: dict[str, float] = {}
    for key, name in (("entrypointNumCpus", "CPU"), ("entrypointNumGpus", "GPU")):
        v = _num(spec.get(key))
        if v:
            res[name] = v
    raw = spec.get("entrypointResources")
    if isinstance(raw, str) and raw.strip():
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return None
        extra = _bundle_of(parsed)
        if extra is None:
            return None
        res.update(extra)
    return res or None


@rule("infeasible-request", versions={"ray": "all", "kuberay": "all"})
def infeasible_request(inv: Inventory) -> Iterator[Finding]:
    """A replica, bundle, Train worker or job driver that no node type can hold, even empty."""
    for m in inv.of_kind(*RAY_KINDS):
        types = node_types(m)
        if not any(t.max_count > 0 for t in types):
            continue
        for d in serve_demands(m):
            problems = _placeable(d, types)
            if problems:
                yield Finding.at(
                    "infeasible-request",
                    "error",
                    m,
                    d.path,
                    f"Serve deployment {d.name}: {'; '.join(problems)} ({d.source}), but no "
                    f"node type can hold it even empty ({_types_text(types)}). Ray logs "
                    '"No available node types can fulfill resource request" and the autoscaler '
                    "never scales up for it: the replica stays PENDING.",
                    "Lower the request (num_cpus/num_gpus/bundles) to fit a worker group, or "
                    "add/enlarge a worker group (limits or rayStartParams) that can hold it.",
                )
        spec = m.body.get("spec")
        if m.kind == "RayJob" and isinstance(spec, dict):
            bundle = _entrypoint_bundle(spec)
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
                    f"The job driver needs {_fmt_res(bundle)} but no node type can hold it "
                    f"({_types_text(types)}): the entrypoint never starts.",
                    "Lower entrypointNumCpus/entrypointNumGpus/entrypointResources, or give a "
                    "group the resources.",
                )
    for call in inv.scaling_configs:
        for m in _script_clusters(inv, call.file):
            types = [t for t in node_types(m) if t.max_count > 0]
            built = _train_bundles(call, v2=True)
            if built is None or not types:
                continue
            worker = built[0]
            if not any(t.fits(worker) for t in types):
                yield Finding.at(
                    "infeasible-request",
                    "error",
                    call,
                    "resources_per_worker",
                    f"Each Train worker needs {_fmt_res(worker)} but no node type of {m.ref} can "
                    f"hold it even empty ({_types_text(types)}): every worker stays PENDING and "
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
        for m in _script_clusters(inv, req.file):
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
                + f" needs {_fmt_res(b)}"
                for i, b in bad
            )
            yield Finding.at(
                "infeasible-request",
                "error",
                req,
                "placement_group" if req.kind == "placement_group" else "resources",
                f"{what}: {needs}, but no node type of {m.ref} can hold it even empty "
                f'({_types_text(types)}): Ray logs "No available node types can fulfill '
                'resource request" and it stays pending; the autoscaler never adds a node for it.',
                "Lower the request to fit a worker group, or add a group whose pods advertise it.",
            )


# --------------------------------------------------------------------------------------------
# ingress-starved
# --------------------------------------------------------------------------------------------


def _pack(
    demands: list[tuple[str, dict[str, float]]], types: list[NodeType], slots: int
) -> list[str]:
    """First-fit decreasing of bundles over node instances; returns the names left unplaced."""
    nodes: list[tuple[NodeType, dict[str, float]]] = []
    for t in types:
        for _ in range(min(t.max_count, slots)):
            nodes.append((t, dict(t.capacity)))
    order = sorted(demands, key=lambda d: (-d[1].get("GPU", 0.0), -d[1].get("CPU", 0.0), d[0]))
    unplaced = []
    for name, bundle in order:
        for t, free in nodes:
            if fits(bundle, free, t.unknown):
                for k, v in bundle.items():
                    if k in free:
                        free[k] -= v
                break
        else:
            unplaced.append(name)
    return unplaced


@rule("ingress-starved", versions="all")
def ingress_starved(inv: Inventory) -> Iterator[Finding]:
    """At min replicas, replicas and bundles leave no CPU for another deployment (the ingress)."""
    for m in inv.of_kind("RayService"):
        types = [t for t in node_types(m) if t.max_count > 0]
        if not types or not _cpu_known(types):
            continue
        demands = [d for d in serve_demands(m) if not _placeable(d, types)]
        items: list[tuple[str, dict[str, float]]] = []
        for d in demands:
            for r in range(d.min_replicas):
                bundles = [d.per_replica] if d.strategy == "STRICT_PACK" else list(d.bundles)
                for b_i, b in enumerate(bundles):
                    items.append((f"{d.name}#{r}.{b_i}", b))
        if not items:
            continue
        unplaced = _pack(items, types, slots=len(items))
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
            f"the cluster can offer at most {fmt_num(have)} CPU ({_types_text(types)}), and "
            f'{", ".join(cpu_only)} cannot be placed: its replica stays pending ("total '
            'resources available: {}") and requests through it hang.',
            f"Give the cluster CPU for {', '.join(cpu_only)}: a CPU worker group, a larger CPU "
            "limit on the GPU group, or fewer CPUs per replica/bundle (num_cpus: 0 for a "
            "router that only forwards).",
        )


# --------------------------------------------------------------------------------------------
# serve-replicas-exceed-workers
# --------------------------------------------------------------------------------------------


def _replicas_per_pod(d: ServeDemand, t: NodeType) -> int:
    """Whole replicas of ``d`` one pod of ``t`` holds (unknown CPU/memory do not limit)."""
    if d.strategy == "STRICT_PACK" or len(d.bundles) == 1:
        need = d.per_replica
        counts = []
        for k, v in need.items():
            if (
                v <= 0
                or (k in ("CPU", "memory") and k not in t.capacity)
                or is_unknown(k, t.unknown)
            ):
                continue
            counts.append(math.floor(t.capacity.get(k, 0.0) / v + _EPS))
        return min(counts) if counts else 0
    return 0  # spread bundles: per-pod counting does not apply


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
        if len(demands) == 1 and need_max <= supply_max + _EPS:
            # GPUs suffice in total, but a pod may hold fewer replicas than its GPUs suggest
            # (CPU or memory run out first): count whole replicas per pod.
            fit = {t.label: _replicas_per_pod(first, t) for t in gpu_types}
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
                    f"({_fmt_res(first.per_replica)} each) but the worker groups can place only "
                    f"{room} ({fits_text}): a pod runs out of CPU or memory before its GPUs, so "
                    "the extra replicas stay PENDING.",
                    "Give the GPU pods enough CPU/memory for one replica per GPU, raise "
                    "maxReplicas, or lower max_replicas.",
                )
        if need_max > supply_max + _EPS:
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
        if supply_min > need_min + _EPS:
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
    pods = math.ceil(need_min / (per_pod * hosts) - _EPS) if need_min > 0 else 0
    current = t.min_count // hosts
    if pods < current:
        return (
            f"Set minReplicas of the {t.label} to {pods}: {pods} pod(s) × "
            f"{fmt_num(per_pod * hosts)} GPU hold the {fmt_num(need_min)} GPU(s) Serve needs "
            "at min_replicas."
        )
    per_replica = max(d.per_replica.get("GPU", 0.0) for d in demands)
    more = math.floor(supply_min / per_replica + _EPS) if per_replica > 0 else 0
    smaller = math.ceil(need_min / max(pods * hosts, 1) - _EPS)
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
                if abs(limit - advertised) < _EPS:
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
        any("gpu" in t.get("key", "") for t in taints)
        or any(
            k.startswith("karpenter.k8s.aws/instance-gpu")
            or (k == "karpenter.k8s.aws/instance-category" and set(v) and set(v) <= {"g", "p"})
            for k, _, v in reqs
        )
        or labels.get("accelerator", "").lower() in ("nvidia", "gpu")
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
    gpu = any(is_gpu_resource(str(k)) and (try_quantity(v) or 0) > 0 for k, v in cap.items())
    gpu = gpu or any("gpu" in t.get("key", "") for t in taints)
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


def _placements(inv: Inventory) -> list[PodPlacement]:
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
                if isinstance(lim, dict) and any(
                    is_gpu_resource(str(k)) or "gpumem" in str(k) for k in lim
                ):
                    wants_gpu = True
            out.append(PodPlacement(m, path, label, selector, tuple(terms), tols, wants_gpu))
    return out


def _selector_ok(p: PodPlacement, pool: Pool) -> bool:
    if not all(_expr_ok(pool, k, "In", (v,)) for k, v in p.node_selector.items()):
        return False
    if not p.terms:
        return True
    return any(all(_expr_ok(pool, *e) for e in term) for term in p.terms)


def _mismatch(p: PodPlacement, pool: Pool) -> str:
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


def _blocking(p: PodPlacement, pool: Pool) -> list[dict[str, str]]:
    return [
        t
        for t in pool.taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(p.tolerations, t)
    ]


def _taint_text(t: dict[str, str]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


@rule("node-selector-no-pool", versions="all")
def node_selector_no_pool(inv: Inventory) -> Iterator[Finding]:
    """The pod's nodeSelector/required affinity matches no known node pool."""
    pools = node_pools(inv)
    if not pools:
        return
    for p in _placements(inv):
        if not p.node_selector and not p.terms:
            continue
        if any(_selector_ok(p, pool) for pool in pools):
            continue
        wanted = ", ".join(f"{k}: {v}" for k, v in p.node_selector.items()) or "node affinity"
        why = "; ".join(sorted({_mismatch(p, pool) for pool in pools}))
        # Propose labels of pools of the pod's kind: a GPU group's fix names a GPU pool's
        # labels, never the CPU pool's (and the other way round), when there is one.
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
            "a GPU pool"
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
    for p in _placements(inv):
        if not p.wants_gpu:
            continue
        candidates = [pool for pool in pools if _selector_ok(p, pool)]
        gpu_candidates = [pool for pool in candidates if pool.gpu]
        if gpu_candidates:
            candidates = gpu_candidates
        if not candidates:
            candidates = [pool for pool in pools if pool.gpu]
        if not candidates or any(not _blocking(p, pool) for pool in candidates):
            continue
        blocked = {_taint_text(t): t for pool in candidates for t in _blocking(p, pool)}
        first = blocked[min(blocked)]
        yield Finding.at(
            "missing-gpu-toleration",
            "error",
            p.manifest,
            f"{p.path}.tolerations",
            f"{p.label} requests GPUs but tolerates none of the taints on the pools it can use "
            f"({', '.join(sorted({pool.source for pool in candidates}))}: "
            f"{', '.join(sorted(blocked))}): "
            'it never lands on a GPU node (FailedScheduling "had untolerated taint").',
            f'Add tolerations: [{{key: "{first.get("key")}", operator: "Exists", effect: '
            f'"{first.get("effect")}"}}] to the pod template.',
        )
