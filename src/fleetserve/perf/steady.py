"""Steady-state throughput, TTFT and TPOT of one engine at a load, without simulating.

Design note. In steady state under continuous batching every step has the same mix on
average: ``B`` decoding sequences and ``q`` prefills of ``P`` uncached prompt tokens. With
arrivals at ``lam`` requests/s and ``D = output - 1`` decode steps per request, Little's
law ties them to the mean step time ``tau``: ``q = lam tau`` and ``B = lam D tau``. So
``tau`` is a fixed point of ``tau = T(lam tau)``, where ``T(x)`` is the step time
(:class:`fleetserve.perf.model.EnginePerf`) of a step with ``x D`` decodes of mean context
``P + output/2`` and ``x`` prefills. ``T`` grows with ``x``, so a root exists while the load
is below capacity and bisection finds it.

Capacity is where a step is full: ``x`` reaches ``x_max = min(N / (D + 1), M / (D + P))``
(``N``: the sequences the engine runs at once - ``max_num_seqs``, or fewer when the KV
cache holds fewer sequences of mean context; ``M``: ``max_num_batched_tokens``), so the
engine serves at most ``lam_max = x_max / T(x_max)`` requests/s.

Latency: ``TPOT = tau`` (every decode step is one mixed step). ``TTFT = request overhead +
tau / 2`` (the step in progress when the request arrives) ``+ ceil(P / (M - B))`` prefill
steps ``+ Wq``, the wait for a free sequence slot: ``N`` slots each busy ``(D + 1) tau``
per request are an M/D/N queue, whose wait is about half the M/M/N (Erlang C) wait
(Lee and Longton's approximation). Near saturation Wq dominates and the estimate is only
indicative: the simulator (:mod:`fleetserve.sim`) is the exact answer for a workload.

Not :mod:`fleetserve.plan.capacity`: that module solves the same steady-step fixed point
but answers a different question - the most requests/s one replica takes within TTFT/TPOT
*percentile* targets over lognormal length distributions (goodput, for ``plan``) - while
this one gives *means* at a given load for one request shape, and the raw capacity where a
step is full. The Erlang C term is one function (:func:`fleetserve.plan.capacity.erlang_c`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetserve.perf.model import EnginePerf, StepLoad, _pairs
from fleetserve.plan.capacity import erlang_c


@dataclass(frozen=True, slots=True)
class Traffic:
    """The load offered to one engine."""

    rate: float
    """Requests/s."""
    prompt_tokens: float
    """Mean prompt tokens."""
    output_tokens: float
    """Mean generated tokens (>= 1)."""
    cached_fraction: float = 0.0
    """Share of prompt tokens found in the prefix cache (not recomputed)."""


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's batching limits (its vLLM settings)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int | None = None
    """Tokens the KV cache holds (None: never the limit)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What one engine delivers at a load (seconds, requests/s, tokens/s)."""

    rate: float
    """Requests/s served (the offered rate, or the capacity when saturated)."""
    capacity: float
    """Most requests/s the engine sustains at this request shape."""
    utilization: float
    """Offered rate / capacity (>= 1: saturated, queues grow without bound)."""
    batch: float
    """Mean decoding sequences per step."""
    step_s: float
    ttft_s: float
    """Mean TTFT (inf when saturated)."""
    tpot_s: float
    output_throughput: float
    bound: str
    """What bounds a step at this load: ``compute``, ``memory`` or ``launch`` (the host
    launching a step too large for CUDA graphs); ``capacity_by`` says what caps the batch."""
    capacity_by: str
    """``max_num_seqs``, ``kv_cache`` or ``max_num_batched_tokens``."""

    @property
    def saturated(self) -> bool:
        return self.utilization >= 1.0


def _mixed_load(perf: EnginePerf, x: float, traffic: Traffic) -> StepLoad:
    """The mean step when ``x`` requests start per step (``x D`` decodes, ``x`` prefills)."""
    p = traffic.prompt_tokens * (1.0 - traffic.cached_fraction)
    cached = traffic.prompt_tokens - p
    d = max(traffic.output_tokens - 1.0, 0.0)
    w = perf.cost.window
    ctx = traffic.prompt_tokens + traffic.output_tokens / 2.0
    win = ctx if w is None else min(ctx, float(w))
    b = x * d
    new = round(p)
    before = round(cached)
    return StepLoad(
        tokens=round(b + x * p),
        seqs=math.ceil(b + x),
        sampled=math.ceil(b + x),
        pairs=b * (ctx + 1) + x * _pairs(new, before, None),
        window_pairs=b * (win + 1) + x * _pairs(new, before, w),
        context=b * ctx + x * cached,
        window_context=b * win + x * (cached if w is None else min(cached, w)),
    )


def _erlang_c_wait(servers: int, arrival: float, service_s: float) -> float:
    """Mean wait in an M/M/c queue (Erlang C), seconds."""
    a = arrival * service_s  # offered load in servers
    if servers <= 0 or a >= servers:
        return math.inf
    return erlang_c(servers, a) * service_s / (servers - a)


def estimate(
    perf: EnginePerf, traffic: Traffic, limits: EngineLimits, *, bandwidth_share: float = 1.0
) -> Estimate:
    """Steady state of ``perf``'s engine under ``traffic`` (see the module note).

    ``bandwidth_share``: 1/n when n replicas on the same card step at once (the
    interference rule of :mod:`fleetserve.perf.model`).
    """
    out = max(traffic.output_tokens, 1.0)
    d = out - 1.0
    p = max(traffic.prompt_tokens * (1.0 - traffic.cached_fraction), 1.0)
    seqs = float(limits.max_num_seqs)
    capacity_by = "max_num_seqs"
    if limits.kv_cache_tokens is not None:
        by_kv = limits.kv_cache_tokens / max(traffic.prompt_tokens + out / 2.0, 1.0)
        if by_kv < seqs:
            seqs, capacity_by = max(by_kv, 1.0), "kv_cache"
    x_seq = seqs / (d + 1.0)
    x_tok = limits.max_num_batched_tokens / (d + p)
    if x_tok < x_seq:
        capacity_by = "max_num_batched_tokens"
    x_max = min(x_seq, x_tok)

    def step(x: float) -> float:
        return perf.step_time(_mixed_load(perf, x, traffic), bandwidth_share=bandwidth_share)

    tau_sat = step(x_max)
    capacity = x_max / tau_sat
    lam = traffic.rate
    utilization = lam / capacity if capacity > 0 else math.inf
    if utilization >= 1.0:
        tau, served, ttft = tau_sat, capacity, math.inf
    else:
        lo, hi = 0.0, tau_sat
        for _ in range(60):  # bisection on tau = T(lam tau)
            mid = (lo + hi) / 2
            if step(lam * mid) > mid:
                lo = mid
            else:
                hi = mid
        tau, served = hi, lam
        batch = lam * d * tau
        room = max(limits.max_num_batched_tokens - batch, 1.0)
        prefill_steps = math.ceil(p / room)
        slots = max(1, math.floor(seqs))
        wait = 0.5 * _erlang_c_wait(slots, lam, (d + 1.0) * tau)
        serving = perf.calibration.request_overhead_s + perf.calibration.admission_s
        ttft = serving + tau / 2 + prefill_steps * tau + wait
    load = _mixed_load(perf, served * tau, traffic)
    return Estimate(
        rate=served,
        capacity=capacity,
        utilization=utilization,
        batch=served * d * tau,
        step_s=tau,
        ttft_s=ttft,
        tpot_s=tau,
        output_throughput=served * out,
        bound=perf.terms(load, bandwidth_share=bandwidth_share).bound,
        capacity_by=capacity_by,
    )
