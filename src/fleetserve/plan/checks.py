"""Rules every plan keeps, checked on the output contract itself.

Used by the tests on every plan they make (including hypothesis-generated fleets), and
usable by anything that receives a :class:`PlanResult` (e.g. a doctor checking a plan that
was edited by hand): card memory and cores never oversubscribed, HAMi's deviceSplitCount
respected, tensor-parallel replicas on whole cards of one node, dedicated tenants alone on
their cards, engines never asking for more than their slice, and no replica vLLM would
refuse to start on its card (:mod:`fleetserve.plan.vllm_rules`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from fleetserve.errors import SpecError
from fleetserve.plan.architecture import ModelConfig
from fleetserve.plan.gpus import GpuType, custom_gpu, gpu_type
from fleetserve.plan.problem import DEVICE_SPLIT_COUNT
from fleetserve.plan.result import PlanResult
from fleetserve.plan.sizing import model_config_for
from fleetserve.plan.vllm_rules import engine_refusals
from fleetserve.spec import FleetSpec, PoolSpec


def plan_violations(spec: FleetSpec, result: PlanResult) -> list[str]:
    """Every rule ``result`` breaks for ``spec``, as sentences (empty: none)."""
    errors: list[str] = []
    pools = {p.name: p for p in spec.pools}
    tenants = {t.name: t.isolation for t in spec.tenants}
    cards: dict[tuple[str, int, int], list[Any]] = {}
    configs: dict[str, ModelConfig] = {}
    for m in spec.models:
        # a config only the spec's directory resolves: that model's vLLM rules go unchecked
        with contextlib.suppress(SpecError):
            configs[m.name] = model_config_for(m)
    for r in result.replicas:
        pool = pools.get(r.pool)
        if pool is None or pool.gpu is None:
            errors.append(f"{r.model}#{r.index}: pool '{r.pool}' has no GPUs")
            continue
        model = spec.model(r.model)
        if model.traffic is not None:  # the plan chose its parallelism and batch
            model = model.model_copy(
                update={
                    "tensor_parallel": r.tensor_parallel,
                    "pipeline_parallel": r.pipeline_parallel,
                    "max_num_seqs": r.engine.max_num_seqs,
                }
            )
        if model.pools is not None and r.pool not in model.pools:
            errors.append(f"{r.model}#{r.index} on a pool it may not use")
        refused = (
            engine_refusals(model, configs[r.model], _card(pool)) if r.model in configs else []
        )
        if refused:
            errors.append(f"{r.model}#{r.index}: vLLM would refuse it: {refused[0].reason}")
        want = model.tensor_parallel * model.pipeline_parallel
        held = [(n.node, g) for n in r.spans for g in n.gpus]
        if len(held) != want or len(set(held)) != want:
            errors.append(f"{r.model}#{r.index}: {held} for {want} cards")
        if want > 1 and not r.whole_cards:
            errors.append(f"{r.model}#{r.index}: TP replica on slices")
        # stages across nodes: whole tensor-parallel groups on each node (vLLM's Ray
        # executor never splits one), the same share on every node
        if len(r.spans) > 1 and (
            len({len(n.gpus) for n in r.spans}) != 1 or len(r.gpus) % model.tensor_parallel
        ):
            errors.append(f"{r.model}#{r.index}: a tensor-parallel group split across nodes")
        for n in r.spans:
            if pool.max_nodes is not None and n.node >= pool.max_nodes:
                errors.append(f"{r.model}#{r.index}: node {n.node} >= max_nodes")
        # the engine never asks for more than its slice (a fraction of the whole card)
        if not r.whole_cards and r.card_memory_mb:
            asked = r.engine.gpu_memory_utilization * r.card_memory_mb
            if asked > r.memory_mb:
                errors.append(f"{r.model}#{r.index}: engine asks {asked:.0f} > slice")
        for node, g in held:
            if not 0 <= g < pool.gpu.count:
                errors.append(f"{r.model}#{r.index}: card {g} not on node")
            cards.setdefault((r.pool, node, g), []).append(r)
    for slot, reps in cards.items():
        card_mb = reps[0].card_memory_mb
        if sum(r.memory_mb for r in reps) > card_mb:
            errors.append(f"{slot}: memory over the card")
        if sum(r.cores_percent for r in reps) > 100:
            errors.append(f"{slot}: cores over 100%")
        if len(reps) > DEVICE_SPLIT_COUNT:
            errors.append(f"{slot}: more than deviceSplitCount slices")
        if any(r.whole_cards for r in reps) and len(reps) > 1:
            errors.append(f"{slot}: whole card shared")
        owners = {r.tenant for r in reps}
        if len(owners) > 1 and any(tenants.get(t or "") == "dedicated" for t in owners):
            errors.append(f"{slot}: dedicated tenant shares a card: {owners}")
    placed = {(r.model, r.index) for r in result.replicas}
    missing = {(u.model, u.index) for u in result.unplaced}
    if placed & missing:
        errors.append("a replica is both placed and unplaced")
    if len(placed) != len(result.replicas):
        errors.append("a replica is placed twice")
    wanted = (
        expected_replicas(spec, result.scenario, result)
        if result.scenario in ("min", "max")
        else None
    )
    if wanted is not None and placed | missing != wanted:
        errors.append(f"replicas neither placed nor reported: {sorted(wanted - placed - missing)}")
    return errors


def _card(pool: PoolSpec) -> GpuType:
    assert pool.gpu is not None
    if pool.gpu.type is None:
        return custom_gpu(pool.gpu.memory_gb or 0)
    return gpu_type(pool.gpu.type)


def expected_replicas(
    spec: FleetSpec, scenario: str = "min", result: PlanResult | None = None
) -> set[tuple[str, int]]:
    """(model, index) of every replica the scenario asks for; for a model with traffic,
    the replicas ``result`` says its rate needs (one reported when none can serve it)."""
    needed = {t.model: max(1, t.needed) for t in result.traffic} if result else {}
    return {
        (m.name, i)
        for m in spec.models
        for i in range(
            needed.get(m.name, 0)
            if m.traffic is not None
            else (m.replicas.min if scenario == "min" else m.replicas.max)
        )
    }
