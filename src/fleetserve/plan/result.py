"""What the planner returns: the contract shared by ``plan``, ``serve`` and ``render``.

``PlanResult.model_dump(mode="json")`` is exactly what ``fleetserve plan --format json``
prints (keys may be added, never removed or renamed).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Frozen):
    """vLLM settings that follow from a replica's slice."""

    gpu_memory_utilization: float = Field(
        gt=0, le=1, description="Fraction of the WHOLE card (host RAM on a CPU host)."
    )
    max_num_seqs: int = Field(ge=1, description="vLLM max_num_seqs.")
    max_model_len: int = Field(ge=1, description="vLLM max_model_len.")
    max_num_batched_tokens: int = Field(ge=1, description="vLLM max_num_batched_tokens.")


class ReplicaPlacement(_Frozen):
    """One replica of one model, placed on a node of a pool."""

    model: str = Field(description="Model name (OpenAI id).")
    index: int = Field(ge=0, description="Replica index within the model.")
    pool: str = Field(description="Pool the node belongs to.")
    node: int = Field(ge=0, description="Node index within the pool.")
    gpus: list[int] = Field(description="Card indices on that node (empty: CPU only).")
    memory_mb: int = Field(ge=0, description="GPU memory per card (HAMi nvidia.com/gpumem).")
    cores_percent: int = Field(ge=0, le=100, description="HAMi nvidia.com/gpucores per card.")
    engine: EngineSettings = Field(description="Derived vLLM settings.")


class Unplaced(_Frozen):
    """A replica the planner could not place, and why (with the numbers and a fix)."""

    model: str
    index: int = Field(ge=0)
    reason: str


class PlanResult(_Frozen):
    """A placement of every replica of a fleet, or the reasons it cannot be placed."""

    feasible: bool
    gpus_used: int = Field(ge=0)
    nodes: dict[str, int] = Field(description="Nodes needed per pool.")
    optimality_gap: float | None = Field(
        description="Relative gap to the solver's bound (0 = proven optimal; None = heuristic "
        "without a bound)."
    )
    replicas: list[ReplicaPlacement]
    unplaced: list[Unplaced]
