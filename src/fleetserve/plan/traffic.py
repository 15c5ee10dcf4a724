"""Traffic planning: the candidate replicas of a model that has ``traffic`` (and SLOs).

Design note. For a model planned from its traffic the planner does not place a replica
count the user gave; it offers the packer *options*, one per (card type, tensor-parallel
size, ``max_num_seqs``), and the packer (heuristic, then the MILP) uses exactly one option
per model, with as many copies as the rate needs, at the lowest cost
(:class:`~fleetserve.plan.problem.Choice`). One option per model because a Serve
deployment runs one set of engine arguments (render refuses a model whose replicas differ).

Each option is sized with the memory model (:func:`~fleetserve.plan.sizing.size_replica`)
as a model whose KV cache holds ``max_num_seqs`` sequences of the traffic's mean length
(``concurrency`` full-context sequences of the same bytes, at least one: vLLM refuses to
start when one ``max_model_len`` sequence does not fit); its slice (memory and
``gpucores``) follows. Its capacity is :func:`~fleetserve.plan.capacity.replica_capacity`
on the performance model's step time for that card, slice and TP; copies needed =
``max(replicas.min, ceil(rate / capacity))``. ``tensor_parallel`` and ``max_num_seqs`` set in
the spec are kept; unset, the candidates are every TP vLLM accepts up to 8 and
``max_num_seqs`` in powers of two. Options that cannot meet the SLOs at any rate keep
their explanation (the model's infeasibility report names the closest one); the rest are
pruned to the :data:`OPTIONS_PER_CARD` cheapest per card type (copies x the price of the
share of a card one takes), which bounds the MILP's size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.plan.capacity import (
    BatchLimits,
    Capacity,
    Load,
    PerfModel,
    ReplicaShape,
    StepModel,
    Workload,
    predict,
    replica_capacity,
)
from fleetserve.plan.gpus import GpuType
from fleetserve.plan.memory import ASYNC_BATCHES, MiB, ModelConfig, kv_bytes_per_sequence
from fleetserve.plan.problem import PoolShape
from fleetserve.plan.sizing import CUDA_VISIBLE_FRACTION, Rejection, Sizing, resolved_limits
from fleetserve.plan.vllm_rules import tp_splits
from fleetserve.spec import ModelSpec

#: max_num_seqs the planner tries when the spec leaves it unset.
SEQS_CANDIDATES = (4, 8, 16, 32, 64, 128, 256)
#: Tensor-parallel sizes tried when the spec leaves it unset (vLLM must accept them).
TP_CANDIDATES = (1, 2, 4, 8)
#: Options kept per card type (the cheapest for the rate).
OPTIONS_PER_CARD = 3
#: Most copies one option may ask for (replicas.max's own limit).
MAX_COPIES = 1000

#: Sizes one replica (a model variant) on one pool: the slice and node span, or why not.
Fit = Callable[[ModelSpec, str], "tuple[Sizing, tuple[int, int]] | Rejection"]


@dataclass(frozen=True)
class Option:
    """One candidate configuration of a traffic-planned model."""

    name: str
    model: ModelSpec
    """The model with this option's tensor_parallel, max_num_seqs and concurrency."""
    gpu: GpuType
    pools: tuple[str, ...]
    sizing: Sizing
    span: tuple[int, int]
    batch: BatchLimits
    capacity: Capacity
    step: StepModel
    copies: int
    """Replicas needed for the rate (at least replicas.min); 0 when it meets no SLO."""

    def at(self, work: Workload, rate: float, replicas: int, others_s: float = 0.0) -> Load:
        """The prediction for one replica when ``replicas`` share ``rate`` (``others_s``:
        seconds of other engines' turns a round on its card, :meth:`StepModel.beside`)."""
        step = self.step.beside(others_s) if others_s > 0 else self.step
        return predict(step, self.batch, work, rate / max(1, replicas))


