"""What the planner returns: the contract shared by ``plan``, ``serve`` and ``render``.

``PlanResult.model_dump(mode="json")`` is exactly what ``fleetserve plan --format json``
prints (keys may be added, never removed or renamed).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The engine owns its settings; the plan contract carries them (ReplicaPlacement.engine).
from fleetserve.engine.settings import EngineSettings


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaNode(_Frozen):
    """One node a replica runs on, and the pipeline stages it holds there."""

    node: int = Field(ge=0, description="Node index within the replica's pool.")
    gpus: list[int] = Field(description="Card indices on that node (empty: CPU only).")
    stages: list[int] = Field(
        default_factory=lambda: [0],
        description="Pipeline stages (0-based, consecutive) whose tensor-parallel ranks run "
        "on these cards.",
    )


class ReplicaPlacement(_Frozen):
    """One replica of one model, placed on one node of a pool - or, with pipeline stages
    across nodes, on several nodes of one pool (``nodes``)."""

    model: str = Field(description="Model name (OpenAI id).")
    index: int = Field(ge=0, description="Replica index within the model.")
    pool: str = Field(description="Pool the node belongs to.")
    node: int = Field(
        ge=0, description="Node index within the pool (the first node when it spans several)."
    )
    gpus: list[int] = Field(
        description="Card indices on that node (empty: CPU only); a replica spanning nodes "
        "holds more cards on the other entries of ``nodes``."
    )
    nodes: list[ReplicaNode] = Field(
        default_factory=list,
        description="Every node the replica runs on, in pipeline-stage order: one entry "
        "(``node``/``gpus``) for a replica within a node; pipeline_parallel / stages-per-node "
        "entries of tensor_parallel x stages-per-node cards each when its stages cross nodes "
        "(vLLM's Ray executor: tensor-parallel groups within a node, stages across). Filled "
        "from ``node``/``gpus`` when not given; its first entry is always ``node``/``gpus``.",
    )
    memory_mb: int = Field(ge=0, description="GPU memory per card (HAMi nvidia.com/gpumem).")
    cores_percent: int = Field(ge=0, le=100, description="HAMi nvidia.com/gpucores per card.")
    engine: EngineSettings = Field(description="Derived vLLM settings.")
    tenant: str | None = Field(default=None, description="Owning tenant (None: untenanted).")
    gpu_type: str | None = Field(default=None, description="Card type (catalogue name).")
    card_memory_mb: int = Field(default=0, ge=0, description="Memory of one card (MiB).")
    num_gpus: float = Field(
        default=0,
        ge=0,
        description="Ray num_gpus of the replica actor: a fraction of one card for a slice, "
        "the card count (tensor_parallel x pipeline_parallel) for whole cards.",
    )
    tensor_parallel: int = Field(default=1, ge=1, description="vLLM tensor_parallel_size.")
    pipeline_parallel: int = Field(default=1, ge=1, description="vLLM pipeline_parallel_size.")
    whole_cards: bool = Field(
        default=False, description="True when the replica owns its cards (HAMi gpucores 100)."
    )
    need_mb: int = Field(
        default=0, ge=0, description="Memory the engine itself is planned to use per card (MiB)."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_node_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("nodes") and "node" in data:
            stages = list(range(int(data.get("pipeline_parallel", 1))))
            one = {"node": data["node"], "gpus": list(data.get("gpus", [])), "stages": stages}
            data = {**data, "nodes": [one]}
        return data

    @model_validator(mode="after")
    def _first_node_is_node(self) -> ReplicaPlacement:
        if len(self.nodes) > 1:
            first = self.nodes[0]
            if first.node != self.node or first.gpus != self.gpus:
                raise ValueError("nodes[0] must be the replica's node and gpus (its first node)")
            if len({n.node for n in self.nodes}) != len(self.nodes):
                raise ValueError("a replica's nodes must be distinct")
        return self

    @property
    def spans(self) -> list[ReplicaNode]:
        """The nodes the replica runs on: ``nodes`` when it spans several, else its one
        node from ``node``/``gpus`` (the source of truth there, also in a model_copy)."""
        if len(self.nodes) > 1:
            return list(self.nodes)
        stages = self.nodes[0].stages if self.nodes else list(range(self.pipeline_parallel))
        return [ReplicaNode(node=self.node, gpus=list(self.gpus), stages=stages)]

    @property
    def gpus_total(self) -> int:
        """Cards over all of the replica's nodes."""
        return sum(len(n.gpus) for n in self.spans)


class Unplaced(_Frozen):
    """A replica the planner could not place, and why (with the numbers and a fix)."""

    model: str
    index: int = Field(ge=0)
    reason: str
    resource: str | None = Field(
        default=None,
        description="The constraint that binds: gpu_memory / gpu_count / gpu_capability / "
        "engine (fits no card or vLLM refuses it), pool (no pool to run on); or, for a "
        "replica that fits a card, the constraint that kept it out of the pools: capacity "
        "(GPU memory of every card), isolation (dedicated tenants), memory (host RAM), cpu, "
        "gpu_slices (HAMi deviceSplitCount), gpu_cores; search (a limit cut the search).",
    )
    shortfall: float | None = Field(
        default=None, description="By how much (MiB for memory, cards, CPUs)."
    )
    fixes: list[str] = Field(default_factory=list, description="What would make it fit.")


