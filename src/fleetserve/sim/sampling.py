"""Simulating a sample of a model's replicas with their share of its traffic
(``fleetserve simulate --sample-replicas N``; off unless asked for).

Design note - why it is valid. ``n`` replicas of one model that are alike (the same engine
model, limits and KV cache, each alone on its card), fed by a router that treats them alike
(least-loaded, power of two choices, round robin), under open-loop Poisson-like streams,
are exchangeable: which replica serves a request carries no information, and every replica
sees ``1/n`` of the traffic. Simulating ``k < n`` of them with ``k/n`` of each stream's rate
gives the same per-request statistics (TTFT, TPOT, ITL, E2E percentiles: each request's
fate depends on its replica only) and ``k/n`` of every count (requests, tokens,
throughputs, errors), which the reports scale back by ``n/k``. It is a statistical, not an
exact, equivalence: a router balancing ``n`` replicas smooths each one's load a little more
than one balancing ``k`` (the queue-length spread of join-the-shortest-queue shrinks with
the pool), so latency tails move by a few percent. Measured on the benchmark fleet
(benchmarks/simulator.py: 10 models of 2-10 replicas at 60 % load, 0.05 h, two seeds),
the worst model against the full simulation: ``k = 4`` TTFT p50/p90/p99 within 4/5/8 %,
TPOT and E2E within 4 %; ``k = 2`` TTFT p90/p99 up to 11/24 % off; ``k = 1`` (one replica,
a Poisson stream of its own) p50s within 7 % but TTFT p90/p99 up to 23/39 % and TPOT p99
14 % off. Hence :data:`DEFAULT_SAMPLE`; smaller samples are for rough, fast answers.

When it is not valid, and the model is simulated whole (the reason is reported):

* prefix-affinity routing of requests that carry a shared prefix: groups stick to
  replicas, so a replica's traffic is not a uniform share (and ``k`` replicas see every
  group, with more cache hits than ``n`` would);
* replicas that differ (engine model, limits, KV cache) or share a card (with each other
  or another model: interference couples them to replicas outside the sample);
* autoscaling (the replica count is a fleet-wide decision);
* closed-loop or burst streams (a concurrency or burst size of ``n`` replicas does not
  split into ``k/n`` of it: the requests in flight are the fleet's, not a replica's).

Counts that are a fleet's request counts (``num_requests``, ``warmup``,
``max_queued_requests``) are scaled to the sample and rounded; ``max_in_flight`` is scaled
too, an estimate (the fleet's peak is at most the sum of the replicas' peaks), and so is
``mean_in_flight`` (exact: exchangeable replicas at their share of the traffic). Latency
statistics keep the sample's sample count.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetserve.errors import UsageError

if TYPE_CHECKING:  # the simulate command reads DEFAULT_SAMPLE before it imports the simulator
    from fleetserve.bench.metrics import PointSummary
    from fleetserve.sim.fleet import ModelSetup, ReplicaSetup
    from fleetserve.sim.workload import StreamSpec, WorkloadSpec

#: Replicas simulated per model by ``--sample-replicas`` without a number: the smallest
#: sample whose latency percentiles stay within a few percent (see the module note).
DEFAULT_SAMPLE = 4


#: Why a model without traffic is not sampled (nothing to simulate either way).
NO_STREAM = "no stream"


@dataclass(frozen=True)
class Sampling:
    """What the simulation did with one model's replicas."""

    model: str
    replicas: int
    """Replicas the fleet runs."""
    simulated: int
    """Replicas simulated (``replicas`` when the model is simulated whole)."""
    reason: str = ""
    """Why the model is simulated whole ("" when sampled)."""

    @property
    def sampled(self) -> bool:
        return self.simulated < self.replicas

    @property
    def scale(self) -> float:
        """Fleet counts per simulated count."""
        return self.replicas / self.simulated

    def describe(self) -> str:
        if self.sampled:
            return (
                f"{self.simulated} of {self.replicas} replicas simulated, counts scaled "
                f"x{self.scale:.4g} (latencies from the sample)"
            )
        return f"all {self.replicas} replicas simulated ({self.reason})"


