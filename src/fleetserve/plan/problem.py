"""The packing problem the planner solves, as plain data (no spec, no I/O).

A :class:`Problem` is a list of replicas (:class:`Item`), each with what it needs on every
pool it may use (:class:`Demand`), and the node types (:class:`PoolShape`). A
:class:`Packing` assigns items to ``(pool, node, cards)`` - or, for a replica whose
pipeline stages cross nodes, to the same number of cards on several distinct nodes of one
pool (host RAM and CPUs reserved on each). Both packers (the heuristic and
the MILP) read a Problem and return a Packing; :func:`check_packing` states every rule a
packing must keep, and the tests run it on every plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: HAMi's devicePlugin.deviceSplitCount default: at most this many slices share a card.
DEVICE_SPLIT_COUNT = 10


@dataclass(frozen=True)
class PoolShape:
    """One node type: its cards and allocatable CPU/RAM."""

    name: str
    gpu_type: str
    card_mb: int
    cards_per_node: int
    cpu: float
    ram_mb: int
    max_nodes: int | None
    min_nodes: int = 0
    split_count: int = DEVICE_SPLIT_COUNT
    cost_per_hour: float = 0.0
    """Price of one node per hour (0: no price given)."""


@dataclass(frozen=True)
class Demand:
    """What one replica takes on one pool."""

    mem_mb: int
    """Per card (the HAMi slice, margin included); card_mb for whole cards."""
    cores: int
    """HAMi gpucores per card (100 for whole cards)."""
    cards: int
    """Cards it takes on each of its nodes; > 1 or ``whole`` means whole cards."""
    whole: bool
    cpu: float
    """CPUs it reserves on each of its nodes."""
    ram_mb: int
    """Host RAM it reserves on each of its nodes (MiB)."""
    nodes: int = 1
    """Distinct nodes of one pool it spans (> 1: pipeline stages across nodes, each node
    holding ``cards`` whole cards; vLLM's Ray executor runs the stages)."""

    @property
    def total_cards(self) -> int:
        return self.cards * self.nodes


@dataclass(frozen=True)
class Item:
    """One replica to place."""

    model: str
    index: int
    tenant: str | None
    dedicated: bool
    demands: dict[str, Demand]
    """Pool name -> demand, for the pools it is allowed on and fits."""
    option: str | None = None
    """For a model planned from its traffic (a :class:`Choice`): the candidate
    configuration (card, TP, max_num_seqs) this copy is one of. Such copies are optional:
    one option per model is used, as many of its copies as the rate needs."""
    capacity: float = 0.0
    """Requests per second one replica of ``option`` serves within the model's SLOs."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.model, self.index)

    def size(self) -> float:
        """Sort key of the decreasing orders: cards x the largest share of a card."""
        return max(d.total_cards * d.mem_mb for d in self.demands.values()) if self.demands else 0.0


@dataclass(frozen=True)
class Choice:
    """A model planned from its traffic: the packing uses one of its options (the
    :attr:`Item.option` of its optional copies) and places enough of that option's copies
    to serve ``rate`` requests per second, and at least ``min_replicas``."""

    model: str
    rate: float
    min_replicas: int = 0


@dataclass(frozen=True)
class Problem:
    """Items and pools; ``policy_*`` are HAMi's two levels."""

    items: tuple[Item, ...]
    pools: tuple[PoolShape, ...]
    policy_node: str = "spread"
    policy_gpu: str = "binpack"
    choices: tuple[Choice, ...] = ()

    @property
    def priced(self) -> bool:
        """Whether cost is an objective (some pool has a price)."""
        return any(p.cost_per_hour > 0 for p in self.pools)

    def pool(self, name: str) -> PoolShape:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True)
