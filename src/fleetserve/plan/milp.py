"""The exact packer: the placement as a mixed-integer program solved by HiGHS.

Design note. Variables (all binary): ``x[i,c]`` slice replica i on card c; ``z[i,n]`` and
``y[i,c]`` whole-card replica i on node n using card c; ``u[c]`` card used; ``v[n]`` node
used; ``w[t,c]`` card c belongs to dedicated tenant t; ``s[i]`` replica i left unplaced.

    minimise   sum u[c]  +  P * sum cards_i * s[i]         (P large: placing always wins)
    subject to sum_c x[i,c] + sum_n z[i,n] + s[i] = 1      every replica once (or reported)
               sum_c y[i,c on n] = cards_i * z[i,n]        TP: whole cards of one node
               mem:   sum m_i x[i,c] + M_c sum y[i,c] <= M_c u[c]
               cores: sum k_i x[i,c] + 100 sum y[i,c] <= 100 u[c]
               split: sum x[i,c] + S sum y[i,c]      <= S u[c]   (HAMi deviceSplitCount)
               node CPU / RAM over the replicas on its cards <= capacity * v[n]
               x[i,c] <= u[c] <= v[n]                         (tightens the LP bound)
               tenants: x[i,c] <= w[t,c] for i of t; others' x on c <= S (1 - w[t,c])
               symmetry: u[c+1] <= u[c] on a node, v[n+1] <= v[n] in a pool

Cards of a node and nodes of a pool are interchangeable, so the symmetry rows cut the
search by orders of magnitude without excluding any optimum. Nodes per pool are bounded by
``max_nodes`` and by the heuristic's card count (an optimum never uses more nodes than the
heuristic uses cards). The objective is an integer, so ``ceil(dual bound)`` is a proven
lower bound on the cards needed; the gap reported is against it. HiGHS has no warm start
through SciPy, so the heuristic's packing stays the answer whenever the solver does not
return a better one within the time limit.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from fleetserve.plan.problem import Assignment, Packing, Problem

#: Above this many assignment variables the MILP is not attempted (it would not even
#: finish its LP relaxation within a typical time limit on one core).
MAX_VARIABLES = 60_000


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
    """Nodes per pool the model may use: never more than max_nodes, the heuristic's card
    count, or the replicas that may go there."""
    cap = max(1, len(heuristic.cards_used()))
    out: dict[str, int] = {}
    for pool in problem.pools:
        eligible = sum(1 for it in problem.items if pool.name in it.demands)
        n = min(cap, eligible)
        if pool.max_nodes is not None:
            n = min(n, pool.max_nodes)
        out[pool.name] = n
    return out


def variable_count(problem: Problem, nodes: dict[str, int]) -> int:
    total = 0
    for it in problem.items:
        for name, d in it.demands.items():
            pool = problem.pool(name)
            total += nodes[name] * (pool.cards_per_node + (1 if d.whole else 0))
    return total


def solve_milp(problem: Problem, heuristic: Packing, *, time_limit_s: float) -> Packing | None:
    """An optimal (or better-than-heuristic) packing, or None when the MILP is not tried or
    finds nothing; the returned packing carries ``gap`` and ``lower_bound``."""
    nodes = node_bounds(problem, heuristic)
    if variable_count(problem, nodes) > MAX_VARIABLES or time_limit_s <= 0:
        return None

    cost: list[float] = []
    integrality: list[int] = []

    def var(c: float = 0.0) -> int:
        cost.append(c)
        integrality.append(1)
        return len(cost) - 1

    # cards and nodes
    u: dict[tuple[str, int, int], int] = {}
    v: dict[tuple[str, int], int] = {}
    for pool in problem.pools:
        for n in range(nodes[pool.name]):
            v[(pool.name, n)] = var(0.0)
            for c in range(pool.cards_per_node):
                u[(pool.name, n, c)] = var(1.0)

    x: dict[tuple[int, str, int, int], int] = {}
    z: dict[tuple[int, str, int], int] = {}
    y: dict[tuple[int, str, int, int], int] = {}
    s: dict[int, int] = {}
    big = 2.0 * (len(u) + 1)
    for i, it in enumerate(problem.items):
        cards = max((d.cards for d in it.demands.values()), default=1)
        s[i] = var(big * cards)
        for name, d in it.demands.items():
            pool = problem.pool(name)
            for n in range(nodes[name]):
                if d.whole:
                    z[(i, name, n)] = var()
                    for c in range(pool.cards_per_node):
                        y[(i, name, n, c)] = var()
                else:
                    for c in range(pool.cards_per_node):
                        x[(i, name, n, c)] = var()

    rows = _Rows()
    # each replica once
    per_item: dict[int, list[tuple[int, float]]] = {i: [(s[i], 1.0)] for i in s}
    for (i, _p, _n, _c), col in x.items():
        per_item[i].append((col, 1.0))
    for (i, _p, _n), col in z.items():
        per_item[i].append((col, 1.0))
    for terms in per_item.values():
        rows.add(terms, 1.0, 1.0)
    # whole cards on one node
    for (i, p, n), col in z.items():
        k = problem.items[i].demands[p].cards
        terms = [(y[(i, p, n, c)], 1.0) for c in range(problem.pool(p).cards_per_node)]
        rows.add([*terms, (col, -float(k))], 0.0, 0.0)

    # card capacities
    mem: dict[tuple[str, int, int], list[tuple[int, float]]] = {k: [] for k in u}
    cores: dict[tuple[str, int, int], list[tuple[int, float]]] = {k: [] for k in u}
    slots: dict[tuple[str, int, int], list[tuple[int, float]]] = {k: [] for k in u}
    cpu: dict[tuple[str, int], list[tuple[int, float]]] = {k: [] for k in v}
    ram: dict[tuple[str, int], list[tuple[int, float]]] = {k: [] for k in v}
    for (i, p, n, c), col in x.items():
        d = problem.items[i].demands[p]
        mem[(p, n, c)].append((col, float(d.mem_mb)))
        cores[(p, n, c)].append((col, float(d.cores)))
        slots[(p, n, c)].append((col, 1.0))
        cpu[(p, n)].append((col, d.cpu))
        ram[(p, n)].append((col, float(d.ram_mb)))
        rows.add([(col, 1.0), (u[(p, n, c)], -1.0)], -np.inf, 0.0)
    for (_i, p, n, c), col in y.items():
        pool = problem.pool(p)
        mem[(p, n, c)].append((col, float(pool.card_mb)))
        cores[(p, n, c)].append((col, 100.0))
        slots[(p, n, c)].append((col, float(pool.split_count)))
    for (i, p, n), col in z.items():
        d = problem.items[i].demands[p]
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
    for (i, p, n, c), col in x.items():
        on_card[(p, n, c)].append((i, col))
    dedicated = sorted({it.tenant or "" for it in problem.items if it.dedicated})
    for tenant in dedicated:
        for key, entries in on_card.items():
            mine = [col for i, col in entries if (problem.items[i].tenant or "") == tenant]
            others = [col for i, col in entries if (problem.items[i].tenant or "") != tenant]
            if not mine or not others:
                continue
            w = var()
            for col in mine:
                rows.add([(col, 1.0), (w, -1.0)], -np.inf, 0.0)
            split = float(problem.pool(key[0]).split_count)
            rows.add([*[(col, 1.0) for col in others], (w, split)], -np.inf, split)

    n_vars = len(cost)
    matrix = coo_matrix((rows.v, (rows.r, rows.c)), shape=(len(rows.lb), n_vars)).tocsr()
    result = milp(
        c=np.array(cost),
        integrality=np.array(integrality),
        bounds=Bounds(np.zeros(n_vars), np.ones(n_vars)),
        constraints=LinearConstraint(matrix, np.array(rows.lb), np.array(rows.ub)),
        options={"time_limit": float(time_limit_s), "disp": False, "mip_rel_gap": 0.0},
    )
    if result.x is None:
        return None
    sol = np.round(result.x).astype(int)
    packing = Packing(solver="milp")
    for i, it in enumerate(problem.items):
        if sol[s[i]]:
            packing.unplaced.append(it.key)
    for (i, p, n, c), col in x.items():
        if sol[col]:
            packing.assigned[problem.items[i].key] = Assignment(p, n, (c,))
    for (i, p, n), col in z.items():
        if sol[col]:
            chosen = tuple(c for c in range(problem.pool(p).cards_per_node) if sol[y[(i, p, n, c)]])
            packing.assigned[problem.items[i].key] = Assignment(p, n, chosen)
    bound = getattr(result, "mip_dual_bound", None)
    if not packing.unplaced and bound is not None and math.isfinite(bound):
        packing.lower_bound = float(math.ceil(bound - 1e-6))
    if result.status == 0:
        packing.lower_bound = float(len(packing.cards_used()))
    _renumber(packing)
    return packing


def _renumber(packing: Packing) -> None:
    """Number used nodes 0..k-1 per pool (symmetry rows already keep them dense)."""
    by_pool: dict[str, dict[int, int]] = {}
    for a in sorted(packing.assigned.values(), key=lambda a: (a.pool, a.node)):
        mapping = by_pool.setdefault(a.pool, {})
        mapping.setdefault(a.node, len(mapping))
    for key, a in list(packing.assigned.items()):
        packing.assigned[key] = Assignment(a.pool, by_pool[a.pool][a.node], a.cards)
