"""One writer for a replica's settings: what ``serve`` builds and what ``render`` writes give
vLLM and Ray the same numbers, those the plan resolved (``fleetserve.plan.deployment``).

Both paths are run as users run them: ``render`` on a planned fleet (a HAMi-sliced pool, a
whole-GPU tensor-parallel pool, pipeline stages across nodes), then the app Ray builds from
that RayService's own args; ``fleetserve serve``'s check and app build on a local CPU host
and a local GPU host. Ray's side is compared through Ray Serve's own schema of a deployment
(``deployment_to_schema``, what ``serve build`` prints), vLLM's through the engine's command
line (``EngineConfig.vllm_cli_args``, what the replica parses).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.deployment import deployment_to_schema
from ray.serve.schema import DeploymentSchema

from fleetserve.engine.config import EngineConfig
from fleetserve.host import HostFacts
from fleetserve.k8s.render import render
from fleetserve.k8s.render.groups import plan_worker_groups
from fleetserve.plan import plan_fleet
from fleetserve.plan.deployment import FleetDeployment, deployment_name
from fleetserve.plan.local import local_deployment, plan_local
from fleetserve.plan.result import PlanResult
from fleetserve.serve.control import runner
from fleetserve.serve.control.app import build_app, build_application
from fleetserve.serve.control.runner import FleetServer, ServeOptions
from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.spec import FleetSpec, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"


def _models(app: Any) -> dict[str, Any]:
    """The model deployments of a built fleetserve app (the ingress binds their handles)."""
    ingress = app._bound_deployment
    return {name: h._bound_deployment for name, h in ingress.init_args[2].items()}


#: Options Ray Serve turns into its own config classes (defaults filled in) when it reads them.
_NESTED = {"autoscaling_config": AutoscalingConfig, "request_router_config": RequestRouterConfig}


def _normal(options: dict[str, Any]) -> dict[str, Any]:
    out = dict(options)
    for key, cls in _NESTED.items():
        if isinstance(out.get(key), dict):
            out[key] = cls.model_validate(out[key]).model_dump()
    return out


def _built_view(deployment: Any) -> dict[str, Any]:
    """A built deployment's options, as Ray Serve would write them in a config."""
    return _normal(deployment_to_schema(deployment).model_dump())


def _overrides(options: dict[str, Any]) -> dict[str, Any]:
    """The options a config's ``deployments[]`` entry sets, as Ray Serve reads them (it
    applies them over the app's code)."""
    schema = DeploymentSchema.model_validate(options)
    return _normal({k: v for k, v in schema.model_dump().items() if k in schema.model_fields_set})


def _assert_same(built: Any, options: dict[str, Any]) -> None:
    """Every option ``options`` sets is what ``built`` already runs: overriding the code
    with them changes nothing."""
    view = _built_view(built)
    overrides = _overrides(options)
    assert overrides  # the entry sets options (not a vacuous comparison)
    assert {k: view[k] for k in overrides} == overrides


def _vllm_args(deployment: Any) -> list[str]:
    return EngineConfig.model_validate(deployment.init_args[0]).vllm_cli_args()


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


class Rendered(NamedTuple):
    spec: FleetSpec
    plan_min: PlanResult
    plan_max: PlanResult
    application: dict[str, Any]
    """The RayService's Serve application, as written."""
    built: dict[str, Any]
    """Its model deployments as Ray builds them from the application's own args."""


def _render_and_build(example: str, monkeypatch: pytest.MonkeyPatch) -> Rendered:
    spec = load_spec(EXAMPLES / f"{example}.yaml")
    plan_min, plan_max = plan_fleet(spec, scenario="min"), plan_fleet(spec, scenario="max")
    (rayservice,) = [o for o in render(spec, plan_min, plan_max) if o["kind"] == "RayService"]
    app = rayservice["spec"]["serveConfigV2"]
    if isinstance(app, str):
        import yaml  # noqa: PLC0415

        app = yaml.safe_load(app)
    (application,) = app["applications"]
    # What Ray runs: the app built from the RayService's own args (weights paths given, so
    # nothing is downloaded), its options overridden by deployments[] - which must change
    # nothing.
    args = dict(application["args"])
    for tenant in args["spec"].get("tenants", []):  # the pods' key variables
        for key in tenant.get("api_keys", []):
            monkeypatch.setenv(key["env"], f"sk-{key['env'].lower()}")
    args["model_paths"] = {m.name: f"/models/{i}" for i, m in enumerate(spec.models)}
    return Rendered(spec, plan_min, plan_max, application, _models(build_app(args)))


