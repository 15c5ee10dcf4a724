"""Replica capacity: the most requests per second one replica serves within its SLOs.

Design note. A replica is vLLM's continuous batching: every step runs the decode
sequences in the batch plus up to ``max_num_batched_tokens`` minus those of prefill
(chunked prefill). The time of one step comes from the performance model behind
:class:`StepModel` (a roofline per GPU, slice and tensor-parallel size); this module turns
step times into latency percentiles at an arrival rate, and searches the largest rate
that meets every target. At Poisson rate ``lam`` (lengths ``P`` prompt, ``O`` output):

* Steady step: the mean step ``tau`` solves ``tau = step(lam*E[P]*tau prefill tokens,
  n = lam*E[O]*tau decode sequences)`` (Little's law: a request decodes for ``E[O]``
  steps). The iteration from the idle step rises monotonically to the least fixed point;
  none (or one past the chunk or the batch) means the replica cannot keep up.
* Batch slots (M/M/c, Erlang C): ``c = min(max_num_seqs, KV cache / mean context)``
  slots, each held ``E[O]*tau`` plus the prefill; a request finding them all busy waits,
  with the exponential tail ``P(W > t) = C(c, a) exp(-(c*mu - lam) t)``.
* Prefill (M/G/1, Pollaczek-Khinchine): while prefill tokens wait each step carries a full
  chunk, so the prefill server works at ``u = step(chunk, n) / chunk`` seconds per token;
  ``rho = lam*E[P]*u``, ``E[W] = lam*E[P^2]*u^2 / (2(1 - rho))``, tail as exponential
  (``W_q = E[W]/rho * ln(rho / (1 - q))``).
* TTFT_q = slot wait_q + prefill wait_q + the step in progress (``q*tau``) + the steps of
  the q-quantile prompt. Adding quantiles is conservative (the quantile of a sum is never
  above the sum of the quantiles).
* TPOT_q: during one request's decode (``E[O]`` steps) ``m = lam*E[O]*tau`` other prompts
  arrive and are prefilled in its steps (a compound Poisson count of tokens, mean
  ``m*E[P]``, variance ``m*E[P^2]``); its TPOT is the step with its q-quantile share of
  them.

Every metric rises with the rate, so the capacity is a bisection on the rate; the
constraint that fails just above it is the one that binds. Lengths are lognormal with the
spec's mean and 99th percentile (:class:`Lengths`).

Not :func:`fleetserve.perf.steady.estimate`: both solve the same steady-step fixed point,
but that one answers "what does this engine do at this load" in *means* (mean TTFT, TPOT =
the mean step, raw capacity where a step is full) for a fixed request shape, while this
module answers "how much may one replica take within its SLOs" in *percentiles* of
length distributions (TTFT/TPOT quantiles, the goodput below the binding target), for
planning. Different quantities, so two models; they share the Erlang C term
(:func:`erlang_c`) and the step-time model (:mod:`fleetserve.plan.roofline` wraps
:class:`fleetserve.perf.EnginePerf`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal, Protocol

from fleetserve.plan.architecture import ModelConfig
from fleetserve.plan.gpus import GpuType
from fleetserve.plan.memory import ReplicaMemory
from fleetserve.spec import LengthSpec, ModelSpec, PercentileTargets, SloSpec, TrafficSpec

#: What limits a replica's rate (or keeps a model off every card: ``memory``).
Binding = Literal["memory", "ttft", "tpot", "throughput", "kv_capacity"]

_Z99 = NormalDist().inv_cdf(0.99)
#: The longest tail a lognormal has for its mean: p99 / mean <= exp(z99^2 / 2).
MAX_TAIL_RATIO = 15.0
#: Relative precision of the capacity search.
RATE_PRECISION = 1e-4
#: Iterations of the steady-step fixed point before the replica is declared overloaded.
_FIXED_POINT_STEPS = 400


@dataclass(frozen=True)
class StepCost:
    """One engine step: its time and what it is made of, in words with the numbers."""

    seconds: float
    why: str = ""
    """The dominant terms (e.g. 'weights 54.0 GB / 300 GB/s'), for explanations."""


class StepModel(Protocol):
    """The time of one engine step of one replica (its model, card, slice and TP)."""

    @property
    def turn_s(self) -> float:
        """The longest turn an engine holds on a card it shares (0: engines never share
        what it runs on, e.g. a CPU host's pinned cores)."""
        ...

    def step(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> StepCost:
        """A step prefilling ``prefill_tokens`` while decoding ``decode_seqs`` sequences
        holding ``context_tokens`` tokens of KV between them."""
        ...

    def turn(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        """The turn a step of this load holds on a card it shares, which the other engines
        there wait for: its work on the whole card, at most :attr:`turn_s`."""
        ...

    def beside(self, others_s: float) -> StepModel:
        """The same replica on a card where other engines hold ``others_s`` seconds of
        turns a round (its steps wait on them)."""
        ...


@dataclass(frozen=True)
class ReplicaShape:
    """One candidate replica as the performance model sees it: the model (its TP, PP,
    dtype and quantization), its architecture, the card, what it holds per card, and its
    HAMi ``gpucores`` share (100 for whole cards)."""

    model: ModelSpec
    config: ModelConfig
    gpu: GpuType
    memory: ReplicaMemory
    cores_percent: int


class PerfModel(Protocol):
    """The performance model seam: the step-time model of one candidate replica."""

    def step_model(self, shape: ReplicaShape) -> StepModel: ...


@dataclass(frozen=True)
class Lengths:
    """A lognormal token-length distribution fixed by its mean and 99th percentile."""

    mean: float
    p99: float

    @classmethod
    def of(cls, spec: LengthSpec) -> Lengths:
        return cls(float(spec.mean), float(min(spec.tail, spec.mean * MAX_TAIL_RATIO)))

    @property
    def sigma(self) -> float:
        """The lognormal's sigma: ``ln(p99/mean) = z*sigma - sigma^2/2``, smaller root."""
        ratio = math.log(self.p99 / self.mean) if self.p99 > self.mean else 0.0
        return _Z99 - math.sqrt(max(0.0, _Z99 * _Z99 - 2 * ratio))

    def quantile(self, q: float) -> float:
        s = self.sigma
        if s == 0:
            return self.mean
        mu = math.log(self.mean) - s * s / 2
        return math.exp(mu + s * NormalDist().inv_cdf(q))

    @property
    def second_moment(self) -> float:
        return self.mean * self.mean * math.exp(self.sigma**2)


@dataclass(frozen=True)
class Workload:
    """A model's traffic shape (rate aside) and its targets as ``(quantile, seconds)``."""

    prompt: Lengths
    output: Lengths
    ttft: tuple[tuple[float, float], ...] = ()
    tpot: tuple[tuple[float, float], ...] = ()

    @classmethod
    def of(cls, traffic: TrafficSpec, slo: SloSpec | None) -> Workload:
        def targets(spec: PercentileTargets | None) -> tuple[tuple[float, float], ...]:
            return () if spec is None else tuple((q, ms / 1000) for q, ms in spec.targets())

        return cls(
            Lengths.of(traffic.prompt_tokens),
            Lengths.of(traffic.output_tokens),
            targets(slo.ttft_ms) if slo else (),
            targets(slo.tpot_ms) if slo else (),
        )

    @property
    def mean_context(self) -> float:
        """Mean KV tokens of a running sequence (its prompt and half its output)."""
        return self.prompt.mean + self.output.mean / 2

    def quantiles(self) -> tuple[float, ...]:
        return tuple(sorted({q for q, _ in self.ttft + self.tpot} | {0.5, 0.99}))


@dataclass(frozen=True)
class BatchLimits:
    """The engine settings of one candidate replica that bound its batch."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_seqs: float
    """Sequences of the workload's mean context its KV cache holds."""

    @property
    def slots(self) -> float:
        return max(1.0, min(float(self.max_num_seqs), self.kv_seqs))


@dataclass(frozen=True)
class Load:
    """Predicted behaviour of one replica at one arrival rate."""

    rate: float
    stable: bool
    overload: Binding | None = None
    """Why it cannot keep up (``throughput`` or ``kv_capacity``); None when stable."""
    step_s: float = 0.0
    batch: float = 0.0
    ttft_s: dict[float, float] = field(default_factory=dict)
    tpot_s: dict[float, float] = field(default_factory=dict)


def erlang_c(servers: float, offered: float) -> float:
    """Probability an arrival waits in M/M/c (c rounded down, at least 1) at ``offered``
    servers' worth of load (Erlang C; also :func:`fleetserve.perf.steady.estimate`'s)."""
    c = max(1, math.floor(servers))
    if offered >= c:
        return 1.0
    b = 1.0  # Erlang B by its stable recursion, then C from B
    for k in range(1, c + 1):
        b = offered * b / (k + offered * b)
    rho = offered / c
    return b / (1 - rho + rho * b)


def _exp_tail(p_wait: float, rate_out: float, q: float) -> float:
    """The q-quantile of a wait with ``P(W > t) = p_wait * exp(-rate_out * t)``."""
    if p_wait <= 1 - q or rate_out <= 0:
        return 0.0
    return math.log(p_wait / (1 - q)) / rate_out


def predict(model: StepModel, engine: BatchLimits, work: Workload, rate: float) -> Load:
    """Latency percentiles of one replica at ``rate`` requests per second (module note)."""
    p_mean, o_mean, ctx = work.prompt.mean, work.output.mean, work.mean_context
    chunk = float(engine.max_num_batched_tokens)
    slots = engine.slots
    overload: Binding = "kv_capacity" if engine.kv_seqs < engine.max_num_seqs else "throughput"
    tau = model.step(0, 1, ctx).seconds
    for _ in range(_FIXED_POINT_STEPS):
        n = max(1.0, rate * o_mean * tau)
        prefill = rate * p_mean * tau
        if n > slots:
            return Load(rate, False, overload)
        if prefill > chunk - n:
            return Load(rate, False, "throughput")
        nxt = model.step(prefill, n, n * ctx).seconds
        if nxt <= tau * (1 + 1e-9):
            tau = max(tau, nxt)
            break
        tau = nxt
    else:
        return Load(rate, False, "throughput")
    n = max(1.0, rate * o_mean * tau)
    room = chunk - n
    full = model.step(room, n, n * ctx).seconds
    per_token = full / room
    rho = rate * p_mean * per_token
    if rho >= 1:
        return Load(rate, False, "throughput")
    # batch slots: M/M/c with each slot held for the decode and the prefill
    hold = o_mean * tau + p_mean * per_token
    offered = rate * hold
    if offered >= math.floor(slots):
        return Load(rate, False, overload)
    p_slot = erlang_c(slots, offered)
    drain = math.floor(slots) / hold - rate
    mean_wait = rate * work.prompt.second_moment * per_token**2 / (2 * (1 - rho))
    ttft: dict[float, float] = {}
    tpot: dict[float, float] = {}
    for q in work.quantiles():
        prefill_wait = _exp_tail(rho, rho / mean_wait if mean_wait > 0 else 0.0, q)
        ttft[q] = (
            _exp_tail(p_slot, drain, q)
            + prefill_wait
            + q * tau
            + _prefill_time(model, work.prompt.quantile(q), room, n, ctx)
        )
        arrivals = rate * o_mean * tau
        z = NormalDist().inv_cdf(q)
        tokens = arrivals * p_mean + z * math.sqrt(arrivals * work.prompt.second_moment)
        share = min(room, max(0.0, tokens / o_mean))
        tpot[q] = model.step(share, n, n * ctx).seconds
    return Load(rate, True, None, tau, n, ttft, tpot)


def _prefill_time(model: StepModel, tokens: float, room: float, n: float, ctx: float) -> float:
    """Steps to prefill ``tokens`` with ``room`` prefill tokens per step beside ``n`` decodes."""
    full = math.floor(tokens / room)
    rest = tokens - full * room
    t = full * model.step(room, n, n * ctx).seconds
    return t + (model.step(rest, n, n * ctx).seconds if rest > 0 else 0.0)


def violations(load: Load, work: Workload) -> list[tuple[Binding, str]]:
    """Every target ``load`` misses, as (constraint, sentence)."""
    if not load.stable:
        assert load.overload is not None
        return [(load.overload, "the replica cannot keep up")]
    out: list[tuple[Binding, str]] = []
    for name, targets, got in (("ttft", work.ttft, load.ttft_s), ("tpot", work.tpot, load.tpot_s)):
        for q, limit in targets:
            if got[q] > limit:
                out.append(
                    (
                        "ttft" if name == "ttft" else "tpot",
                        f"{name.upper()} p{round(q * 100)} {got[q] * 1000:,.1f} ms > "
                        f"{limit * 1000:,.0f} ms",
                    )
                )
    return out


@dataclass(frozen=True)
class Capacity:
    """The most one replica serves within the targets, and what stops it going higher."""

    rate: float
    """Requests per second within every target (0: none at any rate)."""
    binding: Binding
    reason: str
    """The binding constraint in numbers."""
    load: Load
    """The prediction at ``rate`` (at a vanishing rate when ``rate`` is 0)."""


def replica_capacity(model: StepModel, engine: BatchLimits, work: Workload) -> Capacity:
    """The largest rate one replica sustains within ``work``'s targets (module note)."""
    idle = model.step(0, 1, work.mean_context).seconds
    # necessary conditions bound the search: every slot decoding at the idle step, and
    # the whole chunk prefilling at the idle step
    hi = min(
        engine.slots / (work.output.mean * idle),
        engine.max_num_batched_tokens / (work.prompt.mean * idle),
    )
    tiny = hi * 1e-9
    first = predict(model, engine, work, tiny)
    missed = violations(first, work)
    if missed:
        binding, _ = missed[0]
        return Capacity(0.0, binding, unreachable(model, engine, work, first, binding), first)
    lo = tiny
    while hi - lo > RATE_PRECISION * hi:
        mid = (lo + hi) / 2
        if violations(predict(model, engine, work, mid), work):
            hi = mid
        else:
            lo = mid
    at = predict(model, engine, work, lo)
    above = violations(predict(model, engine, work, hi), work) or [("throughput", "")]
    binding, sentence = above[0]
    if binding in ("throughput", "kv_capacity"):
        sentence = _overload_sentence(binding, engine, work, at)
    return Capacity(lo, binding, f"{sentence} above {lo:,.2f} req/s per replica", at)


def _overload_sentence(binding: Binding, engine: BatchLimits, work: Workload, at: Load) -> str:
    if binding == "kv_capacity":
        return (
            f"the KV cache holds {engine.kv_seqs:,.1f} sequences of {work.mean_context:,.0f} "
            f"tokens (max_num_seqs {engine.max_num_seqs}), batch {at.batch:,.1f}"
        )
    return (
        f"batch {at.batch:,.1f} of max_num_seqs {engine.max_num_seqs}, step "
        f"{at.step_s * 1000:,.1f} ms: the replica stops keeping up"
    )


def unreachable(
    model: StepModel, engine: BatchLimits, work: Workload, idle: Load, binding: Binding
) -> str:
    """Why a target fails even at a vanishing rate, with the step that breaks it."""
    if binding == "tpot":
        q, limit = next((q, s) for q, s in work.tpot if idle.tpot_s[q] > s)
        step = model.step(0, 1, work.mean_context)
        return (
            f"TPOT p{round(q * 100)} {limit * 1000:,.0f} ms unreachable: one decode step at "
            f"batch 1 takes {step.seconds * 1000:,.1f} ms ({step.why})"
        )
    if binding == "ttft":
        q, limit = next((q, s) for q, s in work.ttft if idle.ttft_s[q] > s)
        tokens = work.prompt.quantile(q)
        room = engine.max_num_batched_tokens - 1
        full = model.step(min(tokens, room), 1, work.mean_context)
        return (
            f"TTFT p{round(q * 100)} {limit * 1000:,.0f} ms unreachable: prefilling the "
            f"p{round(q * 100)} prompt ({tokens:,.0f} tokens) alone takes "
            f"{idle.ttft_s[q] * 1000:,.0f} ms (a step of {min(tokens, room):,.0f} tokens: "
            f"{full.seconds * 1000:,.1f} ms, {full.why})"
        )
    return _overload_sentence(binding, engine, work, idle)
