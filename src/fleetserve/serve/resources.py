"""Ray logical resources of every deployment, and the check that they fit the cluster.

Design note. Ray schedules by logical resources, so a fleet whose replicas take every
logical CPU leaves the Serve ingress pending forever (seen with Ray Serve LLM on
``ray.init(num_cpus=2)``: a 1-CPU replica plus a 1-CPU placement bundle starved its
ingress; pitfall ``ingress-starved``). We therefore (1) give the ingress a small fixed
reservation instead of Ray's default 1 CPU, (2) count Serve's proxy (0 CPUs in Ray 2.60)
and every model replica at ``replicas.min``, node by node for the largest replica, and
(3) refuse the spec before anything starts, printing the sum. ``replicas.max`` beyond the
cluster is only a warning: on an autoscaling cluster new nodes can appear.

GPU replicas reserve ``tensor_parallel * pipeline_parallel`` whole GPUs, or - for a
replica on one GPU - its ``gpu_memory_utilization`` as a fractional GPU, so that Ray
co-locates replicas exactly when their memory fractions sum to at most one card.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import CapacityError
from fleetserve.spec import FleetSpec, ModelSpec
from fleetserve.units import bytes_to_gib, gib_to_bytes

#: Logical CPUs reserved by the (single) ingress replica: enough to be counted, small
#: enough never to be the reason a fleet does not fit.
INGRESS_CPUS = 0.1
#: Ray Serve's HTTP proxy actor reserves no logical CPU (``ray.serve._private``); kept in
#: the arithmetic so the message shows every actor that must schedule.
PROXY_CPUS = 0.0
#: Tolerance for float sums of fractional CPUs.
_EPS = 1e-9


@dataclass(frozen=True)
class ClusterCapacity:
    """What the Ray cluster offers: totals and the largest single node."""

    cpus: float
    gpus: float = 0.0
    memory_gb: float | None = None
    node_cpus: float | None = None
    node_gpus: float | None = None
    description: str = "the cluster"

    @classmethod
    def from_ray(cls, total: dict[str, float], nodes: list[dict[str, Any]]) -> ClusterCapacity:
        """From ``ray.cluster_resources()`` and ``ray.nodes()`` (alive nodes only)."""
        alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
        node_cpus = max((float(r.get("CPU", 0)) for r in alive), default=None)
        node_gpus = max((float(r.get("GPU", 0)) for r in alive), default=None)
        mem = total.get("memory")
        return cls(
            cpus=float(total.get("CPU", 0)),
            gpus=float(total.get("GPU", 0)),
            memory_gb=bytes_to_gib(float(mem)) if mem else None,
            node_cpus=node_cpus,
            node_gpus=node_gpus,
            description=f"the Ray cluster ({len(alive)} node{'s' if len(alive) != 1 else ''})",
        )


@dataclass(frozen=True)
class ReplicaResources:
    """Ray logical resources of one replica of a deployment."""

    num_cpus: float
    num_gpus: float = 0.0
    memory_bytes: int | None = None

    def ray_actor_options(self) -> dict[str, Any]:
        """As Ray Serve's ``ray_actor_options``."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        return options


@dataclass(frozen=True)
class ResourcePlan:
    """Resources of the ingress and of each model's replicas, and any warnings."""

    ingress: ReplicaResources
    models: dict[str, ReplicaResources]
    warnings: list[str] = field(default_factory=list)


def replica_resources(
    model: ModelSpec, settings: EngineSettings, *, gpu_cluster: bool
) -> ReplicaResources:
    """The Ray resources one replica of ``model`` reserves."""
    gpus = 0.0
    if gpu_cluster:
        if model.gpus_per_replica > 1:
            gpus = float(model.gpus_per_replica)
        else:
            gpus = round(settings.gpu_memory_utilization, 4)
    memory = None
    if model.resources.memory_gb is not None:
        memory = gib_to_bytes(model.resources.memory_gb)
    return ReplicaResources(num_cpus=model.resources.cpu, num_gpus=gpus, memory_bytes=memory)


