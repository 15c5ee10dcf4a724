"""Scale a model on what saturates an LLM engine, through Ray Serve's custom policy API.

Design note. Ray Serve's default policy divides ongoing requests by
``target_ongoing_requests``. For an LLM engine that misses the two ways a replica runs out
before its request count says so: its KV cache fills (long prompts, long outputs), or its
batch is full and requests wait inside the engine. Every replica reports these as custom
autoscaling metrics (``ModelServer.record_autoscaling_stats``: vLLM's ``num_waiting_reqs``
and ``kv_cache_usage`` from its scheduler, plus tokens/s), Serve averages them over
``look_back_period_s``, and :func:`desired_replicas` wants the most replicas any signal
asks for:

* requests: ongoing (incl. queued in handles) / ``target_ongoing_requests``;
* KV cache: replicas x mean usage / ``target_kv_cache_usage``;
* waiting: replicas + waiting / ``target_waiting_requests`` (only while some wait - a full
  batch never scales down).

Ray wraps the policy with the deployment's ``upscale_delay_s`` / ``downscale_delay_s`` /
scaling factors and min/max, and starts the first replica at once when a request arrives at
zero replicas (its cold-start path), so those stay Serve's, configured from the spec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetserve.engine.signals import KV_CACHE_USAGE, WAITING


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """One deployment's load, averaged over the look-back window."""

    replicas: int
    ongoing_requests: float
    waiting_requests: float = 0.0
    """Summed over replicas."""
    kv_cache_usage: float = 0.0
    """Mean over replicas, in [0, 1]."""


@dataclass(frozen=True, slots=True)
class ScalingTargets:
    ongoing_requests: float
    kv_cache_usage: float
    waiting_requests: float


def desired_replicas(signals: LoadSignals, targets: ScalingTargets) -> tuple[float, str]:
    """Replicas wanted (before Serve's delays and bounds), and the signal that decided."""
    n = signals.replicas
    if n == 0:
        return (1.0 if signals.ongoing_requests > 0 else 0.0), "cold start"
    wants = {
        "requests": signals.ongoing_requests / targets.ongoing_requests,
        "kv cache": n * signals.kv_cache_usage / targets.kv_cache_usage,
        "waiting": (
            n + signals.waiting_requests / targets.waiting_requests
            if signals.waiting_requests > 0
            else 0.0
        ),
    }
    reason = max(wants, key=lambda k: wants[k])
    return wants[reason], reason


def _sum(values: Mapping[Any, float] | None) -> float:
    return float(sum(values.values())) if values else 0.0


def _mean(values: Mapping[Any, float] | None) -> float:
    return float(sum(values.values()) / len(values)) if values else 0.0


class LLMAutoscalingPolicy:
    """Ray Serve custom autoscaling policy (class form; ``policy_kwargs`` -> ``__init__``)."""

    def __init__(
        self,
        target_ongoing_requests: float,
        target_kv_cache_usage: float,
        target_waiting_requests: float,
    ) -> None:
        self.targets = ScalingTargets(
            ongoing_requests=target_ongoing_requests,
            kv_cache_usage=target_kv_cache_usage,
            waiting_requests=target_waiting_requests,
        )

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        metrics: Mapping[str, Mapping[Any, float]] = ctx.aggregated_metrics or {}
        signals = LoadSignals(
            replicas=ctx.current_num_replicas,
            ongoing_requests=float(ctx.total_num_requests),
            waiting_requests=_sum(metrics.get(WAITING)),
            kv_cache_usage=_mean(metrics.get(KV_CACHE_USAGE)),
        )
        want, reason = desired_replicas(signals, self.targets)
        low, high = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        decision = min(high, max(low, math.ceil(want - 1e-9)))
        state = dict(ctx.policy_state or {})
        state["fleetserve_reason"] = reason
        return decision, state