@pytest.mark.parametrize(
    ("example", "hami"),
    [("hami-multi-model", True), ("whole-gpu-tp", False), ("pipeline-across-nodes", False)],
)
def test_the_app_ray_builds_from_a_rayservice_is_what_the_rayservice_says(
    example: str, hami: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, plan_min, plan_max, application, built = _render_and_build(example, monkeypatch)
    written = {d["name"]: d for d in application["deployments"]}
    groups = {g.model.name: g for g in plan_worker_groups(spec, plan_min, plan_max)}
    sliced = False
    for model in spec.models:
        name = deployment_name(model.name)
        _assert_same(built[model.name], written[name])
        # vLLM: the plan's numbers for the pod - a HAMi slice's engine gets its fraction
        # of the slice (HAMi-core reports the slice as the card), a whole card its own.
        engine = groups[model.name].shape.engine
        vllm = _vllm_args(built[model.name])
        expected = engine.gpu_memory_utilization
        if hami and groups[model.name].shape.sliced:
            assert engine.slice_memory_utilization is not None
            expected = engine.slice_memory_utilization
            sliced = True
        assert float(_flag(vllm, "--gpu-memory-utilization")) == pytest.approx(expected)
        assert int(_flag(vllm, "--max-model-len")) == engine.max_model_len
        assert int(_flag(vllm, "--max-num-seqs")) == engine.max_num_seqs
        assert int(_flag(vllm, "--tensor-parallel-size")) == model.tensor_parallel
        # Ray: the pod's cards, held by the actor or one bundle per rank.
        ray = written[name]
        cards = ray["ray_actor_options"].get("num_gpus", 0) + sum(
            b.get("GPU", 0) for b in ray.get("placement_group_bundles", [])
        )
        assert cards == model.gpus_per_replica
    assert sliced == hami


def _serve_check(spec: FleetSpec, host: HostFacts, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``fleetserve serve``'s check (planning this host) and the app it deploys."""
    monkeypatch.setattr(runner, "probe", lambda: host)
    server = FleetServer(ServeOptions(spec=spec, host="127.0.0.1", port=8000))
    keys, deployment = server.check()
    paths = {m.name: f"/models/{m.name}" for m in spec.models}
    app = build_application(spec, deployment=deployment, model_paths=paths, keys=keys)
    return deployment, _models(app)


SPEC = parse_spec(
    {
        "models": [
            {"name": "small", "source": "x", "config": "qwen2.5-0.5b", "max_model_len": 2048},
            {
                "name": "other",
                "source": "y",
                "config": "qwen2.5-0.5b",
                "max_model_len": 1024,
                "replicas": {"min": 1, "max": 3},
                "resources": {"cpu": 0.5},
            },
        ]
    }
)


@pytest.mark.parametrize(
    "host",
    [
        HostFacts(cpus=8, memory_mb=64 * 1024),
        HostFacts(cpus=8, memory_mb=64 * 1024, gpu_memory_mb=[143155]),
    ],
    ids=["cpu-host", "gpu-host"],
)
def test_serve_on_this_host_runs_the_local_plan(
    host: HostFacts, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment, built = _serve_check(SPEC, host, monkeypatch)
    plan = plan_local(SPEC, host)
    assert deployment == local_deployment(SPEC, host)
    for model in SPEC.models:
        (placement,) = [r for r in plan.replicas if r.model == model.name and r.index == 0]
        resolved = deployment.models[model.name]
        _assert_same(built[model.name], resolved.options())
        vllm = _vllm_args(built[model.name])
        assert float(_flag(vllm, "--gpu-memory-utilization")) == pytest.approx(
            placement.engine.gpu_memory_utilization
        )
        assert int(_flag(vllm, "--max-model-len")) == placement.engine.max_model_len
        # Ray reserves the share of a card the plan packed (slice and margin), none on CPUs.
        actor = built[model.name].ray_actor_options
        assert actor.get("num_gpus", 0) == placement.num_gpus
        assert actor["num_cpus"] == model.resources.cpu
    if host.gpu_memory_mb:
        # The replicas share the card: Ray may co-locate them exactly as the plan did.
        shares = [r.num_gpus for r in plan.replicas]
        assert all(0 < s < 1 for s in shares)
        assert sum(shares) <= 1


def test_a_rayservice_app_and_a_local_app_read_the_same_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The RayService path takes the resolved object from its args; handing build_app the
    # object serve resolved on this host builds exactly serve's application.
    host = HostFacts(cpus=8, memory_mb=64 * 1024)
    deployment, served = _serve_check(SPEC, host, monkeypatch)
    args = {
        "spec": SPEC.model_dump(mode="json", exclude_defaults=True),
        "deployments": {n: d.model_dump(mode="json") for n, d in deployment.models.items()},
        "model_paths": {m.name: f"/models/{m.name}" for m in SPEC.models},
    }
    built = _models(build_app(args))
    assert FleetDeployment.model_validate({"models": args["deployments"]}) == deployment
    for model in SPEC.models:
        assert _built_view(built[model.name]) == _built_view(served[model.name])
        assert _vllm_args(built[model.name]) == _vllm_args(served[model.name])
    assert ApiKeyTable.from_spec(SPEC).enabled is False


def _frontends(built: dict[str, Any]) -> dict[str, str]:
    return {n: EngineConfig.model_validate(d.init_args[0]).frontend for n, d in built.items()}


def test_auto_frontend_puts_vllm_serve_beside_a_replica_with_a_card_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``frontend: auto`` (the default) is ``process`` where it was measured to help - one
    GPU the replica has to itself, no LoRA adapters - and ``replica`` everywhere else; the
    engine the replica builds is the one the plan resolved, on both paths."""
    # RayService: a pod of one whole card per replica, beside a model over four cards
    assert _frontends(_render_and_build("whole-gpu-tp", monkeypatch).built) == {
        "mistral-7b": "process",
        "llama-3-70b": "replica",
    }
    # HAMi slices share their card with other models' replicas
    assert set(_frontends(_render_and_build("hami-multi-model", monkeypatch).built).values()) == {
        "replica"
    }
    # serve on a GPU host: one model with the card to itself...
    gpu = HostFacts(cpus=16, memory_mb=128 * 1024, gpu_memory_mb=[81_559])
    alone = parse_spec(
        {"models": [{"name": "m", "source": "x", "config": "gemma-3-12b", "max_model_len": 4096}]}
    )
    deployment, built = _serve_check(alone, gpu, monkeypatch)
    assert deployment.models["m"].frontend == "process"
    assert _frontends(built) == {"m": "process"}
    # ...unless the spec says otherwise, it autoscales into what its card has left, or it
    # serves LoRA adapters
    for fields in (
        {"frontend": "replica"},
        {"replicas": {"min": 1, "max": 2}},
        {"adapter_dir": "/adapters"},  # adapters found on first use: the replica resolves them
        {"adapters": [{"name": "a", "source": "/adapters/a"}]},
    ):
        model = {**alone.models[0].model_dump(exclude_defaults=True), **fields}
        _, built = _serve_check(parse_spec({"models": [model]}), gpu, monkeypatch)
        assert _frontends(built) == {"m": "replica"}, fields
    # two models sharing the card, and a CPU host
    _, built = _serve_check(SPEC, gpu, monkeypatch)
    assert set(_frontends(built).values()) == {"replica"}
    _, built = _serve_check(alone, HostFacts(cpus=8, memory_mb=64 * 1024), monkeypatch)
    assert _frontends(built) == {"m": "replica"}
