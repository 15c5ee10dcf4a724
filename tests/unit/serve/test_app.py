"""The Serve application builder: args shape, deployment names and Ray options."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve.errors import SpecError
from fleetserve.plan.deployment import deployment_name
from fleetserve.serve.control.app import build_app

SPEC = {
    "models": [
        {
            "name": "org/model:v1",
            "source": "x",
            "resources": {"cpu": 0.5},
            "replicas": {"min": 1, "max": 3, "target_ongoing_requests": 4},
        },
        {"name": "fixed", "source": "x", "replicas": {"min": 2, "max": 2}},
    ],
    "server": {"drain_timeout_s": 12},
}
SETTINGS = {
    "gpu_memory_utilization": 0.2,
    "max_num_seqs": 8,
    "max_model_len": 512,
    "max_num_batched_tokens": 512,
}


def model_deployments(app: Any) -> dict[str, Any]:
    ingress = app._bound_deployment
    return {name: h._bound_deployment for name, h in ingress.init_args[2].items()}


def test_deployments_carry_names_replicas_and_resources() -> None:
    settings = {"org/model:v1": SETTINGS, "fixed": SETTINGS}
    app = build_app({"spec": SPEC, "engine": "fake", "engine_settings": settings})
    ingress = app._bound_deployment
    assert ingress.name == "ingress"
    assert ingress.ray_actor_options == {"num_cpus": 0.1}
    models = model_deployments(app)
    auto = models["org/model:v1"]
    assert auto.name == deployment_name("org/model:v1") == "model-org-model-v1"
    assert auto.ray_actor_options == {"num_cpus": 0.5}
    cfg = auto._deployment_config
    assert (cfg.autoscaling_config.min_replicas, cfg.autoscaling_config.max_replicas) == (1, 3)
    assert cfg.autoscaling_config.target_ongoing_requests == 4
    assert cfg.graceful_shutdown_timeout_s == 12
    # Serve's queue bound sits above the gateway's exact admission (capacity + queue).
    assert auto.max_queued_requests == 3 * 64 + 256
    fixed = models["fixed"]
    assert fixed.num_replicas == 2
    assert fixed._deployment_config.autoscaling_config is None
    engine = auto.init_args[0]
    assert engine["settings"]["max_model_len"] == 512
    assert engine["kind"] == "fake"


def test_keys_travel_as_digests_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_TEST_KEY", "sk-secret-value")
    spec = {
        "models": [{"name": "m", "source": "x"}],
        "tenants": [{"name": "t", "api_keys": ["${APP_TEST_KEY}"]}],
    }
    app = build_app({"spec": spec, "engine": "fake"})
    assert "sk-secret-value" not in repr(app._bound_deployment.init_args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"spek": {}}, "spek: unknown key"),
        ({"spec": {"models": []}, "spec_path": "x.yaml"}, "not both"),
        ({"spec": {"models": [{"name": "m"}]}}, r"args\.spec: models\[0\]: set source"),
        (
            {"spec": {"models": [{"name": "m", "config": "qwen2.5-0.5b"}]}},
            r"models\[0\]\.source: required to serve",
        ),
        ({"engine": "tgi"}, "engine"),
        (
            {"spec": SPEC, "engine": "fake", "engine_settings": {"fixed": SETTINGS}},
            "engine_settings has no entry for org/model:v1",
        ),
    ],
)
def test_bad_args_are_spec_errors(args: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build_app(args)