class TrafficPlan(_Frozen):
    """How a model with ``traffic`` is planned: the option chosen, why that many replicas,
    and the latencies predicted at the rate (or why its SLOs cannot be met)."""

    model: str = Field(description="Model name.")
    rate: float = Field(ge=0, description="Requests per second planned for (traffic.rate).")
    met: bool = Field(description="Whether the placed replicas serve the rate within the SLOs.")
    replicas: int = Field(ge=0, description="Replicas placed.")
    needed: int = Field(ge=0, description="Replicas the rate needs (at least replicas.min).")
    gpu_type: str | None = Field(default=None, description="Card type of the option chosen.")
    pools: list[str] = Field(default_factory=list, description="Pools its replicas are on.")
    tensor_parallel: int = Field(default=1, ge=1, description="vLLM tensor_parallel_size.")
    max_num_seqs: int = Field(default=0, ge=0, description="vLLM max_num_seqs.")
    memory_mb: int = Field(default=0, ge=0, description="HAMi gpumem per card (MiB).")
    cores_percent: int = Field(default=0, ge=0, le=100, description="HAMi gpucores per card.")
    goodput_per_replica: float = Field(
        default=0.0,
        ge=0,
        description="Requests per second one replica serves within every SLO (its goodput).",
    )
    binding: str = Field(
        description="What sets the replica count: ttft, tpot, throughput (the batch or the "
        "prefill chunk saturates), kv_capacity (the KV cache holds fewer sequences than "
        "max_num_seqs), replicas_min, or - nothing meeting the SLOs - memory (fits no card); "
        "card_sharing: the count is met, but an SLO breaks beside the engines its cards "
        "hold (see beside)."
    )
    reason: str = Field(description="The binding constraint (or the infeasibility) in numbers.")
    beside: int = Field(
        default=0,
        ge=0,
        description="The most other replicas on one card with one of its replicas: without "
        "MPS the card takes the engines in turns, and each of its steps waits on theirs - a "
        "neighbour planned from its traffic for its steady step, one of unknown load for a "
        "full turn (counted in the latencies below).",
    )
    own_cards: bool = Field(
        default=False,
        description="Its replicas hold whole cards although slices would hold them: on "
        "shared cards an SLO broke beside the other engines (the reason says which), and "
        "the fleet was planned again around whole cards for it.",
    )
    ttft_ms: dict[str, float] = Field(
        default_factory=dict, description="Predicted TTFT per percentile at the rate (ms)."
    )
    tpot_ms: dict[str, float] = Field(
        default_factory=dict, description="Predicted TPOT per percentile at the rate (ms)."
    )
    cost_per_hour: float | None = Field(
        default=None,
        description="Its replicas' share of the pools' prices: each replica's share of a "
        "card (memory, cores or slice count, the largest) x the price per card (None: no "
        "prices).",
    )


class PoolUsage(_Frozen):
    """What the plan uses of one pool."""

    name: str = Field(description="Pool name.")
    gpu_type: str | None = Field(description="Card type (None: CPU-only pool).")
    card_memory_mb: int = Field(ge=0, description="Memory of one card (MiB).")
    gpus_per_node: int = Field(ge=0, description="Cards per node.")
    nodes: int = Field(ge=0, description="Nodes the plan needs (at least min_nodes).")
    gpus_used: int = Field(ge=0, description="Cards holding at least one replica.")
    memory_used_mb: int = Field(ge=0, description="Sum of the slices on those cards (MiB).")
    replicas: int = Field(ge=0, description="Replicas placed in this pool.")
    cost_per_hour: float | None = Field(
        default=None, description="nodes x the pool's cost_per_hour (None: no prices given)."
    )


class PlanResult(_Frozen):
    """A placement of every replica of a fleet, or the reasons it cannot be placed."""

    feasible: bool
    gpus_used: int = Field(ge=0)
    nodes: dict[str, int] = Field(description="Nodes needed per pool.")
    optimality_gap: float | None = Field(
        description="Relative gap of gpus_used to lower_bound (0 = GPUs proven optimal); "
        "None unless placing the most replicas possible is proven."
    )
    replicas: list[ReplicaPlacement]
    unplaced: list[Unplaced]
    scenario: str = Field(
        default="min",
        description="'min' or 'max' replicas, 'local' (this host), or 'unsized' "
        "(from the spec alone: plan.local.plan_unsized).",
    )
    solver: str = Field(
        default="heuristic",
        description="What produced the placement: 'milp' (HiGHS), 'heuristic', or 'local'.",
    )
    lower_bound: float | None = Field(
        default=None, description="Proven lower bound on gpus_used (when known)."
    )
    pools: list[PoolUsage] = Field(default_factory=list, description="Per-pool summary.")
    cost_per_hour: float | None = Field(
        default=None,
        description="Price of the plan's nodes per hour: sum of nodes x pools[].cost_per_hour "
        "(None: no prices given).",
    )
    optimal: list[str] = Field(
        default_factory=list,
        description="Objective levels proven optimal, in the order they are optimised: "
        "'replicas' (most placed), 'cost' (only with prices), 'gpus', 'nodes'. Each claim "
        "holds given the levels before it.",
    )
    search_limit: str | None = Field(
        default=None,
        description="What cut the exact search short (node limit, time-limit safety net, "
        "instance size, solver off), as a sentence; None when it ran to the end or the "
        "bounds proved the heuristic optimal.",
    )
    traffic: list[TrafficPlan] = Field(
        default_factory=list,
        description="Per model with traffic (spec order): the option chosen, the binding "
        "constraint and the predicted latencies; empty when no model has traffic.",
    )
