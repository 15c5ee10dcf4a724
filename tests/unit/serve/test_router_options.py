"""Routing and autoscaling options: one source for the app and the rendered RayService,
import paths that resolve to the classes Serve loads, and spec validation."""

from __future__ import annotations

from typing import Any

import pytest
from ray._common.utils import import_module_and_attr

from fleetserve.errors import SpecError
from fleetserve.plan.deployment import (
    POLICY_CLASS,
    ROUTER_CLASS,
    replica_count_options,
    request_router_options,
)
from fleetserve.serve.control.app import build_app
from fleetserve.serve.control.autoscaling import LLMAutoscalingPolicy
from fleetserve.serve.routing.router import FleetRouter
from fleetserve.spec import parse_spec

SETTINGS = {
    "gpu_memory_utilization": 0.2,
    "max_num_seqs": 8,
    "max_model_len": 512,
    "max_num_batched_tokens": 512,
}
SPEC: dict[str, Any] = {
    "models": [
        {
            "name": "m",
            "source": "x",
            "replicas": {"min": 0, "max": 2, "downscale_delay_s": 5, "cold_start_timeout_s": 42},
            "routing": {"policy": "prefix", "block_chars": 128, "load_factor": 1.5},
        },
        {"name": "fixed", "source": "x", "routing": {"policy": "round_robin"}},
    ]
}


def test_import_paths_resolve_to_the_classes() -> None:
    assert import_module_and_attr(ROUTER_CLASS)[1] is FleetRouter
    assert import_module_and_attr(POLICY_CLASS)[1] is LLMAutoscalingPolicy


def test_app_deployments_carry_router_policy_and_cold_start() -> None:
    app = build_app(
        {"spec": SPEC, "engine": "fake", "engine_settings": {"m": SETTINGS, "fixed": SETTINGS}}
    )
    ingress: Any = app._bound_deployment
    handles = ingress.init_args[2]
    m = handles["m"]._bound_deployment
    cfg = m._deployment_config
    router = cfg.request_router_config
    assert router.request_router_class == ROUTER_CLASS
    assert router.request_router_kwargs == {
        "policy": "prefix",
        "block_chars": 128,
        "load_factor": 1.5,
        "load_weight": 4,
        "adapter_weight": 32,
        "model": "m",  # its requests are the base's; any other model id is an adapter
        "adapter_slots": 1,
    }
    assert router.request_routing_stats_period_s == 2
    auto = cfg.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.initial_replicas) == (0, 2, 1)
    assert auto.downscale_delay_s == 5
    assert auto.policy.policy_function == POLICY_CLASS
    assert auto.policy.policy_kwargs["target_kv_cache_usage"] == 0.85
    assert m.init_args[1] == 128  # the replica hashes prompts like its router
    assert ingress.init_args[3] == {"m": {"deployment": "model-m", "timeout_s": 42}}
    fixed = handles["fixed"]._bound_deployment._deployment_config
    fixed_kwargs = fixed.request_router_config.request_router_kwargs
    assert fixed_kwargs["policy"] == "round_robin"
    assert fixed_kwargs["load_factor"] is None  # no hard cap unless the spec sets one
    assert fixed.autoscaling_config is None


def test_options_are_json_for_serve_config() -> None:
    model = parse_spec(SPEC).models[0]
    options = {**replica_count_options(model, max_replicas=1), **request_router_options(model)}
    assert options["autoscaling_config"]["max_replicas"] == 1
    assert options["request_router_config"]["request_router_kwargs"]["block_chars"] == 128


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        ({"policy": "random"}, "routing.policy"),
        ({"load_factor": 0.5}, "routing.load_factor"),
        ({"block_chars": 4}, "routing.block_chars"),
    ],
)
def test_bad_routing_is_named(routing: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"models\\[0\\].{field}"):
        parse_spec({"models": [{"name": "m", "source": "x", "routing": routing}]})


def test_the_router_pickles_by_value_with_the_timeline_it_reads() -> None:
    # Serve ships the router's module by value (cloudpickle): a global it reads that holds
    # a lock (the process's timeline) would break every deployment ("cannot pickle
    # '_thread.lock'", seen on the first try), so it reads the timeline through its module.
    import cloudpickle  # noqa: PLC0415

    from fleetserve.serve.routing import router  # noqa: PLC0415

    cloudpickle.register_pickle_by_value(router)
    try:
        assert cloudpickle.loads(cloudpickle.dumps(router.FleetRouter)).__name__ == "FleetRouter"
    finally:
        cloudpickle.unregister_pickle_by_value(router)