class Assignment:
    """Where one item went: ``cards`` on ``node``, and for a replica spanning several
    nodes, the further ``(node, cards)`` parts in pipeline-stage order."""

    pool: str
    node: int
    cards: tuple[int, ...]
    others: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def parts(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Every ``(node, cards)`` the item holds, the first node first."""
        return ((self.node, self.cards), *self.others)


@dataclass
class Packing:
    """A solution: assignments, what stayed out, and how good it is."""

    assigned: dict[tuple[str, int], Assignment] = field(default_factory=dict)
    unplaced: list[tuple[str, int]] = field(default_factory=list)
    solver: str = "heuristic"
    gap: float | None = None
    lower_bound: float | None = None
    proven: tuple[str, ...] = ()
    """Objective levels proven optimal, a prefix of :data:`OBJECTIVES`."""
    limit: str | None = None
    """What cut the exact search short, as a sentence (None: nothing did)."""

    def cards_used(self) -> set[tuple[str, int, int]]:
        return {
            (a.pool, n, c) for a in self.assigned.values() for n, cards in a.parts for c in cards
        }

    def node_set(self) -> set[tuple[str, int]]:
        """Every (pool, node) holding a replica."""
        return {(a.pool, n) for a in self.assigned.values() for n, _ in a.parts}

    def nodes_used(self) -> dict[str, int]:
        """Per pool: nodes in use (highest node index + 1, nodes are numbered densely)."""
        out: dict[str, int] = {}
        for pool, n in self.node_set():
            out[pool] = max(out.get(pool, 0), n + 1)
        return out


def gpus_used(packing: Packing) -> int:
    return len(packing.cards_used())


#: The planner's objective, lexicographic: most replicas placed, then the lowest cost
#: (only when pools have prices), then fewest GPUs, then fewest nodes.
OBJECTIVES = ("replicas", "cost", "gpus", "nodes")


def nodes_billed(problem: Problem, packing: Packing) -> dict[str, int]:
    """Per pool: the nodes the plan needs (in use, and never fewer than min_nodes)."""
    used = packing.nodes_used()
    return {p.name: max(used.get(p.name, 0), p.min_nodes) for p in problem.pools}


def packing_cost(problem: Problem, packing: Packing) -> float:
    """Price per hour of the nodes the plan needs."""
    billed = nodes_billed(problem, packing)
    return sum(p.cost_per_hour * billed[p.name] for p in problem.pools)


def choice_shortfall(problem: Problem, packing: Packing, choice: Choice) -> int:
    """Replicas ``choice``'s model is short of: the larger of the replicas below
    ``min_replicas`` and the unserved rate in replicas of its largest option."""
    mine = [it for it in problem.items if it.model == choice.model and it.option is not None]
    if not mine:
        return 0
    placed = [it for it in mine if it.key in packing.assigned]
    unit = max(it.capacity for it in mine)
    unserved = choice.rate - sum(it.capacity for it in placed)
    by_rate = math.ceil((unserved - COVER_TOLERANCE) / unit) if unserved > 0 else 0
    return max(0, by_rate, choice.min_replicas - len(placed))


#: Slack on a rate covered by the replicas' capacities (floating-point sums).
COVER_TOLERANCE = 1e-6


def shortfall(problem: Problem, packing: Packing) -> int:
    """The first objective level: replicas asked for and not placed, plus the replicas
    each traffic-planned model is short of (:func:`choice_shortfall`)."""
    unplaced = set(packing.unplaced)
    required = sum(1 for it in problem.items if it.option is None and it.key in unplaced)
    return required + sum(choice_shortfall(problem, packing, c) for c in problem.choices)


def score(problem: Problem, packing: Packing) -> tuple[int, float, int, int]:
    """The lexicographic objective of a packing (lower is better)."""
    cost = round(packing_cost(problem, packing), 6) if problem.priced else 0.0
    return (
        shortfall(problem, packing),
        cost,
        gpus_used(packing),
        len(packing.node_set()),
    )


def check_packing(problem: Problem, packing: Packing) -> list[str]:
    """Every broken rule of ``packing`` as a sentence (empty: valid)."""
    errors: list[str] = []
    items = {it.key: it for it in problem.items}
    seen = set(packing.assigned) | set(packing.unplaced)
    for key in items:
        if key not in seen:
            errors.append(f"{key}: neither placed nor reported")
    mem: dict[tuple[str, int, int], int] = {}
    cores: dict[tuple[str, int, int], int] = {}
    count: dict[tuple[str, int, int], int] = {}
    whole: dict[tuple[str, int, int], int] = {}
    owners: dict[tuple[str, int, int], set[str | None]] = {}
    dedicated: dict[tuple[str, int, int], set[str | None]] = {}
    cpu: dict[tuple[str, int], float] = {}
    ram: dict[tuple[str, int], int] = {}
    for key, a in packing.assigned.items():
        item = items[key]
        demand = item.demands.get(a.pool)
        if demand is None:
            errors.append(f"{key}: placed on pool {a.pool}, which it may not use")
            continue
        pool = problem.pool(a.pool)
        if len(a.parts) != demand.nodes or len({n for n, _ in a.parts}) != demand.nodes:
            errors.append(f"{key}: on nodes {[n for n, _ in a.parts]}, needs {demand.nodes}")
        for node_index, node_cards in a.parts:
            if pool.max_nodes is not None and node_index >= pool.max_nodes:
                errors.append(f"{key}: node {node_index} beyond max_nodes {pool.max_nodes}")
            if len(node_cards) != demand.cards or len(set(node_cards)) != len(node_cards):
                errors.append(f"{key}: got cards {node_cards}, needs {demand.cards} distinct")
            for c in node_cards:
                if not 0 <= c < pool.cards_per_node:
                    errors.append(f"{key}: card {c} not on a {pool.cards_per_node}-card node")
                slot = (a.pool, node_index, c)
                mem[slot] = mem.get(slot, 0) + demand.mem_mb
                cores[slot] = cores.get(slot, 0) + demand.cores
                count[slot] = count.get(slot, 0) + 1
                if demand.whole:
                    whole[slot] = whole.get(slot, 0) + 1
                owners.setdefault(slot, set()).add(item.tenant)
                if item.dedicated:
                    dedicated.setdefault(slot, set()).add(item.tenant)
            node = (a.pool, node_index)
            cpu[node] = cpu.get(node, 0) + demand.cpu
            ram[node] = ram.get(node, 0) + demand.ram_mb
    options: dict[str, set[str]] = {}
    for key in packing.assigned:
        if items[key].option is not None:
            options.setdefault(key[0], set()).add(str(items[key].option))
    for model, used_options in options.items():
        if len(used_options) > 1:  # one Serve deployment: one set of engine arguments
            errors.append(f"model {model}: replicas of several options {sorted(used_options)}")
    for slot, used in mem.items():
        pool = problem.pool(slot[0])
        if used > pool.card_mb:
            errors.append(f"card {slot}: {used} MiB > {pool.card_mb} MiB")
        if cores[slot] > 100:
            errors.append(f"card {slot}: {cores[slot]}% cores > 100%")
        if count[slot] > pool.split_count:
            errors.append(f"card {slot}: {count[slot]} slices > split count {pool.split_count}")
        if whole.get(slot, 0) and count[slot] > 1:
            errors.append(f"card {slot}: a whole-card replica shares it")
        if slot in dedicated and len(owners[slot]) > 1:
            errors.append(
                f"card {slot}: dedicated tenant shares with {sorted(map(str, owners[slot]))}"
            )
    for node, used_cpu in cpu.items():
        pool = problem.pool(node[0])
        if used_cpu > pool.cpu + 1e-9:
            errors.append(f"node {node}: {used_cpu:g} CPUs > {pool.cpu:g}")
        if ram[node] > pool.ram_mb:
            errors.append(f"node {node}: {ram[node]} MiB RAM > {pool.ram_mb}")
    return errors
