"""The LLM autoscaling policy: the pure decision, and the policy run inside Ray Serve's own
wrapper (delays, bounds, cold start) on Serve's AutoscalingContext."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ray.serve import autoscaling_policy
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from fleetserve.serve.control.autoscaling import (
    LLMAutoscalingPolicy,
    LoadSignals,
    ScalingTargets,
    desired_replicas,
)

TARGETS = ScalingTargets(ongoing_requests=4, kv_cache_usage=0.8, waiting_requests=2)
DEP = DeploymentID(name="model-x", app_name="fleetserve")


def test_requests_signal_is_serves_default() -> None:
    assert desired_replicas(LoadSignals(2, ongoing_requests=12), TARGETS) == (3.0, "requests")


def test_full_kv_cache_scales_up_before_request_count_does() -> None:
    want, reason = desired_replicas(LoadSignals(2, 4, kv_cache_usage=0.96), TARGETS)
    assert reason == "kv cache"
    assert want == 2 * 0.96 / 0.8


def test_waiting_requests_scale_up_and_block_scale_down() -> None:
    want, reason = desired_replicas(LoadSignals(2, 2, waiting_requests=4), TARGETS)
    assert (want, reason) == (4.0, "waiting")
    idle_but_waiting = desired_replicas(LoadSignals(3, 0, waiting_requests=0.5), TARGETS)
    assert idle_but_waiting[0] >= 3


def test_idle_scales_down_and_zero_waits_for_a_request() -> None:
    assert desired_replicas(LoadSignals(3, 0), TARGETS)[0] == 0
    assert desired_replicas(LoadSignals(0, 0), TARGETS) == (0.0, "cold start")
    assert desired_replicas(LoadSignals(0, 1), TARGETS) == (1.0, "cold start")


def context(
    current: int,
    target: int,
    requests: float,
    metrics: dict[str, float],
    config: AutoscalingConfig,
    state: dict[str, Any],
    now: float,
) -> AutoscalingContext:
    replicas = [ReplicaID(f"r{i}", DEP) for i in range(current)]
    return AutoscalingContext(
        deployment_id=DEP,
        deployment_name=DEP.name,
        app_name=DEP.app_name,
        current_num_replicas=current,
        target_num_replicas=target,
        running_replicas=replicas,
        total_num_requests=requests,
        total_queued_requests=0,
        aggregated_metrics={k: dict.fromkeys(replicas, v) for k, v in metrics.items()},
        raw_metrics={},
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=state,
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=now,
        config=config,
    )


def test_policy_inside_serves_wrapper_honours_delays_and_bounds() -> None:
    config = AutoscalingConfig(
        min_replicas=0, max_replicas=3, upscale_delay_s=0, downscale_delay_s=0
    )
    policy = _apply_autoscaling_config(LLMAutoscalingPolicy(4, 0.8, 2))
    # Burst: KV caches full on 1 replica -> capped at max 3.
    n, state = policy(context(1, 1, 4, {"kv_cache_usage": 1.0, "waiting": 10.0}, config, {}, 0))
    assert n == 3
    assert state["fleetserve_reason"] == "waiting"
    # Idle: down to min (0) once the delay (0 here) has passed.
    n, _ = policy(context(1, 1, 0, {"kv_cache_usage": 0.0}, config, {}, 1))
    assert n == 0
    # A request at zero replicas starts one at once (Serve's cold-start path).
    n, _ = policy(context(0, 0, 1, {}, config, {}, 2))
    assert n == 1


def test_downscale_waits_for_its_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(now=1000.0)
    # Serve's delay logic reads the wall clock itself.
    monkeypatch.setattr(autoscaling_policy, "time", SimpleNamespace(time=lambda: clock.now))
    config = AutoscalingConfig(min_replicas=1, max_replicas=3, downscale_delay_s=60)
    policy = _apply_autoscaling_config(LLMAutoscalingPolicy(4, 0.8, 2))
    state: dict[str, Any] = {}
    n, state = policy(context(3, 3, 0, {}, config, state, 1000.0))
    assert n == 3
    clock.now = 1030.0
    n, state = policy(context(3, 3, 0, {}, config, state, 1030.0))
    assert n == 3
    clock.now = 1061.0
    n, state = policy(context(3, 3, 0, {}, config, state, 1061.0))
    assert n == 1
