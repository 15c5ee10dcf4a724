"""Fixtures of ``fleetserve top`` tests: Ray-exposition text shaped like a real scrape.

Series names and labels are what Ray exports for fleetserve's gateway, Serve and vLLM
(``Component``/``WorkerId``... included, as in a real scrape), built from a few numbers so a
test can make a second snapshot with known increments.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

Exposition = Callable[..., str]

RAY = 'Component="core_worker",NodeAddress="10.0.0.1",SessionName="s",Version="2.60.0"'


def _line(name: str, labels: dict[str, str], value: float) -> str:
    tags = ",".join([RAY, *(f'{k}="{v}"' for k, v in sorted(labels.items()))])
    return f"{name}{{{tags}}} {value}"


def exposition(step: int, *, engine: bool = True, kill: bool = False) -> str:
    """A scrape after ``step`` seconds of steady traffic (10 req/s to alpha from team-a)."""
    gw = {"WorkerId": "w-ingress"}
    lines = ["# TYPE ray_fleetserve_gateway_requests_total counter"]
    lines += [
        _line(
            "ray_fleetserve_gateway_requests_total",
            {
                **gw,
                "model": "alpha",
                "tenant": "team-a",
                "endpoint": "/v1/completions",
                "status_code": "200",
            },
            10 * step,
        ),
        _line(
            "ray_fleetserve_gateway_requests_total",
            {
                **gw,
                "model": "alpha",
                "tenant": "team-a",
                "endpoint": "/v1/completions",
                "status_code": "503",
            },
            1 * step,
        ),
        _line(
            "ray_fleetserve_gateway_requests_total",
            {
                **gw,
                "model": "unknown",
                "tenant": "unknown",
                "endpoint": "/v1/completions",
                "status_code": "401",
            },
            2 * step,
        ),
    ]
    lines.append("# TYPE ray_fleetserve_gateway_prompt_tokens_total counter")
    lines.append(
        _line(
            "ray_fleetserve_gateway_prompt_tokens_total",
            {**gw, "model": "alpha", "tenant": "team-a"},
            50 * step,
        )
    )
    lines.append("# TYPE ray_fleetserve_gateway_completion_tokens_total counter")
    lines.append(
        _line(
            "ray_fleetserve_gateway_completion_tokens_total",
            {**gw, "model": "alpha", "tenant": "team-a"},
            100 * step,
        )
    )
    lines.append("# TYPE ray_fleetserve_gateway_rejections_total counter")
    for reason, per_s in (("auth", 2), ("overload", 1)):
        tenant = "unknown" if reason == "auth" else "team-a"
        model = "unknown" if reason == "auth" else "alpha"
        lines.append(
            _line(
                "ray_fleetserve_gateway_rejections_total",
                {**gw, "model": model, "tenant": tenant, "reason": reason},
                per_s * step,
            )
        )
    lines.append("# TYPE ray_fleetserve_gateway_requests_in_flight gauge")
    lines.append(_line("ray_fleetserve_gateway_requests_in_flight", {**gw, "model": "alpha"}, 3))
    lines.append("# TYPE ray_fleetserve_gateway_time_to_first_token_seconds histogram")
    # Every second: 8 first tokens under 50 ms, 2 between 50 ms and 100 ms.
    for le, per_s in (("0.05", 8), ("0.1", 10), ("+Inf", 10)):
        lines.append(
            _line(
                "ray_fleetserve_gateway_time_to_first_token_seconds_bucket",
                {**gw, "model": "alpha", "tenant": "team-a", "le": le},
                per_s * step,
            )
        )
    lines.append("# TYPE ray_serve_deployment_replica_healthy gauge")
    replicas = {"r1": 1.0, "r2": 0.0 if kill else 1.0}
    for replica, healthy in replicas.items():
        lines.append(
            _line(
                "ray_serve_deployment_replica_healthy",
                {
                    "WorkerId": "w-ctl",
                    "application": "fleetserve",
                    "deployment": "model-alpha",
                    "replica": replica,
                },
                healthy,
            )
        )
    lines.append("# TYPE ray_serve_replica_processing_queries gauge")
    for replica in replicas:
        lines.append(
            _line(
                "ray_serve_replica_processing_queries",
                {
                    "WorkerId": f"w-{replica}",
                    "application": "fleetserve",
                    "deployment": "model-alpha",
                    "replica": replica,
                },
                2,
            )
        )
    lines.append("# TYPE ray_serve_deployment_queued_queries gauge")
    lines.append(
        _line(
            "ray_serve_deployment_queued_queries",
            {
                "WorkerId": "w-ingress",
                "application": "fleetserve",
                "deployment": "model-alpha",
                "handle": "h",
                "actor_id": "a",
            },
            4,
        )
    )
    if engine:
        lines.append("# TYPE ray_vllm_kv_cache_usage_perc gauge")
        lines.append("# TYPE ray_vllm_generation_tokens_total counter")
        lines.append("# TYPE ray_vllm_time_to_first_token_seconds histogram")
        for replica, kv in (("r1", 0.25), ("r2", 0.5)):
            eng = {
                "WorkerId": f"w-{replica}",
                "model_name": "alpha",
                "engine": "0",
                "ReplicaId": replica,
            }
            lines.append(_line("ray_vllm_kv_cache_usage_perc", eng, kv))
            lines.append(_line("ray_vllm_generation_tokens_total", eng, 40 * step))
            lines.append(_line("ray_vllm_num_requests_waiting", eng, 1))
            # Every second per replica: 4 first tokens under 100 ms, 1 between 100 and 250 ms.
            for le, per_s in (("0.1", 4), ("0.25", 5), ("+Inf", 5)):
                lines.append(
                    _line(
                        "ray_vllm_time_to_first_token_seconds_bucket",
                        {**eng, "le": le},
                        per_s * step,
                    )
                )
    lines.append("# TYPE ray_unrelated_metric gauge")
    lines.append(_line("ray_unrelated_metric", {}, 1))
    return "\n".join(lines) + "\n"


@pytest.fixture
def ray_exposition() -> Exposition:
    """``exposition(step, engine=True, kill=False) -> text``."""
    return exposition
