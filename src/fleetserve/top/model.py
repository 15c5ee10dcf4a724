"""What ``fleetserve top`` shows, computed from two metric snapshots (pure).

Design note. A snapshot is the raw counters, gauges and histogram buckets of the fleet at
one instant - from a Ray metrics endpoint or from Prometheus, the same series either way
(:mod:`fleetserve.top.source`). Rates and latency quantiles are deltas between the previous
and the current snapshot, so the view shows the last refresh interval, like ``top``; the first
frame, with no previous snapshot, shows gauges only. Quantiles interpolate inside histogram
buckets as Prometheus's ``histogram_quantile`` does.

Per model: one summary row from the gateway (what clients see: requests in flight, requests
queued in Serve's handles, completion tokens/s, TTFT p50/p99, 5xx/s) and one row per Serve
replica (its state, requests it is processing, and, with real engines, vLLM's waiting
requests, generation tokens/s, TTFT and KV-cache usage of that replica - joined on the
replica id, which vLLM's Ray metrics carry as ``ReplicaId`` and Serve's as ``replica``).
Per tenant: requests/s, tokens/s and rejections/s by reason, from the gateway.

What must stay true: series names come only from :mod:`fleetserve.observe.metrics`; a value
that cannot be known (no previous snapshot, no engine metrics) is ``None``, shown as "-",
never a made-up zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleetserve.observe import metrics as m
from fleetserve.plan.deployment import deployment_name

#: Serve deployments of models are named ``model-<name>`` (fleetserve.serve.control.app).
MODEL_DEPLOYMENT_PREFIX = deployment_name("")


@dataclass(frozen=True)
class Sample:
    """One series' value: exposition name (with ``_total``/``_bucket``), labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Snapshot:
    """Every sample of interest at one instant (``at``: seconds, monotonic or epoch)."""

    at: float
    samples: tuple[Sample, ...]

    def select(self, name: str, **match: str) -> list[Sample]:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in match.items())
        ]


@dataclass(frozen=True)
class ReplicaRow:
    """One Serve replica of a model."""

    replica: str
    state: str
    processing: float | None
    waiting: float | None
    tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    kv_cache: float | None


@dataclass(frozen=True)
class ModelRow:
    """One model as the gateway sees it, and its replicas."""

    model: str
    healthy: int
    replicas: tuple[ReplicaRow, ...]
    in_flight: float | None
    queued: float | None
    tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    kv_cache: float | None
    errors_per_s: float | None


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    requests_per_s: float | None
    tokens_per_s: float | None
    rejections_per_s: float | None
    rejections: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetView:
    models: tuple[ModelRow, ...]
    tenants: tuple[TenantRow, ...]
    interval_s: float | None


# --------------------------------------------------------------------------- arithmetic


def _sum(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) if values else None


def _key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return sample.name, tuple(sorted(sample.labels.items()))


def _increase(prev: Snapshot | None, cur: list[Sample]) -> float | None:
    """Counter increase of ``cur`` series since ``prev`` (a reset counts from zero)."""
    if prev is None:
        return None
    before = {_key(s): s.value for s in prev.samples}
    total = 0.0
    for sample in cur:
        old = before.get(_key(sample), 0.0)
        total += sample.value - old if sample.value >= old else sample.value
    return total