def plan_sampling(
    models: Sequence[ModelSetup], workload: WorkloadSpec, per_model: int
) -> dict[str, Sampling]:
    """Which models are sampled down to ``per_model`` replicas, and why the others are not
    (see the module note)."""
    if per_model < 1:
        raise UsageError(
            f"--sample-replicas {per_model}: a sample needs at least 1 replica per model",
            hint=f"e.g. --sample-replicas {DEFAULT_SAMPLE}",
        )
    cards = Counter(r.card for m in models for r in m.replicas[: m.start])
    out: dict[str, Sampling] = {}
    for m in models:
        n = m.start
        streams = [s for s in workload.streams if s.model == m.name]
        reason = _whole_because(m, streams, cards, per_model)
        out[m.name] = Sampling(m.name, n, n if reason else per_model, reason)
    return out


def _whole_because(
    m: ModelSetup, streams: list[StreamSpec], cards: Counter[str], per_model: int
) -> str:
    spec = m.replica_spec
    running = m.replicas[: m.start]
    if not streams:
        return NO_STREAM
    if spec.max > spec.min:
        return "autoscaling"
    if m.start <= per_model:
        return "no more replicas than the sample"
    first = _engine_key(running[0])
    if any(_engine_key(r) != first for r in running):
        return "replicas differ"
    if any(cards[r.card] > 1 for r in running):
        return "replicas share cards"
    if m.routing.policy == "prefix" and any(s.prefix_groups for s in streams):
        return "prefix-affinity routing of shared prefixes"
    if any(s.load.kind != "rate" for s in streams):
        return "closed-loop or burst stream"
    return ""


def _engine_key(r: ReplicaSetup) -> tuple[object, ...]:
    """What makes two replicas' engines behave alike (all of a ReplicaSetup but its name
    and card; the engine model by value)."""
    p = r.perf
    return (
        p.cost,
        p.hardware,
        p.calibration,
        r.max_num_seqs,
        r.max_num_batched_tokens,
        r.kv_blocks,
        r.block_size,
    )


def sampled_inputs(
    models: Sequence[ModelSetup], workload: WorkloadSpec, plan: dict[str, Sampling]
) -> tuple[list[ModelSetup], WorkloadSpec]:
    """The fleet and workload to simulate: each sampled model with its first ``simulated``
    replicas (alike: any would do) and its streams at their share of the traffic."""
    setups = []
    for m in models:
        s = plan[m.name]
        if not s.sampled:
            setups.append(m)
            continue
        k = s.simulated
        spec = m.replica_spec.model_copy(
            update={
                "min": k,
                "max": k,
                "max_queued_requests": max(1, round(m.replica_spec.max_queued_requests / s.scale)),
            }
        )
        setups.append(dataclasses.replace(m, replicas=m.replicas[:k], replica_spec=spec, start=k))
    streams = []
    for st in workload.streams:
        s = plan[st.model]
        if not s.sampled:
            streams.append(st)
            continue
        assert st.load.rate is not None  # rate streams only (plan_sampling)
        update: dict[str, object] = {
            "load": st.load.model_copy(update={"rate": st.load.rate / s.scale}),
            "label": st.point_label,  # the load's label names the fleet's rate
            "warmup": round(st.warmup / s.scale),
        }
        if st.num_requests:
            update["num_requests"] = max(1, round(st.num_requests / s.scale))
        streams.append(st.model_copy(update=update))
    return setups, workload.model_copy(update={"streams": streams})


def scale_point(point: PointSummary, s: Sampling, x: float) -> PointSummary:
    """A sampled model's point as the fleet's: counts and throughputs times
    :attr:`Sampling.scale`, the swept value ``x`` of the fleet's stream, latencies as
    simulated."""
    f = s.scale

    def count(v: int) -> int:
        return round(v * f)

    succeeded, failed = count(point.succeeded), count(point.failed)
    return point.model_copy(
        update={
            "x": x,
            "requests": succeeded + failed,
            "succeeded": succeeded,
            "failed": failed,
            "warmup": count(point.warmup),
            "request_throughput": point.request_throughput * f,
            "output_throughput": point.output_throughput * f,
            "total_throughput": point.total_throughput * f,
            "goodput": None if point.goodput is None else point.goodput * f,
            "total_tokens_out": count(point.total_tokens_out),
            "max_in_flight": count(point.max_in_flight),
            "mean_in_flight": None if point.mean_in_flight is None else point.mean_in_flight * f,
            "errors_by_status": {k: count(v) for k, v in point.errors_by_status.items()},
            "errors_by_type": {k: count(v) for k, v in point.errors_by_type.items()},
        }
    )
