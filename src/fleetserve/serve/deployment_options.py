"""The Ray Serve options of a model deployment that come from its spec: replicas,
autoscaling (fleetserve's LLM policy) and the request router; and the Serve names
(application, ingress, model deployments) that clients, probes and ``top`` look up.

One source for both places that configure a deployment - the app's code
(``serve.app``) and the RayService's ``serveConfigV2`` (``k8s.render.serveconfig``) - so a
cluster routes and scales exactly as ``fleetserve serve`` does. No Ray import here:
rendering must not need Ray.
"""

from __future__ import annotations

import re
from typing import Any

from fleetserve.spec import ModelSpec

#: The Serve application's name (``fleetserve serve`` and the RayService's serveConfigV2).
APP_NAME = "fleetserve"
#: The ingress deployment's name.
INGRESS_DEPLOYMENT = "ingress"

#: Import path of fleetserve's request router (``serve.routing.router.FleetRouter``).
ROUTER_CLASS = "fleetserve.serve.routing.router:FleetRouter"
#: Import path of fleetserve's autoscaling policy (``serve.autoscaling``).
POLICY_CLASS = "fleetserve.serve.autoscaling:LLMAutoscalingPolicy"


def deployment_name(model: str) -> str:
    """The Serve deployment name of ``model``'s replicas."""
    return "model-" + re.sub(r"[^A-Za-z0-9_.-]", "-", model)


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def replica_count_options(model: ModelSpec, max_replicas: int | None = None) -> dict[str, Any]:
    """``num_replicas`` when the count is fixed, else ``autoscaling_config`` (never both).

    ``max_replicas`` caps ``replicas.max`` (a cluster with fewer worker pods).
    """
    r = model.replicas
    high = r.max if max_replicas is None else min(r.max, max_replicas)
    if r.min == high:
        return {"num_replicas": high}
    return {
        "autoscaling_config": {
            "min_replicas": r.min,
            "max_replicas": high,
            "initial_replicas": max(r.min, 1),
            "target_ongoing_requests": _number(r.target_ongoing_requests),
            "upscale_delay_s": _number(r.upscale_delay_s),
            "downscale_delay_s": _number(r.downscale_delay_s),
            "look_back_period_s": _number(r.look_back_period_s),
            "policy": {
                "policy_function": POLICY_CLASS,
                "policy_kwargs": {
                    "target_ongoing_requests": _number(r.target_ongoing_requests),
                    "target_kv_cache_usage": _number(r.target_kv_cache_usage),
                    "target_waiting_requests": _number(r.target_waiting_requests),
                },
            },
        }
    }


def request_router_options(model: ModelSpec) -> dict[str, Any]:
    """``request_router_config``: fleetserve's router with the model's routing knobs."""
    routing = model.routing
    return {
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_router_kwargs": {
                "policy": routing.policy,
                "block_chars": routing.block_chars,
                "load_factor": None
                if routing.load_factor is None
                else _number(routing.load_factor),
                "load_weight": _number(routing.load_weight),
                "adapter_weight": _number(routing.adapter_weight),
                # Which request ``model`` is the base (others are adapters) and how many
                # adapters a replica keeps loaded (vLLM's CPU LoRA cache, LRU).
                "model": model.name,
                "adapter_slots": model.max_cpu_loras or model.max_loras,
            },
            "request_routing_stats_period_s": _number(routing.stats_period_s),
        }
    }
