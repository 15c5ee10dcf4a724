"""fleetserve.plan: the memory model, the GPU and model catalogues, and the packer.

Public API: :func:`plan_fleet` (a fleet onto its pools), :func:`plan_local` with
:class:`LocalHost` (``fleetserve serve`` on this machine), and the memory model in
:mod:`fleetserve.plan.memory` (``load_model_config``, ``weight_bytes``,
``kv_bytes_per_token``, ``estimate_replica``).
"""

from fleetserve.engine.settings import EngineSettings
from fleetserve.plan.local import LocalHost, plan_local
from fleetserve.plan.planner import plan_fleet
from fleetserve.plan.result import (
    PlanResult,
    PoolUsage,
    ReplicaPlacement,
    Unplaced,
)

__all__ = [
    "EngineSettings",
    "LocalHost",
    "PlanResult",
    "PoolUsage",
    "ReplicaPlacement",
    "Unplaced",
    "plan_fleet",
    "plan_local",
]