@dataclass
class TrafficOptions:
    """What the planner learned about one traffic-planned model."""

    work: Workload
    options: list[Option]
    """Options that meet the SLOs, cheapest first (pruned)."""
    unreachable: list[Option]
    """Options that fit a card but meet the SLOs at no rate (capacity 0)."""
    rejections: dict[str, Rejection]
    """Pool -> why no option fits there at all."""


def candidate_tps(model: ModelSpec, config: ModelConfig) -> tuple[int, ...]:
    if "tensor_parallel" in model.model_fields_set:
        return (model.tensor_parallel,)
    if model.frontend == "process":  # its replica's own vllm serve runs one GPU (spec.py)
        return (1,)
    return tuple(tp for tp in TP_CANDIDATES if tp_splits(config, tp))


def candidate_seqs(model: ModelSpec) -> tuple[int, ...]:
    if model.max_num_seqs is not None:
        return (model.max_num_seqs,)
    return SEQS_CANDIDATES


def variant(model: ModelSpec, config: ModelConfig, tp: int, seqs: int) -> ModelSpec:
    """``model`` with ``tp`` and ``seqs``, its KV cache sized (``concurrency``) to hold
    ``seqs`` sequences of the traffic's mean prompt + output (module note)."""
    assert model.traffic is not None
    limits = resolved_limits(model, config)
    mean = model.traffic.prompt_tokens.mean + model.traffic.output_tokens.mean
    in_flight = limits.max_num_batched_tokens * ASYNC_BATCHES
    one = kv_bytes_per_sequence(
        config,
        min(mean, limits.max_model_len),
        model.dtype,
        model.kv_cache_dtype,
        tensor_parallel=tp,
        in_flight_tokens=in_flight,
    )
    full = kv_bytes_per_sequence(
        config,
        limits.max_model_len,
        model.dtype,
        model.kv_cache_dtype,
        tensor_parallel=tp,
        in_flight_tokens=in_flight,
    )
    concurrency = max(1, min(seqs, math.ceil(seqs * one / full)))
    return model.model_copy(
        update={"tensor_parallel": tp, "max_num_seqs": seqs, "concurrency": concurrency}
    )


