"""vLLM engines inside Ray Serve configs: what each Serve replica runs and what it is given.

Design note: a RayService's ``serveConfigV2`` says what Ray gives a replica (``num_gpus``,
placement-group bundles, autoscaling) and, depending on the app, what vLLM runs with. Three
conventions carry vLLM's arguments, and all are read here so every rule sees the same engine:

* Ray Serve LLM (``ray.serve.llm``): ``args.llm_configs[]`` with ``engine_kwargs``,
  ``model_loading_config`` and ``deployment_config``; its placement group has one
  ``{GPU: 1}`` bundle per TP x PP rank unless ``placement_group_config`` overrides it;
* environment variables in ``runtime_env.env_vars`` that the app's code turns into engine
  arguments (KubeRay's vLLM sample and the AI-on-EKS blueprint: ``MODEL_ID``,
  ``TENSOR_PARALLEL_SIZE``, ``GPU_MEMORY_UTILIZATION``, ``MAX_NUM_SEQ``...);
* engine arguments passed as the app's ``args`` (top level, ``engine_args`` or
  ``engine_kwargs``; fleetserve's own app passes ``models[].engine_args``).

What must stay true: a value is only reported when it is written in the config (rules never
assume a default the app's code may override), and every value keeps its field path so a
finding points at the line that sets it.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import FleetServeError
from fleetserve.k8s.doctor.finding import Located
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import GroupView, serve_apps, serve_config
from fleetserve.plan.catalogue import catalogue_entry
from fleetserve.plan.deployment import is_fleetserve_app
from fleetserve.spec import parse_spec

#: Normalised engine argument -> accepted spellings in env vars (upper case) besides its own.
_ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "model": ("MODEL_ID", "MODEL", "MODEL_NAME", "HF_MODEL_ID"),
    "tensor_parallel_size": ("TENSOR_PARALLEL_SIZE", "TP_SIZE", "TENSOR_PARALLELISM"),
    "pipeline_parallel_size": ("PIPELINE_PARALLEL_SIZE", "PP_SIZE"),
    "gpu_memory_utilization": ("GPU_MEMORY_UTILIZATION",),
    "max_model_len": ("MAX_MODEL_LEN",),
    "max_num_seqs": ("MAX_NUM_SEQS", "MAX_NUM_SEQ"),
    "max_num_batched_tokens": ("MAX_NUM_BATCHED_TOKENS",),
    "enable_chunked_prefill": ("ENABLE_CHUNKED_PREFILL",),
    "dtype": ("DTYPE",),
    "quantization": ("QUANTIZATION",),
    "kv_cache_dtype": ("KV_CACHE_DTYPE",),
    "distributed_executor_backend": ("DISTRIBUTED_EXECUTOR_BACKEND",),
    "enforce_eager": ("ENFORCE_EAGER",),
}
#: Engine arguments read from dicts (``engine_kwargs``, ``args``), with accepted spellings.
_ARG_ALIASES: dict[str, tuple[str, ...]] = {
    "model": ("model", "model_id"),
    "tensor_parallel_size": ("tensor_parallel_size", "tensor_parallel"),
    "pipeline_parallel_size": ("pipeline_parallel_size", "pipeline_parallel"),
    "gpu_memory_utilization": ("gpu_memory_utilization",),
    "max_model_len": ("max_model_len",),
    "max_num_seqs": ("max_num_seqs",),
    "max_num_batched_tokens": ("max_num_batched_tokens",),
    "enable_chunked_prefill": ("enable_chunked_prefill",),
    "dtype": ("dtype",),
    "quantization": ("quantization",),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "distributed_executor_backend": ("distributed_executor_backend",),
    "enable_lora": ("enable_lora",),
    "max_loras": ("max_loras",),
    "max_cpu_loras": ("max_cpu_loras",),
    "max_lora_rank": ("max_lora_rank",),
    "trust_remote_code": ("trust_remote_code",),
    "enable_prompt_embeds": ("enable_prompt_embeds",),
    "enforce_eager": ("enforce_eager",),
    "revision": ("revision",),
}
_INT_ARGS = {
    "port",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_loras",
    "max_cpu_loras",
    "max_lora_rank",
}
_FLOAT_ARGS = {"gpu_memory_utilization"}
#: vLLM's own bounds, (low, low inclusive, high): outside them the engine refuses to start
#: (vllm 0.32 config: ParallelConfig tensor/pipeline_parallel_size ``ge=1``, CacheConfig
#: gpu_memory_utilization ``gt=0, le=1``; older releases raise the same from ``_verify_args``).
#: A value outside is no engine fact: replicas keep it apart (``rejected``) so no rule
#: computes ranks or budgets from it, and ``engine-arg-invalid`` reports it.
_BOUNDS: dict[str, tuple[float, bool, float | None]] = {
    "tensor_parallel_size": (1, True, None),
    "pipeline_parallel_size": (1, True, None),
    "gpu_memory_utilization": (0, False, 1),
}
_BOOL_ARGS = {
    "enable_chunked_prefill",
    "enable_lora",
    "trust_remote_code",
    "enable_prompt_embeds",
    "enforce_eager",
}
#: vLLM boolean flags (BooleanOptionalAction / store_true): no value unless "=x" is given.
_BOOL_FLAGS = {
    "--enable-chunked-prefill": ("enable_chunked_prefill", True),
    "--no-enable-chunked-prefill": ("enable_chunked_prefill", False),
    "--enable-lora": ("enable_lora", True),
    "--no-enable-lora": ("enable_lora", False),
    "--trust-remote-code": ("trust_remote_code", True),
    "--no-trust-remote-code": ("trust_remote_code", False),
    "--enable-prompt-embeds": ("enable_prompt_embeds", True),
    "--no-enable-prompt-embeds": ("enable_prompt_embeds", False),
    "--enforce-eager": ("enforce_eager", True),
    "--no-enforce-eager": ("enforce_eager", False),
}


@dataclass(frozen=True, eq=False)
class EngineReplica:
    """One kind of Serve replica of a RayService, with what vLLM runs in it (when known)."""

    manifest: Manifest
    #: ``app/deployment`` (or ``app/<model>`` for a Ray Serve LLM config).
    name: str
    #: Field path of the deployment (or llm_config) inside serveConfigV2.
    path: str
    #: The deployment options as written (``deployments[]`` item or Serve LLM
    #: ``deployment_config``), ``{}`` when the config sets none.
    options: dict[str, Any]
    #: Field path of ``options``.
    options_path: str
    #: Normalised vLLM engine arguments written in the config (see module doc).
    engine: dict[str, Any] = field(default_factory=dict)
    #: Field path each engine argument was read from.
    engine_paths: dict[str, str] = field(default_factory=dict)
    #: ``runtime_env.env_vars`` of the app, overridden by the deployment's own.
    env: dict[str, str] = field(default_factory=dict)
    #: Field path of each env var.
    env_paths: dict[str, str] = field(default_factory=dict)
    #: ``ray_actor_options.num_gpus`` when written.
    num_gpus: float | None = None
    #: Placement-group bundles when written (or derived for Ray Serve LLM).
    bundles: list[dict[str, float]] | None = None
    #: Field path of the GPUs given (num_gpus or the bundles).
    gpus_path: str = ""
    #: True for Ray Serve LLM configs (Ray's distributed executor; bundles derived from TP).
    serve_llm: bool = False
    #: True when the bundles were derived (Serve LLM default), not written.
    bundles_derived: bool = False
    #: Custom Ray resources the replica asks for (they pin it to the groups advertising them).
    pins: tuple[str, ...] = ()
    #: The model's tenant, when the config says (fleetserve's own app carries its fleet spec).
    tenant: str | None = None
    #: fleetserve's plan: the engine's memory fraction OF THE HAMi SLICE, when planned.
    planned_slice_utilization: float | None = None
    #: The GPU type the replica asks Ray for (Serve LLM ``accelerator_type: L4``): Ray places
    #: it only on nodes with that card, so it is the card's evidence.
    accelerator_type: str | None = None
    #: Engine arguments written outside vLLM's bounds (``tensor_parallel_size: 0``); moved
    #: out of ``engine`` on construction, so no rule reasons from them.
    rejected: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every construction site goes through here: one place keeps bad values out.
        valid, bad = split_rejected(self.engine)
        if bad:
            object.__setattr__(self, "engine", valid)
            object.__setattr__(self, "rejected", {**self.rejected, **bad})

    @property
    def is_vllm(self) -> bool:
        """True when the config shows this replica runs vLLM (engine args or Serve LLM)."""
        return self.serve_llm or bool(self.engine)

    @property
    def parallel(self) -> int | None:
        """TP x PP when either is written, else None."""
        tp = self.engine.get("tensor_parallel_size")
        pp = self.engine.get("pipeline_parallel_size")
        if tp is None and pp is None:
            return None
        return int(tp if tp is not None else 1) * int(pp if pp is not None else 1)

    @property
    def gpu_units(self) -> tuple[int, float] | None:
        """(GPU-holding units, GPU fraction per unit) given to one replica, or None if unknown.

        A unit is a bundle with GPUs, or the actor itself for ``num_gpus``; a fractional
        ``num_gpus`` is one unit holding that fraction of a card.
        """
        if self.bundles is not None:
            gpu = [b.get("GPU", 0.0) for b in self.bundles if b.get("GPU", 0.0) > 0]
            if not gpu:
                return None
            return len(gpu), max(gpu)
        if self.num_gpus is None or self.num_gpus <= 0:
            return None
        if self.num_gpus < 1:
            return 1, self.num_gpus
        return round(self.num_gpus), 1.0

    @property
    def gpu_fraction(self) -> float | None:
        """The fraction of one card each engine rank holds when below 1 (shared card)."""
        units = self.gpu_units
        if units is None or units[1] >= 1:
            return None
        return units[1]

    def engine_path(self, key: str) -> str:
        """Field path that sets engine argument ``key`` (the replica's path if unknown)."""
        return self.engine_paths.get(key, self.path)


def out_of_bounds(key: str, value: Any) -> str | None:
    """The bound ``value`` of engine argument ``key`` breaks (``">= 1"``, ``"in (0, 1]"``),
    or None when it is within vLLM's bounds (or not a bounded number)."""
    bounds = _BOUNDS.get(key)
    if bounds is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    low, inclusive, high = bounds
    if (value < low if inclusive else value <= low) or (high is not None and value > high):
        if high is None:
            return f">= {low:g}"
        return f"in {'[' if inclusive else '('}{low:g}, {high:g}]"
    return None


def split_rejected(engine: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arguments within vLLM's bounds, arguments outside them) of ``engine``."""
    bad = {k: v for k, v in engine.items() if out_of_bounds(k, v) is not None}
    return {k: v for k, v in engine.items() if k not in bad}, bad


def can_host(group: GroupView, r: EngineReplica) -> bool:
    """Whether pods of ``group`` can run replica ``r``: a worker group with at least one
    rank's GPU share per pod, advertising every custom resource the replica is pinned by."""
    if group.is_head:
        return False
    units = r.gpu_units
    if units is not None and group.gpus_per_pod < units[1]:
        return False
    if units is not None and group.gpus_per_pod <= 0:
        return False
    return all(pin in group.advertised for pin in r.pins)


def _coerce(key: str, value: Any) -> Any:
    """Engine argument ``value`` in its type (env vars are strings); None if unusable."""
    if value is None:
        return None
    try:
        if key in _INT_ARGS:
            if isinstance(value, bool):
                return None
            return int(float(value))
        if key in _FLOAT_ARGS:
            if isinstance(value, bool):
                return None
            return float(value)
        if key in _BOOL_ARGS:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            return None
    except (TypeError, ValueError):
        return None
    return str(value)


def _read_args(src: Any, base: str, engine: dict[str, Any], paths: dict[str, str]) -> None:
    if not isinstance(src, dict):
        return
    for key, spellings in _ARG_ALIASES.items():
        for spelling in spellings:
            if spelling in src:
                value = _coerce(key, src[spelling])
                if value is not None:
                    engine[key] = value
                    paths[key] = f"{base}.{spelling}"
                break


def _read_env(
    env: dict[str, str], env_paths: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    engine: dict[str, Any] = {}
    paths: dict[str, str] = {}
    upper = {k.upper(): k for k in env}
    for key, names in _ENV_ALIASES.items():
        for name in names:
            if name in upper:
                value = _coerce(key, env[upper[name]])
                if value is not None:
                    engine[key] = value
                    paths[key] = env_paths[upper[name]]
                break
    return engine, paths


def _env_of(runtime_env: Any, base: str) -> tuple[dict[str, str], dict[str, str]]:
    if not isinstance(runtime_env, dict):
        return {}, {}
    env = runtime_env.get("env_vars")
    if not isinstance(env, dict):
        return {}, {}
    values = {str(k): str(v) for k, v in env.items() if v is not None}
    return values, {k: f"{base}.env_vars.{k}" for k in values}


def _float(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float | str):
        return None
    try:
        return float(x)
    except ValueError:
        return None


def _bundles(raw: Any) -> list[dict[str, float]] | None:
    if not isinstance(raw, list):
        return None
    out: list[dict[str, float]] = []
    for b in raw:
        if not isinstance(b, dict):
            return None
        bundle: dict[str, float] = {}
        for k, v in b.items():
            f = _float(v)
            if f is not None:
                bundle[str(k)] = f
        out.append(bundle)
    return out


def _gpus_of(
    options: dict[str, Any], base: str
) -> tuple[float | None, list[dict[str, float]] | None, str]:
    bundles = _bundles(options.get("placement_group_bundles"))
    if bundles is not None:
        return None, bundles, f"{base}.placement_group_bundles"
    actor = options.get("ray_actor_options")
    if isinstance(actor, dict) and "num_gpus" in actor:
        return _float(actor.get("num_gpus")), None, f"{base}.ray_actor_options.num_gpus"
    return None, None, ""


def _serve_llm_replicas(
    m: Manifest, app: dict[str, Any], app_path: str, app_name: str
) -> list[EngineReplica]:
    args = app.get("args")
    configs = args.get("llm_configs") if isinstance(args, dict) else None
    if not isinstance(configs, list):
        return []
    app_env, app_env_paths = _env_of(app.get("runtime_env"), f"{app_path}.runtime_env")
    out: list[EngineReplica] = []
    for k, cfg in enumerate(configs):
        if not isinstance(cfg, dict):
            continue  # a path to a config file: not readable statically
        path = f"{app_path}.args.llm_configs[{k}]"
        engine: dict[str, Any] = {}
        paths: dict[str, str] = {}
        loading = cfg.get("model_loading_config")
        if isinstance(loading, dict):
            for spelling in ("model_source", "model_id"):
                if isinstance(loading.get(spelling), str):
                    engine["model"] = loading[spelling]
                    paths["model"] = f"{path}.model_loading_config.{spelling}"
                    break
        env, env_paths = dict(app_env), dict(app_env_paths)
        cfg_env, cfg_env_paths = _env_of(cfg.get("runtime_env"), f"{path}.runtime_env")
        env.update(cfg_env)
        env_paths.update(cfg_env_paths)
        _read_args(cfg.get("engine_kwargs"), f"{path}.engine_kwargs", engine, paths)
        options = cfg.get("deployment_config")
        options = options if isinstance(options, dict) else {}
        pg = cfg.get("placement_group_config")
        bundles = _bundles(pg.get("bundles")) if isinstance(pg, dict) else None
        derived = bundles is None
        if bundles is None:
            valid = split_rejected(engine)[0]  # a bad TP is reported, not turned into bundles
            ranks = int(valid.get("tensor_parallel_size", 1)) * int(
                valid.get("pipeline_parallel_size", 1)
            )
            bundles = [{"GPU": 1.0} for _ in range(ranks)]
        model_id = engine.get("model", f"llm_configs[{k}]")
        out.append(
            EngineReplica(
                manifest=m,
                name=f"{app_name}/{model_id}",
                path=path,
                options=options,
                options_path=f"{path}.deployment_config",
                engine=engine,
                engine_paths=paths,
                env=env,
                env_paths=env_paths,
                bundles=bundles,
                gpus_path=f"{path}.placement_group_config.bundles" if not derived else path,
                serve_llm=True,
                bundles_derived=derived,
                accelerator_type=(
                    str(cfg["accelerator_type"]) if cfg.get("accelerator_type") else None
                ),
            )
        )
    return out


def _pins(options: dict[str, Any]) -> tuple[str, ...]:
    found: set[str] = set()
    actor = options.get("ray_actor_options")
    if isinstance(actor, dict) and isinstance(actor.get("resources"), dict):
        found.update(str(k) for k in actor["resources"])
    for bundle in _bundles(options.get("placement_group_bundles")) or []:
        found.update(k for k in bundle if k not in ("CPU", "GPU", "memory"))
    return tuple(sorted(found))


def _fleetserve_replicas(
    m: Manifest, app: dict[str, Any], app_path: str, app_name: str
) -> list[EngineReplica] | None:
    """fleetserve's own app (``plan.deployment.APP_IMPORT_PATH``): one replica kind per model.

    The engine arguments are computed by fleetserve's engine code itself
    (:meth:`EngineConfig.vllm_cli_args`), so doctor checks exactly what the replicas will run.
    None when the app is not fleetserve's or its args are not a valid fleet spec.
    """
    if not is_fleetserve_app(str(app.get("import_path", ""))):
        return None
    args = app.get("args")
    if not isinstance(args, dict) or not isinstance(args.get("spec"), dict):
        return None
    # The plan's resolved deployments (fleetserve render), or engine settings alone (a
    # hand-written config, or one rendered before the deployments were carried).
    deployments_raw = args.get("deployments")
    if isinstance(deployments_raw, dict):
        settings_raw: Any = {
            name: d.get("engine") for name, d in deployments_raw.items() if isinstance(d, dict)
        }
        settings_field = "deployments.{}.engine"
    else:
        settings_raw = args.get("engine_settings")
        settings_field = "engine_settings.{}"
    try:
        spec = parse_spec(args["spec"], "serveConfigV2 args.spec")
    except FleetServeError:
        return None
    deps_raw = app.get("deployments")
    deps = {
        str(d.get("name")): (j, d)
        for j, d in enumerate(deps_raw if isinstance(deps_raw, list) else [])
        if isinstance(d, dict)
    }
    out: list[EngineReplica] = []
    for i, model in enumerate(spec.models):
        mpath = f"{app_path}.args.spec.models[{i}]"
        raw = settings_raw.get(model.name) if isinstance(settings_raw, dict) else None
        engine: dict[str, Any] = {}
        paths: dict[str, str] = {}
        settings: EngineSettings | None = None
        if isinstance(raw, dict):
            try:
                settings = EngineSettings.model_validate(raw)
            except ValidationError:
                settings = None
            if settings is not None:
                try:
                    config = EngineConfig.from_spec(
                        model, model_path=model.source or model.config_ref, settings=settings
                    )
                    engine, _ = parse_vllm_cli(config.vllm_cli_args(), "")
                except (ValidationError, FleetServeError, TypeError, ValueError):
                    engine = {}  # the engine refuses these settings itself: nothing to check
                spath = f"{app_path}.args.{settings_field.format(model.name)}"
                for key in raw:
                    paths[key] = f"{spath}.{key}"
        if model.config and catalogue_entry(model.config) is not None:
            engine["model"] = model.config
        else:
            engine.setdefault("model", model.source)
        paths["model"] = f"{mpath}.source"
        paths["tensor_parallel_size"] = f"{mpath}.tensor_parallel"
        paths["pipeline_parallel_size"] = f"{mpath}.pipeline_parallel"
        name = "model-" + re.sub(r"[^A-Za-z0-9_.-]", "-", model.name)
        j, dep = deps.get(name, (-1, {}))
        dep_path = f"{app_path}.deployments[{j}]" if j >= 0 else mpath
        num_gpus, bundles, gpus_path = _gpus_of(dep, dep_path)
        out.append(
            EngineReplica(
                manifest=m,
                name=f"{app_name}/{name}",
                path=dep_path,
                options=dep,
                options_path=dep_path,
                engine=engine,
                engine_paths={k: v for k, v in paths.items() if k in engine},
                num_gpus=num_gpus,
                bundles=bundles,
                gpus_path=gpus_path,
                pins=_pins(dep),
                tenant=model.tenant,
                planned_slice_utilization=(
                    settings.slice_memory_utilization if settings is not None else None
                ),
            )
        )
    return out


def engine_replicas(m: Manifest) -> list[EngineReplica]:
    """Every Serve replica kind of a RayService, with its vLLM engine arguments when written."""
    out: list[EngineReplica] = []
    for serve_app in serve_apps(m):
        app, app_path, app_name = serve_app.body, serve_app.path, serve_app.name
        llm = _serve_llm_replicas(m, app, app_path, app_name)
        if llm:
            out.extend(llm)
            continue
        own = _fleetserve_replicas(m, app, app_path, app_name)
        if own is not None:
            out.extend(own)
            continue
        app_env, app_env_paths = _env_of(app.get("runtime_env"), f"{app_path}.runtime_env")
        app_engine: dict[str, Any] = {}
        app_paths: dict[str, str] = {}
        args = app.get("args")
        _read_args(args, f"{app_path}.args", app_engine, app_paths)
        for sub in ("engine_args", "engine_kwargs"):
            if isinstance(args, dict):
                _read_args(args.get(sub), f"{app_path}.args.{sub}", app_engine, app_paths)
        deps = serve_app.deployments
        with_gpus = [
            d.index for d in deps if _gpus_of(d.body, "")[0] or _gpus_of(d.body, "")[1] is not None
        ]
        for item in deps:
            j, dep, dep_path = item.index, item.body, item.path
            env, env_paths = dict(app_env), dict(app_env_paths)
            actor = dep.get("ray_actor_options")
            if isinstance(actor, dict):
                dep_env, dep_env_paths = _env_of(
                    actor.get("runtime_env"), f"{dep_path}.ray_actor_options.runtime_env"
                )
                env.update(dep_env)
                env_paths.update(dep_env_paths)
            num_gpus, bundles, gpus_path = _gpus_of(dep, dep_path)
            engine, paths = _read_env(env, env_paths)
            # App-level args describe "the" engine: they belong to the one deployment that
            # holds GPUs (or the only deployment); with several GPU deployments they are
            # ambiguous and left out rather than guessed.
            owns_args = (len(with_gpus) == 1 and j in with_gpus) or (
                not with_gpus and len(deps) == 1
            )
            if owns_args:
                engine.update(app_engine)
                paths.update(app_paths)
            out.append(
                EngineReplica(
                    manifest=m,
                    name=item.name,
                    path=dep_path,
                    options=dep,
                    options_path=dep_path,
                    engine=engine,
                    engine_paths=paths,
                    env=env,
                    env_paths=env_paths,
                    num_gpus=num_gpus,
                    bundles=bundles,
                    gpus_path=gpus_path,
                    pins=_pins(dep),
                )
            )
        if not deps:
            engine, paths = _read_env(app_env, app_env_paths)
            engine.update(app_engine)
            paths.update(app_paths)
            if engine:
                out.append(
                    EngineReplica(
                        manifest=m,
                        name=app_name,
                        path=app_path,
                        options={},
                        options_path=app_path,
                        engine=engine,
                        engine_paths=paths,
                        env=app_env,
                        env_paths=app_env_paths,
                    )
                )
    return out


def http_port(m: Manifest) -> int:
    """The Serve HTTP port of a RayService (``http_options.port``, default 8000)."""
    found = serve_config(m)
    if found is not None:
        opts = found[0].get("http_options")
        if isinstance(opts, dict):
            port = _float(opts.get("port"))
            if port is not None:
                return int(port)
    return 8000


# --------------------------------------------------------------------------- vLLM CLI pods

_CLI_FLAGS: dict[str, str] = {
    "--model": "model",
    "--port": "port",
    "--revision": "revision",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--dtype": "dtype",
    "--quantization": "quantization",
    "-q": "quantization",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--distributed-executor-backend": "distributed_executor_backend",
    "--max-loras": "max_loras",
    "--max-cpu-loras": "max_cpu_loras",
    "--max-lora-rank": "max_lora_rank",
}


def parse_vllm_cli(
    words: list[str] | list[tuple[str, str]], path: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """Engine arguments from ``vllm serve`` tokens (optionally paired with their field paths)."""
    pairs = [w if isinstance(w, tuple) else (w, path) for w in words]
    engine: dict[str, Any] = {}
    paths: dict[str, str] = {}
    for n, (word, word_path) in enumerate(pairs):
        flag, eq, value = word.partition("=")
        if flag.startswith("--"):
            # vLLM's parser takes --pipeline_parallel_size as --pipeline-parallel-size (LWS'
            # vLLM example writes it so).
            flag = "--" + flag[2:].replace("_", "-")
        where = word_path
        if not eq and n + 1 < len(pairs):
            value, where = pairs[n + 1]
        found = _CLI_FLAGS.get(flag)
        if found is None and flag in _BOOL_FLAGS:
            # A boolean flag (BooleanOptionalAction): it consumes no value unless "=x" is given.
            key, on = _BOOL_FLAGS[flag]
            if eq:
                on = on and value.strip().lower() in ("1", "true", "yes")
            engine[key] = on
            paths[key] = word_path
            continue
        if flag == "--lora-modules":
            # nargs="+": every following word up to the next option is one adapter
            rest = itertools.takewhile(lambda p: not p[0].startswith("-"), pairs[n + 1 :])
            engine["lora_modules"] = [w for w, _ in rest]
            paths["lora_modules"] = word_path
            continue
        if found is None and word == "serve" and n + 1 < len(pairs):
            nxt = pairs[n + 1][0]
            if n > 0 and pairs[n - 1][0].endswith("vllm") and not nxt.startswith("-"):
                engine["model"] = nxt
                paths["model"] = pairs[n + 1][1]
            continue
        if found is None:
            continue
        coerced = _coerce(found, value)
        if coerced is not None:
            engine[found] = coerced
            paths[found] = where
    return engine, paths


def container_words(container: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """The container's command then args as shell words, each with its field path (a
    ``sh -c "..."`` script is split into its words too)."""
    words: list[tuple[str, str]] = []
    for key in ("command", "args"):
        items = container.get(key)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            text = str(item)
            try:
                parts = shlex.split(text) if " " in text else [text]
            except ValueError:
                parts = [text]
            words.extend((w, f"{path}.{key}[{i}]") for w in parts)
    return words


def runs_vllm(container: dict[str, Any], words: list[tuple[str, str]]) -> bool:
    """A container of a vLLM image, or one whose command line names vLLM."""
    image = str(container.get("image", "")).lower()
    return "vllm" in image or any("vllm" in w for w, _ in words)


def container_engine(
    container: dict[str, Any], path: str, *, raw: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """vLLM engine arguments of a container that runs the vLLM server (``vllm serve``,
    ``python -m vllm.entrypoints.openai.api_server``, or the vllm-openai image), read from its
    command/args and literal env vars; ({}, {}) for any other container. Arguments outside
    vLLM's bounds are left out unless ``raw`` (``engine-arg-invalid`` reads them)."""
    words = container_words(container, path)
    if not runs_vllm(container, words):
        return {}, {}
    engine, paths = parse_vllm_cli(words, path)
    env = container.get("env")
    literal: dict[str, str] = {}
    literal_paths: dict[str, str] = {}
    for i, e in enumerate(env if isinstance(env, list) else []):
        if isinstance(e, dict) and "value" in e and isinstance(e.get("name"), str):
            literal[e["name"]] = str(e["value"])
            literal_paths[e["name"]] = f"{path}.env[{i}].value"
    from_env, env_paths = _read_env(literal, literal_paths)
    for key, value in from_env.items():
        engine.setdefault(key, value)
        paths.setdefault(key, env_paths[key])
    return engine if raw else split_rejected(engine)[0], paths


# --------------------------------------------------------------------------- other operators

#: The port vLLM's OpenAI server listens on without ``--port`` (vllm/entrypoints/openai/cli_args).
VLLM_DEFAULT_PORT = 8000
#: KubeAI's ``Model`` (kubeai.org): ``spec.args`` are vLLM flags, ``spec.url`` the model
#: (``hf://org/name``), ``spec.resourceProfile`` ``<profile>:<count>``.
KUBEAI_GROUP = "kubeai.org"
#: production-stack's camelCase ``vllmConfig`` keys -> vLLM's argument names (the chart's
#: templates/deployment-vllm-multi.yaml turns each into the flag).
_PRODUCTION_STACK_ARGS = {
    "tensorParallelSize": "tensor_parallel_size",
    "pipelineParallelSize": "pipeline_parallel_size",
    "gpuMemoryUtilization": "gpu_memory_utilization",
    "maxModelLen": "max_model_len",
    "maxNumSeqs": "max_num_seqs",
    "maxNumBatchedTokens": "max_num_batched_tokens",
    "dtype": "dtype",
    "maxLoras": "max_loras",
    "enableChunkedPrefill": "enable_chunked_prefill",
}


@dataclass(frozen=True)
class OperatorEngine:
    """A vLLM engine an operator or chart runs from its own fields (KubeAI ``Model``,
    production-stack ``modelSpec``), as written, with the GPUs it is given."""

    #: ``Model 'x'`` / ``production-stack modelSpec 'x'``.
    who: str
    #: Field path of the engine's block.
    path: str
    engine: dict[str, Any]
    paths: dict[str, str]
    #: GPUs one replica gets, None when unknown.
    gpus: int | None
    #: Field path of the GPU count.
    gpus_path: str
    env: dict[str, str] = field(default_factory=dict)


def kubeai_engine(m: Manifest, profiles: dict[str, int] | None = None) -> OperatorEngine | None:
    """The vLLM engine of a KubeAI ``Model`` (None for other kinds or engines)."""
    if m.kind != "Model" or not m.api_version.startswith(KUBEAI_GROUP + "/"):
        return None
    return kubeai_spec_engine(m.body.get("spec"), f"KubeAI Model {m.name!r}", "spec", profiles)


def kubeai_spec_engine(
    spec: Any, who: str, base: str, profiles: dict[str, int] | None = None
) -> OperatorEngine | None:
    """The vLLM engine of a KubeAI Model spec (a ``Model``'s ``spec`` or an entry of the
    models chart's ``catalog``): ``args``, ``url: hf://...``, ``env`` and
    ``resourceProfile: <profile>:<count>``, whose GPUs are the count times the profile's
    GPUs per unit (``profiles``, from the kubeai chart's ``resourceProfiles``; KubeAI's own
    GPU profiles give 1 per unit, which is assumed for a ``*gpu*`` profile not listed)."""
    if not isinstance(spec, dict) or str(spec.get("engine", "")).upper() != "VLLM":
        return None
    args = spec.get("args")
    words = [
        (str(a), f"{base}.args[{i}]") for i, a in enumerate(args if isinstance(args, list) else [])
    ]
    engine, paths = parse_vllm_cli(words, f"{base}.args")
    url = spec.get("url")
    if isinstance(url, str) and url.startswith("hf://"):
        engine.setdefault("model", url.removeprefix("hf://"))
        paths.setdefault("model", f"{base}.url")
    profile = str(spec.get("resourceProfile", ""))
    name, _, count = profile.rpartition(":")
    gpus: int | None = None
    if count.isdigit():
        per_unit = (profiles or {}).get(name)
        if per_unit is None and "gpu" in name.lower():
            per_unit = 1
        gpus = int(count) * per_unit if per_unit else None
    env = spec.get("env")
    literal = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    return OperatorEngine(who, base, engine, paths, gpus, f"{base}.resourceProfile", literal)


#: Extended resources that count as GPUs in a KubeAI resource profile.
_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


def kubeai_profiles(values: Any) -> dict[str, int]:
    """GPUs per unit of each resource profile of the kubeai chart's values (limits, else
    requests, of nvidia.com/gpu or amd.com/gpu; 0 for a CPU profile)."""
    profiles = values.get("resourceProfiles") if isinstance(values, dict) else None
    out: dict[str, int] = {}
    for name, prof in profiles.items() if isinstance(profiles, dict) else []:
        if not isinstance(prof, dict):
            continue
        count = 0
        for key in ("limits", "requests"):
            res = prof.get(key)
            for r in _GPU_RESOURCES:
                if isinstance(res, dict) and str(res.get(r, "")).isdigit():
                    count = max(count, int(str(res[r])))
        out[str(name)] = count
    return out


def kubeai_catalog_engines(values: Any, profiles: dict[str, int]) -> list[OperatorEngine]:
    """The vLLM engines of the kubeai models chart's ``catalog`` (every entry: enabling one
    with ``--set catalog.<name>.enabled=true`` deploys it as written)."""
    catalog = values.get("catalog") if isinstance(values, dict) else None
    out: list[OperatorEngine] = []
    for name, spec in catalog.items() if isinstance(catalog, dict) else []:
        e = kubeai_spec_engine(spec, f"KubeAI catalog model {name!r}", f"catalog.{name}", profiles)
        if e is not None:
            out.append(e)
    return out


def kubeai_engines(inv: Inventory) -> list[tuple[Located, OperatorEngine]]:
    """Every KubeAI vLLM engine of the input - ``Model`` objects and the models chart's
    catalog - with GPU counts from the kubeai chart's resource profiles when its values are
    in the input."""
    profiles: dict[str, int] = {}
    for values in inv.charts("kubeai"):
        profiles.update(kubeai_profiles(values.body))
    out: list[tuple[Located, OperatorEngine]] = []
    for m in inv.of_kind("Model"):
        if (e := kubeai_engine(m, profiles)) is not None:
            out.append((m, e))
    for values in inv.charts("kubeai-models"):
        out.extend((values, e) for e in kubeai_catalog_engines(values.body, profiles))
    return out


def production_stack_engines(values: Any) -> list[OperatorEngine]:
    """The vLLM engines of vllm-project/production-stack's chart values
    (``servingEngineSpec.modelSpec[]``: ``vllmConfig``, its ``extraArgs``, ``modelURL``,
    ``requestGPU``)."""
    spec = values.get("servingEngineSpec") if isinstance(values, dict) else None
    models = spec.get("modelSpec") if isinstance(spec, dict) else None
    out: list[OperatorEngine] = []
    for i, model in enumerate(models if isinstance(models, list) else []):
        if not isinstance(model, dict) or model.get("enabled") is False:
            continue
        base = f"servingEngineSpec.modelSpec[{i}]"
        cfg = model.get("vllmConfig")
        cfg = cfg if isinstance(cfg, dict) else {}
        engine: dict[str, Any] = {}
        paths: dict[str, str] = {}
        for key, arg in _PRODUCTION_STACK_ARGS.items():
            if key in cfg and (value := _coerce(arg, cfg[key])) is not None:
                engine[arg] = value
                paths[arg] = f"{base}.vllmConfig.{key}"
        extra = cfg.get("extraArgs")
        words = [
            (str(a), f"{base}.vllmConfig.extraArgs[{j}]")
            for j, a in enumerate(extra if isinstance(extra, list) else [])
        ]
        more, more_paths = parse_vllm_cli(words, f"{base}.vllmConfig.extraArgs")
        engine.update(more)  # extra args come last on the command line: they win
        paths.update(more_paths)
        if isinstance(model.get("modelURL"), str):
            engine["model"] = model["modelURL"]
            paths["model"] = f"{base}.modelURL"
        gpus = model.get("requestGPU")
        count = int(gpus) if isinstance(gpus, int) and not isinstance(gpus, bool) else None
        name = model.get("name", i)
        out.append(
            OperatorEngine(
                f"production-stack modelSpec {name!r}",
                base,
                engine,
                paths,
                count,
                f"{base}.requestGPU",
            )
        )
    return out
