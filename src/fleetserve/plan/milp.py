"""The exact packer: the placement as a mixed-integer program solved by HiGHS.

Design note. Variables (all binary): ``x[i,c]`` slice replica i on card c; ``z[i,n]`` and
``y[i,c]`` whole-card replica i on node n using card c; ``u[c]`` card used; ``v[n]`` node
used; ``w[t,c]`` card c belongs to dedicated tenant t; ``s[i]`` replica i left unplaced.

    subject to sum_c x[i,c] + sum_n z[i,n] + s[i] = 1      every replica once (or reported)
               sum_c y[i,c on n] = cards_i * z[i,n]        TP: whole cards of one node
               mem:   sum m_i x[i,c] + M_c sum y[i,c] <= M_c u[c]
               cores: sum k_i x[i,c] + 100 sum y[i,c] <= 100 u[c]
               split: sum x[i,c] + S sum y[i,c]      <= S u[c]   (HAMi deviceSplitCount)
               node CPU / RAM over the replicas on its cards <= capacity * v[n]
               x[i,c] <= u[c] <= v[n]                         (tightens the LP bound)
               tenants: x[i,c] <= w[t,c] for i of t; others' x on c <= S (1 - w[t,c])
               symmetry: u[c+1] <= u[c] on a node, v[n+1] <= v[n] in a pool
               spanning k nodes (pipeline stages across nodes): z counts the replica's
               parts per node, r its replicas: sum_n z = k r, z[n] <= r (so the parts
               deal out round-robin into r replicas of k distinct nodes each)
               traffic-planned models (Choice): sel[o] binary per option, sum sel <= 1,
               s[g] + |g| sel[o] >= |g| (copies only of the chosen option),
               sum cap_g (|g| - s[g]) + U q >= rate and sum (|g| - s[g]) + q >= min
               (q: replicas short, in the largest capacity U; optional s cost nothing)

The objective is lexicographic (:data:`fleetserve.plan.problem.OBJECTIVES`), solved as a
sequence of MILPs over the same rows, each level fixed (``<=`` its value) before the next:
(1) fewest replicas left out ``sum s`` (required ones) ``+ sum q``; (2) with prices, the
cost of the nodes above ``min_nodes``, in integer thousandths; (3) ``(V + 1) * sum u +
sum v`` (V = node variables), which is GPUs first and nodes second exactly. Weights in
one objective would need factors of 10^10 once prices are in cents, which HiGHS's
tolerances do not survive.
Each level starts with the heuristic's value as a cutoff row when the heuristic is a
feasible point of it (HiGHS takes no warm start through SciPy).

Determinism: HiGHS's branch and bound is deterministic for a given model (serial search,
fixed random seed), so the answer is decided by the node limit (``mip_max_nodes``), never by
the clock. The time limit is only a safety net; when it cuts a level the packing says so
(``limit``), since only then can the answer depend on machine load.

Cards of a node and nodes of a pool are interchangeable, so the symmetry rows cut the
search by orders of magnitude without excluding any optimum. Nodes per pool are bounded by
``max_nodes``, the replicas that may go there, and - when the heuristic placed everything
and no prices are given - by the heuristic's card count (an optimum never uses more nodes
than the heuristic uses cards).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp
from scipy.sparse import coo_matrix, csr_matrix

from fleetserve.plan.problem import (
    COVER_TOLERANCE,
    Assignment,
    Item,
    Packing,
    Problem,
    nodes_billed,
    score,
    shortfall,
)

#: Above this many assignment variables the MILP is not attempted (it would not even
#: finish its LP relaxation within a typical time limit on one core).
MAX_VARIABLES = 60_000
#: Branch-and-bound nodes each objective level may explore: the deterministic limit that
#: decides the answer (the benchmark's instances all prove optimality well within it).
NODE_LIMIT = 5_000
#: Prices are compared in integer thousandths of a currency unit per node-hour.
COST_SCALE = 1000


class _Rows:
    """Sparse constraint rows collected as (row, col, value) triplets."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, terms: list[tuple[int, float]], lb: float, ub: float) -> None:
        row = len(self.lb)
        for col, val in terms:
            self.r.append(row)
            self.c.append(col)
            self.v.append(val)
        self.lb.append(lb)
        self.ub.append(ub)