def kv_sequences(sizing: Sizing, card_mb: int, config: ModelConfig, model: ModelSpec) -> float:
    """Sequences of the traffic's mean context the replica's KV cache holds: a slice's
    planned KV, or all a whole card's engine has beyond the rest.

    A running sequence holds what it occupies, not vLLM's admission figure: windowed
    layers keep only their window of it (vLLM frees the blocks that leave it at the next
    step), so a Gemma 3 sequence of 8k tokens takes about a quarter of 8k tokens in every
    layer. The tokens in flight (a step's prefill chunks) take their own blocks in the
    windowed layers on top, once per replica. The simulator counts blocks the same way
    (``sim/engine.py``)."""
    assert model.traffic is not None
    memory = sizing.memory
    kv = memory.kv_cache
    if sizing.whole:
        usable = math.floor(sizing.engine.gpu_memory_utilization * card_mb * CUDA_VISIBLE_FRACTION)
        kv = max(kv, usable * MiB - memory.non_kv)
    context = max(1, int(model.traffic.prompt_tokens.mean + model.traffic.output_tokens.mean // 2))

    def held(in_flight: int) -> int:
        return kv_bytes_per_sequence(
            config,
            context,
            model.dtype,
            model.kv_cache_dtype,
            tensor_parallel=model.tensor_parallel,
            in_flight_tokens=in_flight,
        )

    one = held(1)
    in_flight = held(sizing.engine.max_num_batched_tokens * ASYNC_BATCHES) - one
    return max(0, kv - in_flight) / one


def price_per_replica(option: Option, shapes: dict[str, PoolShape], priced: bool) -> float:
    """What one copy costs on the cheapest of its pools: the share of a card it takes
    (the largest of memory, cores and slice count) at the pool's price per card."""
    prices = []
    for name in option.pools:
        pool = shapes[name]
        s = option.sizing
        share = (
            1.0 if s.whole else max(s.slice_mb / pool.card_mb, s.cores / 100, 1 / pool.split_count)
        )
        per_card = pool.cost_per_hour / pool.cards_per_node if priced else 1.0
        prices.append(share * option.span[0] * option.span[1] * per_card)
    return min(prices)


def traffic_options(
    model: ModelSpec,
    config: ModelConfig,
    pools: list[tuple[str, GpuType, PoolShape]],
    perf: PerfModel,
    fit: Fit,
) -> TrafficOptions:
    """Every option of ``model`` on ``pools`` (name, card, shape), with its capacity."""
    assert model.traffic is not None
    work = Workload.of(model.traffic, model.slo)
    rate = model.traffic.rate
    shapes = {name: shape for name, _, shape in pools}
    priced = any(shape.cost_per_hour > 0 for shape in shapes.values())
    found: dict[tuple[object, ...], list[str]] = {}
    sized: dict[tuple[object, ...], tuple[ModelSpec, GpuType, Sizing, tuple[int, int]]] = {}
    rejections: dict[str, Rejection] = {}
    for tp in candidate_tps(model, config):
        for seqs in candidate_seqs(model):
            trial = variant(model, config, tp, seqs)
            for name, gpu, pool_shape in pools:
                got = fit(trial, name)
                if isinstance(got, Rejection):
                    # the smallest candidate's refusal is the one worth reporting
                    rejections.setdefault(name, got)
                    continue
                sizing, span = got
                sig = (gpu.name, pool_shape.card_mb, tp, seqs, sizing, span)
                found.setdefault(sig, []).append(name)
                sized[sig] = (trial, gpu, sizing, span)
    options: list[Option] = []
    unreachable: list[Option] = []
    for key, names in found.items():
        trial, gpu, sizing, span = sized[key]
        step = perf.step_model(ReplicaShape(trial, config, gpu, sizing.memory, sizing.cores))
        batch = BatchLimits(
            max_num_seqs=sizing.engine.max_num_seqs,
            max_num_batched_tokens=sizing.engine.max_num_batched_tokens,
            kv_seqs=kv_sequences(sizing, shapes[names[0]].card_mb, config, trial),
        )
        capacity = replica_capacity(step, batch, work)
        copies = 0
        if capacity.rate > 0:
            copies = max(model.replicas.min, math.ceil(rate / capacity.rate - 1e-9))
        name = f"{gpu.name} tp{trial.tensor_parallel} seqs{trial.max_num_seqs}"
        option = Option(name, trial, gpu, tuple(names), sizing, span, batch, capacity, step, copies)
        if capacity.rate <= 0:
            unreachable.append(option)
        elif copies <= MAX_COPIES:
            options.append(option)
    # a pool some option fits is not a rejection
    fitted = {p for o in options + unreachable for p in o.pools}
    rejections = {p: r for p, r in rejections.items() if p not in fitted}
    ranked = sorted(
        options,
        key=lambda o: (o.copies * price_per_replica(o, shapes, priced), o.copies, o.name),
    )
    kept: list[Option] = []
    per_card: dict[str, int] = {}
    for o in ranked:
        if per_card.get(o.gpu.name, 0) < OPTIONS_PER_CARD:
            kept.append(o)
            per_card[o.gpu.name] = per_card.get(o.gpu.name, 0) + 1
    return TrafficOptions(work, kept, unreachable, rejections)


def closest(unreachable: list[Option]) -> Option:
    """The unreachable option that misses least: the fastest idle step (whole cards, the
    most TP), smallest batch first."""
    return min(
        unreachable,
        key=lambda o: (o.step.step(0, 1, 1).seconds, o.model.max_num_seqs or 0, o.name),
    )
