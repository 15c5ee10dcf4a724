"""The check that every deployment's Ray resources fit the cluster.

Design note. Ray schedules by logical resources, so a fleet whose replicas take every
logical CPU leaves the Serve ingress pending forever (seen with Ray Serve LLM on
``ray.init(num_cpus=2)``: a 1-CPU replica plus a 1-CPU placement bundle starved its
ingress; pitfall ``ingress-starved``). We therefore (1) give the ingress a small fixed
reservation instead of Ray's default 1 CPU, (2) count Serve's proxy (0 CPUs in Ray 2.60)
and every model replica at ``replicas.min``, node by node for the largest replica, and
(3) refuse the spec before anything starts, printing the sum. ``replicas.max`` beyond the
cluster is only a warning: on an autoscaling cluster new nodes can appear.

What each replica reserves is the plan's (:mod:`fleetserve.plan.deployment`); this module
only adds it up against what the cluster offers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetserve.errors import CapacityError
from fleetserve.plan.deployment import FleetDeployment
from fleetserve.spec import FleetSpec
from fleetserve.units import bytes_to_gib

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


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def fit_resources(
    spec: FleetSpec, deployment: FleetDeployment, capacity: ClusterCapacity
) -> list[str]:
    """Check that ``deployment`` schedules at ``replicas.min``; returns warnings.

    Raises :class:`CapacityError` naming the arithmetic when ingress + proxy + all
    minimum replicas exceed the cluster, or one replica exceeds the largest node.
    """
    ingress = deployment.ingress
    models = {name: m.ray for name, m in deployment.models.items()}
    problems: list[str] = []
    warnings: list[str] = []

    # CPUs: the sum at min replicas, written out term by term.
    terms = [f"ingress {_fmt(ingress.num_cpus)}", f"proxy {_fmt(PROXY_CPUS)}"]
    need = ingress.num_cpus + PROXY_CPUS
    need_max = need
    for m in spec.models:
        r = models[m.name]
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
            r = models[m.name]
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
        r = models[m.name]
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
    return warnings