def node_bounds(problem: Problem, heuristic: Packing) -> dict[str, int]:
    """Nodes per pool the model may use: never more than max_nodes, the replicas that may
    go there, or (when the heuristic placed all and cards are the first cost) the
    heuristic's card count."""
    placeable = [it for it in problem.items if it.demands]
    if problem.choices:
        all_placed = shortfall(problem, heuristic) == 0
    else:
        all_placed = not any(it.key in heuristic.unplaced for it in placeable)
    cap = max(1, len(heuristic.cards_used())) if all_placed and not problem.priced else None
    # with prices and nothing short, the optimum costs no more than the heuristic: a
    # priced pool has at most that cost's worth of nodes above min_nodes (only applied
    # to traffic-planned problems, whose optional copies would otherwise allow a node
    # for each copy of every option)
    spare = None
    if problem.choices and all_placed and problem.priced:
        billed = nodes_billed(problem, heuristic)
        spare = sum(p.cost_per_hour * (billed[p.name] - p.min_nodes) for p in problem.pools)
    out: dict[str, int] = {}
    for pool in problem.pools:
        eligible = sum(
            it.demands[pool.name].nodes
            for it in problem.items
            if pool.name in it.demands and it.option is None
        )
        # one option per traffic-planned model: the largest option's copies bound it
        per_option: dict[tuple[str, str], int] = {}
        for it in problem.items:
            if it.option is not None and pool.name in it.demands:
                key = (it.model, it.option)
                per_option[key] = per_option.get(key, 0) + it.demands[pool.name].nodes
        most: dict[str, int] = {}
        for (model, _option), count in per_option.items():
            most[model] = max(most.get(model, 0), count)
        eligible += sum(most.values())
        n = eligible if cap is None else min(cap, eligible)
        if spare is not None and pool.cost_per_hour > 0:
            n = min(n, pool.min_nodes + math.floor(spare / pool.cost_per_hour + 1e-9))
        if pool.max_nodes is not None:
            n = min(n, pool.max_nodes)
        out[pool.name] = n
    return out


def groups(problem: Problem) -> list[list[int]]:
    """Indices of interchangeable replicas (same model, tenant and demands), in order.

    The MILP counts replicas of a group per card instead of naming each one: copies of a
    model are interchangeable, and binary variables per copy would make the search
    explore every permutation of them."""
    out: dict[tuple[object, ...], list[int]] = {}
    for i, it in enumerate(problem.items):
        key = (
            it.model,
            it.option,
            it.tenant,
            it.dedicated,
            tuple(sorted(it.demands.items())),
        )
        out.setdefault(key, []).append(i)
    return list(out.values())


def variable_count(problem: Problem, nodes: dict[str, int]) -> int:
    total = 0
    for members in groups(problem):
        it = problem.items[members[0]]
        for name, d in it.demands.items():
            pool = problem.pool(name)
            total += nodes[name] * (pool.cards_per_node + (1 if d.whole else 0))
    return total


@dataclass
class _Level:
    name: str
    c: np.ndarray
    heuristic: float | None
    """The heuristic's value at this level when it is a feasible point of the model."""