def _rate(prev: Snapshot | None, cur: Snapshot, samples: list[Sample]) -> float | None:
    if prev is None or cur.at <= prev.at:
        return None
    inc = _increase(prev, samples)
    return None if inc is None else inc / (cur.at - prev.at)


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """``histogram_quantile(q)`` over cumulative bucket counts by upper bound ``le``."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    if not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower  # Prometheus returns the highest finite bound
            width = count - below
            return lower + (upper - lower) * ((rank - below) / width if width > 0 else 1.0)
        lower, below = upper, count
    return lower


def _buckets(
    prev: Snapshot | None, cur: Snapshot, name: str, match: Mapping[str, str]
) -> dict[float, float]:
    """Bucket counts (by ``le``) added since ``prev``, summed over matching series."""
    out: dict[float, float] = {}
    for sample in cur.select(name, **match):
        le = float(sample.labels.get("le", "nan").replace("+Inf", "inf"))
        if math.isnan(le):
            continue
        inc = _increase(prev, [sample]) if prev is not None else None
        out[le] = out.get(le, 0.0) + (inc if inc is not None else 0.0)
    return out


def _quantiles(
    prev: Snapshot | None, cur: Snapshot, name: str, match: Mapping[str, str]
) -> tuple[float | None, float | None]:
    if prev is None:
        return None, None
    buckets = _buckets(prev, cur, name, match)
    return quantile(0.5, buckets), quantile(0.99, buckets)


# --------------------------------------------------------------------------- view


def _replica_rows(prev: Snapshot | None, cur: Snapshot, deployment: str) -> tuple[ReplicaRow, ...]:
    states: dict[str, str] = {}
    for s in cur.select(m.SERVE_REPLICA_HEALTHY.name, deployment=deployment):
        replica = s.labels.get("replica")
        if replica:
            # A replica Serve stopped keeps a 0 series for a while: healthy wins.
            healthy = s.value >= 1 or states.get(replica) == "healthy"
            states[replica] = "healthy" if healthy else "unhealthy"
    for s in cur.select(m.SERVE_REPLICA_PROCESSING.name, deployment=deployment):
        replica = s.labels.get("replica")
        if replica and replica not in states:
            states[replica] = "running"
    rows = []
    for replica in sorted(states):
        engine = {"ReplicaId": replica}
        p50, p99 = _quantiles(prev, cur, m.VLLM_TTFT.bucket, engine)
        kv = [s.value for s in cur.select(m.VLLM_KV_CACHE_USAGE.name, **engine)]
        rows.append(
            ReplicaRow(
                replica=replica,
                state=states[replica],
                processing=_sum(
                    cur.select(
                        m.SERVE_REPLICA_PROCESSING.name, deployment=deployment, replica=replica
                    )
                ),
                waiting=_sum(cur.select(m.VLLM_REQUESTS_WAITING.name, **engine)),
                tokens_per_s=(
                    _rate(prev, cur, gen)
                    if (gen := cur.select(m.VLLM_GENERATION_TOKENS.name, **engine))
                    else None
                ),
                ttft_p50=p50,
                ttft_p99=p99,
                kv_cache=max(kv) if kv else None,
            )
        )
    return tuple(rows)


def _models(cur: Snapshot) -> list[str]:
    names = {
        s.labels["model"]
        for s in cur.samples
        if s.name.startswith("ray_fleetserve_gateway_") and s.labels.get("model")
    }
    names.discard("unknown")
    for s in cur.select(m.SERVE_REPLICA_HEALTHY.name):
        deployment = s.labels.get("deployment", "")
        if deployment.startswith(MODEL_DEPLOYMENT_PREFIX) and not any(
            deployment_matches(deployment, n) for n in names
        ):
            names.add(deployment[len(MODEL_DEPLOYMENT_PREFIX) :])
    return sorted(names)


def deployment_matches(deployment: str, model: str) -> bool:
    """Whether ``deployment`` is the Serve deployment of ``model``."""
    return deployment == deployment_name(model)


def build_view(prev: Snapshot | None, cur: Snapshot) -> FleetView:
    """The rows ``fleetserve top`` shows for the interval ``prev`` -> ``cur``."""
    models = []
    deployments = {s.labels.get("deployment", "") for s in cur.samples}
    for model in _models(cur):
        deployment = next(
            (d for d in sorted(deployments) if deployment_matches(d, model)),
            deployment_name(model),
        )
        replicas = _replica_rows(prev, cur, deployment)
        gw = {"model": model}
        p50, p99 = _quantiles(prev, cur, m.GATEWAY_TTFT.bucket, gw)
        kv = [r.kv_cache for r in replicas if r.kv_cache is not None]
        errors = [
            s
            for s in cur.select(m.GATEWAY_REQUESTS.name, **gw)
            if s.labels.get("status_code", "").startswith("5")
        ]
        engine_tokens = cur.select(m.VLLM_GENERATION_TOKENS.name, model_name=model)
        tokens = engine_tokens or cur.select(m.GATEWAY_COMPLETION_TOKENS.name, **gw)
        models.append(
            ModelRow(
                model=model,
                healthy=sum(1 for r in replicas if r.state in ("healthy", "running")),
                replicas=replicas,
                in_flight=_sum(cur.select(m.GATEWAY_IN_FLIGHT.name, **gw)),
                queued=_sum(cur.select(m.SERVE_QUEUED_QUERIES.name, deployment=deployment)),
                tokens_per_s=_rate(prev, cur, tokens) if tokens else None,
                ttft_p50=p50,
                ttft_p99=p99,
                kv_cache=max(kv) if kv else None,
                errors_per_s=_rate(prev, cur, errors) if prev is not None else None,
            )
        )
    return FleetView(
        models=tuple(models),
        tenants=_tenants(prev, cur),
        interval_s=(cur.at - prev.at) if prev is not None else None,
    )


def _tenants(prev: Snapshot | None, cur: Snapshot) -> tuple[TenantRow, ...]:
    names = sorted(
        {
            s.labels["tenant"]
            for s in cur.samples
            if s.name.startswith("ray_fleetserve_gateway_") and "tenant" in s.labels
        }
    )
    rows = []
    for tenant in names:
        t = {"tenant": tenant}
        rejected = cur.select(m.GATEWAY_REJECTIONS.name, **t)
        by_reason: dict[str, float] = {}
        for reason in sorted({s.labels.get("reason", "") for s in rejected}):
            rate = _rate(prev, cur, [s for s in rejected if s.labels.get("reason") == reason])
            if rate:
                by_reason[reason] = rate
        tokens = cur.select(m.GATEWAY_PROMPT_TOKENS.name, **t) + cur.select(
            m.GATEWAY_COMPLETION_TOKENS.name, **t
        )
        rows.append(
            TenantRow(
                tenant=tenant,
                requests_per_s=_rate(prev, cur, cur.select(m.GATEWAY_REQUESTS.name, **t)),
                tokens_per_s=_rate(prev, cur, tokens),
                rejections_per_s=_rate(prev, cur, rejected),
                rejections=by_reason,
            )
        )
    return tuple(rows)


#: Series ``fleetserve top`` reads (exposition names), for sources that can filter.
def wanted_series() -> tuple[str, ...]:
    names: list[str] = []
    for metric in (
        m.GATEWAY_REQUESTS,
        m.GATEWAY_PROMPT_TOKENS,
        m.GATEWAY_COMPLETION_TOKENS,
        m.GATEWAY_REJECTIONS,
        m.GATEWAY_IN_FLIGHT,
        m.SERVE_REPLICA_HEALTHY,
        m.SERVE_REPLICA_PROCESSING,
        m.SERVE_QUEUED_QUERIES,
        m.VLLM_REQUESTS_WAITING,
        m.VLLM_GENERATION_TOKENS,
        m.VLLM_KV_CACHE_USAGE,
    ):
        names.append(metric.name)
    names += [m.GATEWAY_TTFT.bucket, m.VLLM_TTFT.bucket]
    return tuple(names)