def plan_resources(
    spec: FleetSpec, settings: dict[str, EngineSettings], *, gpu_cluster: bool
) -> ResourcePlan:
    """Resources of every deployment, without checking them against a cluster."""
    models = {
        m.name: replica_resources(m, settings[m.name], gpu_cluster=gpu_cluster) for m in spec.models
    }
    return ResourcePlan(ingress=ReplicaResources(num_cpus=INGRESS_CPUS), models=models)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def fit_resources(
    spec: FleetSpec, settings: dict[str, EngineSettings], capacity: ClusterCapacity
) -> ResourcePlan:
    """Resources of every deployment, checked to schedule at ``replicas.min``.

    Raises :class:`CapacityError` naming the arithmetic when ingress + proxy + all
    minimum replicas exceed the cluster, or one replica exceeds the largest node.
    """
    plan = plan_resources(spec, settings, gpu_cluster=capacity.gpus > 0)
    problems: list[str] = []
    warnings: list[str] = []

    # CPUs: the sum at min replicas, written out term by term.
    terms = [f"ingress {_fmt(plan.ingress.num_cpus)}", f"proxy {_fmt(PROXY_CPUS)}"]
    need = plan.ingress.num_cpus + PROXY_CPUS
    need_max = need
    for m in spec.models:
        r = plan.models[m.name]
        terms.append(f"{m.name} {_fmt(r.num_cpus)} x {m.replicas.min}")
        need += r.num_cpus * m.replicas.min
        need_max += r.num_cpus * m.replicas.max
    if need > capacity.cpus + _EPS:
        problems.append(
            f"the fleet needs {_fmt(need)} logical CPUs at min replicas but "
            f"{capacity.description} has {_fmt(capacity.cpus)}: {' + '.join(terms)} = "
            f"{_fmt(need)} > {_fmt(capacity.cpus)}; lower models[].resources.cpu or "
            "models[].replicas.min"
        )
    elif need_max > capacity.cpus + _EPS:
        warnings.append(
            f"at max replicas the fleet needs {_fmt(need_max)} logical CPUs, "
            f"{capacity.description} has {_fmt(capacity.cpus)}: autoscaling stops earlier "
            "unless the cluster adds nodes"
        )

    # GPUs: only when the cluster has any (on a CPU host the engine runs on CPUs).
    if capacity.gpus > 0:
        gterms, gneed = [], 0.0
        for m in spec.models:
            r = plan.models[m.name]
            gterms.append(f"{m.name} {_fmt(r.num_gpus)} x {m.replicas.min}")
            gneed += r.num_gpus * m.replicas.min
        if gneed > capacity.gpus + _EPS:
            problems.append(
                f"the fleet needs {_fmt(gneed)} GPUs at min replicas but "
                f"{capacity.description} has {_fmt(capacity.gpus)}: {' + '.join(gterms)} = "
                f"{_fmt(gneed)} > {_fmt(capacity.gpus)}"
            )

    # Memory reservations, when the spec asks for them.
    if capacity.memory_gb is not None:
        mneed = sum((m.resources.memory_gb or 0) * m.replicas.min for m in spec.models)
        if mneed > capacity.memory_gb + _EPS:
            problems.append(
                f"the fleet reserves {_fmt(mneed)} GiB of memory at min replicas but "
                f"{capacity.description} has {_fmt(capacity.memory_gb)} GiB for Ray"
            )

    # One replica must fit one node.
    for m in spec.models:
        r = plan.models[m.name]
        if capacity.node_cpus is not None and r.num_cpus > capacity.node_cpus + _EPS:
            problems.append(
                f"a replica of '{m.name}' needs {_fmt(r.num_cpus)} CPUs but the largest "
                f"node has {_fmt(capacity.node_cpus)}"
            )
        if (
            capacity.gpus > 0
            and capacity.node_gpus is not None
            and r.num_gpus > capacity.node_gpus + _EPS
        ):
            problems.append(
                f"a replica of '{m.name}' needs {_fmt(r.num_gpus)} GPUs but the largest "
                f"node has {_fmt(capacity.node_gpus)}"
            )
    if problems:
        raise CapacityError("; ".join(problems))
    return ResourcePlan(ingress=plan.ingress, models=plan.models, warnings=warnings)
