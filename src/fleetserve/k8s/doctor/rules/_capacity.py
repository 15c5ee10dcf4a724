"""Scheduling facts, Ray layer: what each node group offers and what Serve, Train and jobs ask.

Design note: supply is one :class:`NodeType` per Ray node group (``ray_objects.GroupView``'s
advertised resources, at most ``maxReplicas x numOfHosts`` pods, ``replicas`` when autoscaling
is off); demand is a :class:`ServeDemand` per Serve deployment (``ray_actor_options``,
placement-group bundles, Ray Serve LLM's per-model placement group plus its ingress), Ray Train
bundles (v1 adds the trainer's ``{"CPU": 1}`` to bundle 0; v2 - Ray's default from 2.51 - does
not) and a RayJob's entrypoint. A value Ray would auto-detect (no CPU limit, Neuron devices...)
is unknown and assumed to fit: a false alarm costs as much trust as a miss. The rules in
``scheduling.py`` only compare these facts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from fleetserve.k8s.doctor.inventory import Inventory, Manifest, ScalingConfigCall
from fleetserve.k8s.doctor.ray_objects import (
    GroupView,
    accelerator_family,
    as_dict,
    autoscaling_enabled,
    fmt_num,
    groups,
    head_group,
    is_unknown,
    serve_apps,
    try_quantity,
    worker_groups,
)
from fleetserve.k8s.doctor.rules._engines import out_of_bounds
from fleetserve.k8s.doctor.rules._versions import TRAIN_V2_DEFAULT_FROM, ray_version

UNBOUNDED = 2_147_483_647
EPS = 1e-9


def fmt_res(res: dict[str, float]) -> str:
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
        """``worker group 'tpu' (TPU pods) {CPU: 24, TPU: 4}`` for messages."""
        family = accelerator_family(self.group)
        return f"{self.label}{f' ({family} pods)' if family else ''} {fmt_res(self.capacity)}"

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
        if capacity.get(k, 0.0) + EPS < v:
            return False
    return True


def cpu_known(types: list[NodeType]) -> bool:
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
        if out_of_bounds("tensor_parallel_size", tp) or out_of_bounds("pipeline_parallel_size", pp):
            continue  # vLLM refuses it (engine-arg-invalid): there is no placement group
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
    out: list[ServeDemand] = []
    for app in serve_apps(m):
        llm = _llm_demands(app.body, app.name, app.path) if app.is_serve_llm else []
        out.extend(llm)
        # A Serve LLM app's `deployments` entries only override options of the deployments
        # its builder creates (counted above); counting them again would double the demand.
        if llm:
            continue
        for dep in app.deployments:
            d = _deployment_demand(dep.name, dep.body, dep.path)
            if d is not None:
                out.append(d)
    return out


def placeable(d: ServeDemand, types: list[NodeType]) -> list[str]:
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
            problems.append(f"{which} needs {fmt_res(b)}")
    return problems


def types_text(types: list[NodeType]) -> str:
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


def train_bundles(
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


def script_clusters(inv: Inventory, file: str) -> list[Manifest]:
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


def train_version(call: ScalingConfigCall, m: Manifest) -> tuple[bool | None, str]:
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


def entrypoint_bundle(spec: dict[str, Any]) -> dict[str, float] | None:
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


def pack(
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


def replicas_per_pod(d: ServeDemand, t: NodeType) -> int:
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
            counts.append(math.floor(t.capacity.get(k, 0.0) / v + EPS))
        return min(counts) if counts else 0
    return 0  # spread bundles: per-pod counting does not apply
