"""Build the fleetserve Ray Serve application from a fleet spec.

Two entry points build the same application:

* :func:`build_application` - the Python API ``fleetserve serve`` uses (it has already
  resolved models, settings and keys, and checked the fit);
* :func:`build_app` - the Serve *application builder* for Ray's own tooling, named in a
  Serve config as ``import_path: fleetserve.serve.control.app:build_app`` with ``args`` of the
  shape :class:`BuildArgs` (what a RayService's ``serveConfigV2`` carries)::

      applications:
        - name: fleetserve
          route_prefix: /
          import_path: fleetserve.serve.control.app:build_app
          args:
            spec: {models: [{name: gemma-3-270m, source: "builtin:gemma-3-270m"}]}
            # or: spec_path: /etc/fleetserve/fleet.yaml  (neither: the default fleet)
            deployments:                # optional, by model name: the plan's resolved
              gemma-3-270m: {engine: {...}, ray: {...}, serve: {...}}  # ModelDeployment
            # or engine_settings: {gemma-3-270m: {gpu_memory_utilization: 0.1, ...}}
            # (vLLM's numbers only; Ray's and Serve's then follow from the spec)
            model_paths: {gemma-3-270m: /models/gemma}   # optional, else resolved here
            engine: vllm                                # or fake (no model, for smoke tests)

Deployments: ``ingress`` (the HTTP front) and one ``model-<name>`` per model (characters
outside ``[A-Za-z0-9_.-]`` in the name become ``-``). Every option of every deployment -
vLLM's settings, Ray's reservation, Serve's replica and queue options - is read from the
plan's :class:`~fleetserve.plan.deployment.FleetDeployment`; nothing here decides one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from ray.serve.deployment import Application

from fleetserve.engine.config import EngineConfig, EngineKind
from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import SpecError
from fleetserve.host import probe
from fleetserve.plan.deployment import (
    FleetDeployment,
    ModelDeployment,
    deployment_name,
    node_deployment,
)
from fleetserve.plan.local import joined_deployment, local_deployment, plan_unsized
from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.serve.guard.quota_guard import GuardConfig
from fleetserve.serve.guard.quota_store import KEEPER_DEPLOYMENT, QuotaKeeper, limits_to_args
from fleetserve.serve.ingress.ingress import Ingress
from fleetserve.serve.ingress.limits import RequestLimits
from fleetserve.serve.replica.model_server import ModelServer
from fleetserve.spec import FleetSpec, default_fleet, format_validation_error, load_spec, parse_spec


class BuildArgs(BaseModel):
    """``args`` of :func:`build_app` (a Serve config's application args)."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] | None = Field(default=None, description="The fleet spec mapping.")
    spec_path: str | None = Field(default=None, min_length=1, description="A fleet spec file.")
    engine: EngineKind = Field(default="vllm", description="vllm, or fake (no model).")
    deployments: dict[str, ModelDeployment] | None = Field(
        default=None, description="Per-model deployments resolved by the plan (render's)."
    )
    engine_settings: dict[str, EngineSettings] | None = Field(
        default=None,
        description="Per-model vLLM settings alone (a hand-written config); Ray's and "
        "Serve's options then follow from the spec.",
    )
    model_paths: dict[str, str] | None = Field(
        default=None, description="Per-model weights location (default: resolve source)."
    )
    fake_token_delay_s: float = Field(
        default=0.0, ge=0, le=10, description="Fake engine: seconds per generated token."
    )

    @model_validator(mode="after")
    def _one_spec(self) -> BuildArgs:
        if self.spec is not None and self.spec_path is not None:
            raise ValueError("give 'spec' or 'spec_path', not both")
        if self.deployments is not None and self.engine_settings is not None:
            raise ValueError("give 'deployments' or 'engine_settings', not both")
        return self

    def load_spec(self) -> FleetSpec:
        if self.spec is not None:
            return parse_spec(self.spec, "args.spec")
        if self.spec_path is not None:
            return load_spec(self.spec_path)
        return default_fleet()


def resolve_model_paths(spec: FleetSpec, engine: EngineKind) -> dict[str, str]:
    """Local weights for every model (prepares built-in models on first use)."""
    sources = spec.require_weights("serve")
    if engine == "fake":
        return sources
    from fleetserve.modelstore.store import ModelStore  # noqa: PLC0415 - heavy, vllm only

    store = ModelStore()
    return {m.name: store.resolve(sources[m.name], weights=m.loads_weights) for m in spec.models}


def build_application(
    spec: FleetSpec,
    *,
    deployment: FleetDeployment,
    model_paths: dict[str, str],
    keys: ApiKeyTable,
    engine: EngineKind = "vllm",
    fake_token_delay_s: float = 0.0,
) -> Application:
    """The Serve application: ingress + one deployment per model, as ``deployment`` says."""
    handles: dict[str, Any] = {}
    routes: list[dict[str, Any]] = []
    cold_starts: dict[str, dict[str, Any]] = {}
    for model in spec.models:
        r = model.replicas
        planned = deployment.models[model.name]
        config = EngineConfig.from_spec(
            model,
            model_path=model_paths[model.name],
            settings=planned.engine,
            engine_args=planned.engine_args,
            tensor_parallel=planned.tensor_parallel,
            pipeline_parallel=planned.pipeline_parallel,
            kind=engine,
            fake_token_delay_s=fake_token_delay_s,
            frontend=planned.frontend,
        )
        handles[model.name] = (
            _deployment(ModelServer)
            .options(**planned.options())
            .bind(config.model_dump(mode="json"), model.routing.block_chars)
        )
        routes.append(
            {
                "name": model.name,
                "max_model_len": planned.engine.max_model_len,
                "min_replicas": r.min,
                "adapters": tuple(a.name for a in model.adapters),
                "adapter_dir": model.adapter_dir,
            }
        )
        if r.min == 0:
            cold_starts[model.name] = {
                "deployment": deployment_name(model.name),
                "timeout_s": r.cold_start_timeout_s,
            }
    guard = GuardConfig.from_spec(
        spec, {name: s.max_model_len for name, s in deployment.engine_settings().items()}
    )
    # The quota counters: one keeper shared by every ingress replica (serve/guard/quota_store.py).
    quota = (
        _deployment(QuotaKeeper)
        .options(name=KEEPER_DEPLOYMENT)
        .bind(limits_to_args(guard.scope_limits()), guard.lease_s)
        if guard.quotas
        else None
    )
    app: Application = (
        _deployment(Ingress)
        .options(**deployment.ingress_options(spec))
        .bind(
            routes,
            keys.to_args(),
            handles,
            cold_starts,
            guard.to_args(),
            quota,
            limits=RequestLimits.from_spec(spec.server).to_args(),
            stream_relay=spec.server.stream_relay,
            stream_handoff=spec.server.stream_handoff,
        )
    )
    return app


def _deployment(cls: object) -> Any:
    """A ``@serve.deployment`` class as Ray sees it (its stubs type it as the class)."""
    return cls


def _gpu_cluster() -> bool:
    import ray  # noqa: PLC0415

    if not ray.is_initialized():
        return False
    total: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return total.get("GPU", 0) > 0


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder (``import_path: fleetserve.serve.control.app:build_app``).

    ``args`` has the shape of :class:`BuildArgs` (see the module docstring). API keys are
    read from the environment of the process that builds the app.
    """
    try:
        parsed = BuildArgs.model_validate(args or {})
    except ValidationError as e:
        raise SpecError(format_validation_error(e, "build_app args")) from e
    spec = parsed.load_spec()
    spec.require_weights("serve")  # a plan-only spec (no source) cannot start replicas
    given = parsed.deployments or parsed.engine_settings
    if given is not None:
        missing = [m.name for m in spec.models if m.name not in given]
        if missing:
            field = "deployments" if parsed.deployments else "engine_settings"
            raise SpecError(f"build_app args: {field} has no entry for {', '.join(missing)}")
    if parsed.deployments is not None:
        deployment = FleetDeployment(models=parsed.deployments)
    elif parsed.engine_settings is not None:
        deployment = node_deployment(
            spec, plan_unsized(spec, gpu=_gpu_cluster(), settings=parsed.engine_settings)
        )
    elif parsed.engine == "vllm":
        # Plan for the machine this builder runs on.
        deployment = local_deployment(spec, probe())
    else:
        # The fake engine: nothing to size.
        deployment = joined_deployment(spec, gpu=_gpu_cluster())
    paths = parsed.model_paths or resolve_model_paths(spec, parsed.engine)
    return build_application(
        spec,
        deployment=deployment,
        model_paths=paths,
        keys=ApiKeyTable.from_spec(spec),
        engine=parsed.engine,
        fake_token_delay_s=parsed.fake_token_delay_s,
    )


__all__ = ["BuildArgs", "build_app", "build_application"]