def solve_milp(
    problem: Problem,
    heuristic: Packing,
    *,
    time_limit_s: float,
    node_limit: int = NODE_LIMIT,
    proven: tuple[str, ...] = (),
) -> Packing | None:
    """The lexicographic optimum (or the best packing found within the node limit), or
    None when the MILP is not tried or finds nothing. ``proven`` names levels the caller
    already proved for the heuristic (they are fixed at its value, not solved). The
    packing carries ``proven``, ``limit`` and ``lower_bound`` (on GPUs, valid when the
    levels above GPUs are proven)."""
    nodes = node_bounds(problem, heuristic)
    if variable_count(problem, nodes) > MAX_VARIABLES or time_limit_s <= 0:
        return None

    integrality: list[int] = []
    upper: list[float] = []

    def var(ub: float = 1.0) -> int:
        integrality.append(1)
        upper.append(ub)
        return len(integrality) - 1

    # cards and nodes
    u: dict[tuple[str, int, int], int] = {}
    v: dict[tuple[str, int], int] = {}
    for pool in problem.pools:
        for n in range(nodes[pool.name]):
            v[(pool.name, n)] = var()
            for c in range(pool.cards_per_node):
                u[(pool.name, n, c)] = var()

    # per group g of interchangeable replicas: x = how many on a card (slices), z = how
    # many on a node (whole cards, y = the cards they take), s = how many left out
    members = groups(problem)
    x: dict[tuple[int, str, int, int], int] = {}
    z: dict[tuple[int, str, int], int] = {}
    y: dict[tuple[int, str, int, int], int] = {}
    s: dict[int, int] = {}
    # replicas over k nodes: r = how many of the group in the pool, z = its parts per node
    r: dict[tuple[int, str], int] = {}
    for g, idx in enumerate(members):
        it = problem.items[idx[0]]
        s[g] = var(len(idx))
        for name, d in it.demands.items():
            pool = problem.pool(name)
            if d.nodes > 1:
                if nodes[name] < d.nodes:
                    continue  # too few nodes allowed for one replica
                r[(g, name)] = var(len(idx))
            for n in range(nodes[name]):
                if d.whole:
                    z[(g, name, n)] = var(min(len(idx), pool.cards_per_node // d.cards))
                    for c in range(pool.cards_per_node):
                        y[(g, name, n, c)] = var()
                else:
                    for c in range(pool.cards_per_node):
                        x[(g, name, n, c)] = var(min(len(idx), pool.split_count))

    def first(g: int) -> Item:
        return problem.items[members[g][0]]

    rows = _Rows()
    # each replica once
    per_group: dict[int, list[tuple[int, float]]] = {g: [(s[g], 1.0)] for g in s}
    for (g, _p, _n, _c), col in x.items():
        per_group[g].append((col, 1.0))
    for (g, p, _n), col in z.items():
        if (g, p) not in r:
            per_group[g].append((col, 1.0))
    for (g, _p), col in r.items():
        per_group[g].append((col, 1.0))
    for g, terms in per_group.items():
        rows.add(terms, float(len(members[g])), float(len(members[g])))
    # traffic-planned models: one option (sel), its copies placed only when chosen, and
    # q = replicas short: capacity placed + q x the largest capacity >= rate, and
    # replicas placed + q >= min_replicas
    q: dict[str, int] = {}
    for choice in problem.choices:
        mine = [g for g in s if first(g).model == choice.model and first(g).option is not None]
        if not mine:
            continue
        unit = max(first(g).capacity for g in mine)
        q[choice.model] = var(float(math.ceil(choice.rate / unit) + choice.min_replicas))
        sel: dict[str, int] = {}
        for g in mine:
            option = str(first(g).option)
            if option not in sel:
                sel[option] = var()
            size = float(len(members[g]))
            rows.add([(s[g], 1.0), (sel[option], size)], size, np.inf)
        rows.add([(col, 1.0) for col in sel.values()], -np.inf, 1.0)
        placed_cap = sum(first(g).capacity * len(members[g]) for g in mine)
        rows.add(
            [*[(s[g], -first(g).capacity) for g in mine], (q[choice.model], unit)],
            choice.rate - placed_cap - COVER_TOLERANCE,
            np.inf,
        )
        placed = sum(len(members[g]) for g in mine)
        rows.add(
            [*[(s[g], -1.0) for g in mine], (q[choice.model], 1.0)],
            float(choice.min_replicas - placed),
            np.inf,
        )
    # a replica over k nodes: k parts per replica, at most one part of each replica per
    # node (z <= r: then the parts split into replicas on k distinct nodes each)
    for (g, p), col in r.items():
        k = first(g).demands[p].nodes
        parts = [(z[(g, p, n)], 1.0) for n in range(nodes[p])]
        rows.add([*parts, (col, -float(k))], 0.0, 0.0)
        for n in range(nodes[p]):
            rows.add([(z[(g, p, n)], 1.0), (col, -1.0)], -np.inf, 0.0)
    # whole cards on one node
    for (g, p, n), col in z.items():
        k = first(g).demands[p].cards
        terms = [(y[(g, p, n, c)], 1.0) for c in range(problem.pool(p).cards_per_node)]
        rows.add([*terms, (col, -float(k))], 0.0, 0.0)

    # card capacities
    mem: dict[tuple[str, int, int], list[tuple[int, float]]] = {k: [] for k in u}
    cores: dict[tuple[str, int, int], list[tuple[int, float]]] = {k: [] for k in u}
    slots: dict[tuple[str, int, int], list[tuple[int, float]]] = {k: [] for k in u}
    cpu: dict[tuple[str, int], list[tuple[int, float]]] = {k: [] for k in v}
    ram: dict[tuple[str, int], list[tuple[int, float]]] = {k: [] for k in v}
    for (g, p, n, c), col in x.items():
        d = first(g).demands[p]
        mem[(p, n, c)].append((col, float(d.mem_mb)))
        cores[(p, n, c)].append((col, float(d.cores)))
        slots[(p, n, c)].append((col, 1.0))
        cpu[(p, n)].append((col, d.cpu))
        ram[(p, n)].append((col, float(d.ram_mb)))
        rows.add([(col, 1.0), (u[(p, n, c)], -upper[col])], -np.inf, 0.0)
    for (_g, p, n, c), col in y.items():
        pool = problem.pool(p)
        mem[(p, n, c)].append((col, float(pool.card_mb)))
        cores[(p, n, c)].append((col, 100.0))
        slots[(p, n, c)].append((col, float(pool.split_count)))
    for (g, p, n), col in z.items():
        d = first(g).demands[p]
        cpu[(p, n)].append((col, d.cpu))
        ram[(p, n)].append((col, float(d.ram_mb)))
    for key, col in u.items():
        pool = problem.pool(key[0])
        rows.add([*mem[key], (col, -float(pool.card_mb))], -np.inf, 0.0)
        rows.add([*cores[key], (col, -100.0)], -np.inf, 0.0)
        rows.add([*slots[key], (col, -float(pool.split_count))], -np.inf, 0.0)
        rows.add([(col, 1.0), (v[(key[0], key[1])], -1.0)], -np.inf, 0.0)
        if key[2] + 1 < pool.cards_per_node:
            rows.add([(u[(key[0], key[1], key[2] + 1)], 1.0), (col, -1.0)], -np.inf, 0.0)
    for nkey, col in v.items():
        pool = problem.pool(nkey[0])
        rows.add([*cpu[nkey], (col, -pool.cpu)], -np.inf, 0.0)
        rows.add([*ram[nkey], (col, -float(pool.ram_mb))], -np.inf, 0.0)
        if (nkey[0], nkey[1] + 1) in v:
            rows.add([(v[(nkey[0], nkey[1] + 1)], 1.0), (col, -1.0)], -np.inf, 0.0)

    # dedicated tenants: a card holding one of their slices holds nothing else
    on_card: dict[tuple[str, int, int], list[tuple[int, int]]] = {k: [] for k in u}
    for (g, p, n, c), col in x.items():
        on_card[(p, n, c)].append((g, col))
    dedicated = sorted({it.tenant or "" for it in problem.items if it.dedicated})
    for tenant in dedicated:
        for key, entries in on_card.items():
            mine = [col for g, col in entries if (first(g).tenant or "") == tenant]
            others = [col for g, col in entries if (first(g).tenant or "") != tenant]
            if not mine or not others:
                continue
            w = var()
            for col in mine:
                rows.add([(col, 1.0), (w, -upper[col])], -np.inf, 0.0)
            split = float(problem.pool(key[0]).split_count)
            rows.add([*[(col, 1.0) for col in others], (w, split)], -np.inf, split)

    n_vars = len(integrality)
    matrix = coo_matrix((rows.v, (rows.r, rows.c)), shape=(len(rows.lb), n_vars)).tocsr()
    optional = {g for g in s if first(g).option is not None}
    levels = _levels(problem, heuristic, n_vars, u=u, v=v, s=s, q=q, optional=optional)
    deadline = time.monotonic() + time_limit_s
    extra: list[tuple[np.ndarray, float]] = []
    best: np.ndarray | None = None
    done: list[str] = []
    limit: str | None = None
    gpu_bound: float | None = None
    # the heuristic's value is a valid cutoff only while it is a point of the model: it
    # meets every level fixed so far
    heuristic_feasible = True
    for level in levels:
        if level.name in proven and level.heuristic is not None and len(done) == len(extra):
            extra.append((level.c, level.heuristic))  # proved by the caller: fix it
            done.append(level.name)
            continue
        usable = heuristic_feasible and level.heuristic is not None
        cutoff = [(level.c, level.heuristic)] if usable and level.heuristic is not None else []
        left = deadline - time.monotonic()
        if left <= 0:
            limit = f"the time limit ({time_limit_s:g} s) ran out before the {level.name} level"
            break
        result = _solve(
            matrix,
            rows=rows,
            integrality=integrality,
            upper=upper,
            c=level.c,
            extra=extra + cutoff,
            node_limit=node_limit,
            time_left=left,
        )
        if result.x is None:
            if result.status == 1 or "limit" in result.message.lower():
                limit = _limit_sentence(result.message, level.name, node_limit, time_limit_s)
            else:
                limit = f"the exact solver stopped at the {level.name} level: {result.message}"
            break
        sol = np.round(result.x)
        value = float(level.c @ sol)
        if level.heuristic is None or level.heuristic > value + 0.5:
            heuristic_feasible = False
        extra.append((level.c, value))
        best = sol
        optimal = result.status == 0
        if optimal and len(done) == len(extra) - 1:
            done.append(level.name)
            if level.name == "gpus+nodes":
                done.append("nodes")
        elif not optimal:
            limit = limit or _limit_sentence(result.message, level.name, node_limit, time_limit_s)
        if level.name == "gpus+nodes" and len(done) >= len(levels) - 1:
            weight = float(len(v) + 1)
            dual = getattr(result, "mip_dual_bound", None)
            if optimal:
                gpu_bound = math.floor(value / weight)
            elif dual is not None and math.isfinite(dual):
                gpu_bound = float(max(0, math.ceil((dual - len(v)) / weight - 1e-6)))
    if best is None:
        return None
    sol_int = best.astype(int)
    packing = Packing(solver="milp", limit=limit)
    queue = {g: [problem.items[i].key for i in idx] for g, idx in enumerate(members)}
    for (g, p, n, c), col in sorted(x.items()):
        for _ in range(sol_int[col]):
            packing.assigned[queue[g].pop(0)] = Assignment(p, n, (c,))
    spanning: dict[tuple[int, str], list[tuple[int, tuple[int, ...]]]] = {}
    for (g, p, n), col in sorted(z.items()):
        k = first(g).demands[p].cards
        taken = [c for c in range(problem.pool(p).cards_per_node) if sol_int[y[(g, p, n, c)]]]
        for j in range(sol_int[col]):
            part_cards = tuple(taken[j * k : (j + 1) * k])
            if (g, p) in r:
                spanning.setdefault((g, p), []).append((n, part_cards))
            else:
                packing.assigned[queue[g].pop(0)] = Assignment(p, n, part_cards)
    for (g, p), node_parts in sorted(spanning.items()):
        # parts sorted by node, dealt round-robin: replica j takes parts j, j+m, ... (m
        # replicas); a node holds at most m parts (z <= r), so each replica's are distinct
        m = int(sol_int[r[(g, p)]])
        for j in range(m):
            held = node_parts[j::m]
            packing.assigned[queue[g].pop(0)] = Assignment(
                p, held[0][0], held[0][1], tuple(held[1:])
            )
    for keys in queue.values():
        packing.unplaced.extend(keys)
    # "gpus+nodes" is one solve; report its two levels under their own names
    packing.proven = tuple(
        name
        for name in ("replicas", "cost", "gpus", "nodes")
        if name in done or (name == "gpus" and "gpus+nodes" in done)
    )
    packing.lower_bound = gpu_bound
    _renumber(packing)
    return packing


def _levels(
    problem: Problem,
    heuristic: Packing,
    n_vars: int,
    *,
    u: dict[tuple[str, int, int], int],
    v: dict[tuple[str, int], int],
    s: dict[int, int],
    q: dict[str, int],
    optional: set[int],
) -> list[_Level]:
    """The objective levels in order, each with the heuristic's value when it is
    feasible for the model (its nodes fit the node bounds). The first level counts the
    replicas asked for and left out, and each traffic-planned model's replicas short
    (``q``); an optional copy left out costs nothing."""
    unplaced, _cost, gpus, node_count = score(problem, heuristic)
    c_rep = np.zeros(n_vars)
    for g, col in s.items():
        if g not in optional:
            c_rep[col] = 1.0
    for col in q.values():
        c_rep[col] = 1.0
    levels = [_Level("replicas", c_rep, float(unplaced))]
    if problem.priced:
        c_cost = np.zeros(n_vars)
        for (pool_name, n), col in v.items():
            pool = problem.pool(pool_name)
            if n >= pool.min_nodes:
                c_cost[col] = float(round(pool.cost_per_hour * COST_SCALE))
        billed = nodes_billed(problem, heuristic)
        value = sum(
            round(p.cost_per_hour * COST_SCALE) * (billed[p.name] - p.min_nodes)
            for p in problem.pools
        )
        levels.append(_Level("cost", c_cost, float(value)))
    weight = float(len(v) + 1)
    c_gn = np.zeros(n_vars)
    for col in u.values():
        c_gn[col] = weight
    for col in v.values():
        c_gn[col] = 1.0
    levels.append(_Level("gpus+nodes", c_gn, float(gpus * weight + node_count)))
    per_pool: dict[str, int] = {}
    for pool_name, _n in v:
        per_pool[pool_name] = per_pool.get(pool_name, 0) + 1
    if any(n >= per_pool.get(a.pool, 0) for a in heuristic.assigned.values() for n, _ in a.parts):
        for level in levels:
            level.heuristic = None
    return levels


def _solve(
    matrix: csr_matrix,
    *,
    rows: _Rows,
    integrality: list[int],
    upper: list[float],
    c: np.ndarray,
    extra: list[tuple[np.ndarray, float]],
    node_limit: int,
    time_left: float,
) -> OptimizeResult:
    constraints = [LinearConstraint(matrix, np.array(rows.lb), np.array(rows.ub))]
    for vec, value in extra:
        constraints.append(LinearConstraint(vec.reshape(1, -1), -np.inf, value + 0.5))
    n_vars = len(integrality)
    return milp(
        c=c,
        integrality=np.array(integrality),
        bounds=Bounds(np.zeros(n_vars), np.array(upper)),
        constraints=constraints,
        options={
            "time_limit": float(time_left),
            "node_limit": int(node_limit),
            "disp": False,
            "mip_rel_gap": 0.0,
        },
    )


def _limit_sentence(message: str, level: str, node_limit: int, time_limit_s: float) -> str:
    if "time limit" in message.lower():
        return (
            f"the time limit ({time_limit_s:g} s) cut the search at the {level} level: this "
            "answer may differ on a faster or less loaded machine"
        )
    return f"the node limit ({node_limit:,}) cut the search at the {level} level"


def _renumber(packing: Packing) -> None:
    """Number used nodes 0..k-1 per pool (symmetry rows already keep them dense)."""
    by_pool: dict[str, dict[int, int]] = {}
    for pool, node in sorted(packing.node_set()):
        mapping = by_pool.setdefault(pool, {})
        mapping.setdefault(node, len(mapping))
    for key, a in list(packing.assigned.items()):
        m = by_pool[a.pool]
        others = tuple((m[n], cards) for n, cards in a.others)
        packing.assigned[key] = Assignment(a.pool, m[a.node], a.cards, others)
