"""The RayService's ``serveConfigV2``: fleetserve's Serve app with the plan's engine settings.

Design: one Serve application (``fleetserve.serve.app:build_app``, args of its
``BuildArgs`` shape) serves every model of the fleet behind one OpenAI endpoint: an
``ingress`` deployment and one ``model-<name>`` deployment per model. Its ``args`` carry the
fleet spec (secret references rewritten to the env vars the pods get, see :mod:`.secrets`)
and the per-model ``engine_settings`` from the plan. Ray-level options are written where Ray
Serve and ``doctor`` read them, in ``deployments[]`` (they override the app's code), one per
model:

* ``autoscaling_config`` from ``models[].replicas`` (min/max/target_ongoing_requests, delays,
  fleetserve's LLM autoscaling policy), or ``num_replicas`` when min == max - never both -
  and ``max_ongoing_requests``: the current field names, not the removed
  ``max_concurrent_queries``/``target_num_ongoing_requests_per_replica``;
* ``request_router_config``: fleetserve's prefix-aware router with ``models[].routing``;
* ``ray_actor_options``: the replica's CPUs, one unit of the model's custom resource (pins it
  to its worker group), and its GPUs - ``num_gpus`` = the pod's cards for one card, or, for
  tensor/pipeline parallelism, a STRICT_PACK placement group with one ``{GPU: 1}`` bundle per
  rank (the replica actor itself holds none; vLLM's Ray executor starts one worker per GPU
  bundle), so tensor_parallel x pipeline_parallel = GPUs by construction. A replica whose
  pipeline stages cross nodes gets the same one-bundle-per-rank group under PACK over its
  pods (see :func:`replica_options`) and ``distributed_executor_backend: ray`` in its
  engine args.

What must stay true: ``http_options.port`` is the pods' ``serve`` container port, and the
config is JSON-able and deterministic (dicts in a fixed order).
"""

from __future__ import annotations

from typing import Any

from fleetserve.errors import RenderError
from fleetserve.k8s.render.groups import WorkerGroup
from fleetserve.k8s.render.secrets import spec_for_cluster
from fleetserve.serve.deployment_options import (
    APP_NAME,
    deployment_name,
    replica_count_options,
    request_router_options,
)
from fleetserve.serve.limits import serve_request_timeout_s
from fleetserve.spec import FleetSpec, ModelSpec

#: Import path of fleetserve's Serve application builder.
APP_IMPORT_PATH = "fleetserve.serve.app:build_app"


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def replica_options(model: ModelSpec, group: WorkerGroup) -> dict[str, Any]:
    """Ray options of one model's Serve replica (the part of a deployment Ray schedules)."""
    cpu = _number(model.resources.cpu)
    pin = {group.ray_resource: 1}
    gpus = group.shape.gpus
    if group.pods_per_replica > 1:
        # Pipeline stages across pods: vLLM's Ray executor wants one {GPU: 1} bundle per
        # rank (it refuses bundles of more) and sorts its workers by node, so each pod's
        # ranks - whole tensor-parallel groups - stay together. PACK (Ray Serve LLM's
        # default) fills one pod before the next; STRICT_PACK would need one node, and
        # STRICT_SPREAD one node per GPU. Every bundle takes one unit of the model's
        # resource (its pods advertise one per card), so bundles land only on its pods;
        # the replica actor (vLLM's driver, which must share a node with a bundle) sits
        # in bundle 0.
        total = gpus * group.pods_per_replica
        ranks: list[dict[str, Any]] = [{"CPU": cpu, "GPU": 1, **pin}]
        ranks += [{"GPU": 1, **pin} for _ in range(total - 1)]
        return {
            "ray_actor_options": {"num_cpus": cpu, "num_gpus": 0, "resources": pin},
            "placement_group_bundles": ranks,
            "placement_group_strategy": "PACK",
        }
    if gpus > 1:
        bundles: list[dict[str, Any]] = [{"CPU": cpu, "GPU": 1, **pin}]
        bundles += [{"GPU": 1} for _ in range(gpus - 1)]
        return {
            "ray_actor_options": {"num_cpus": cpu, "num_gpus": 0, "resources": pin},
            "placement_group_bundles": bundles,
            "placement_group_strategy": "STRICT_PACK",
        }
    options: dict[str, Any] = {"num_cpus": cpu, "resources": pin}
    if gpus == 1:
        options["num_gpus"] = 1
    return {"ray_actor_options": options}


def _with_ray_executor(
    data: dict[str, Any], spec: FleetSpec, groups: dict[str, WorkerGroup]
) -> dict[str, Any]:
    """The app's spec with ``distributed_executor_backend: ray`` in the engine args of
    every model whose replica spans pods: vLLM's multiprocessing executor keeps all ranks
    on one node, its Ray executor places them on the placement group's bundles. Stated
    rather than left to vLLM's default (which picks Ray inside a placement group), so
    the manifest says how the engine runs."""
    for i, model in enumerate(spec.models):
        group = groups.get(model.name)
        if group is None or group.pods_per_replica == 1:
            continue
        backend = model.engine_args.get("distributed_executor_backend", "ray")
        if backend != "ray":
            raise RenderError(
                f"models[{i}].engine_args.distributed_executor_backend of '{model.name}' is "
                f"{backend!r}, but its replica spans {group.pods_per_replica} pods (pipeline "
                "stages across nodes): only vLLM's Ray executor runs ranks on other nodes",
                hint="remove it (render sets 'ray') or set it to 'ray'",
            )
        data["models"][i].setdefault("engine_args", {})["distributed_executor_backend"] = "ray"
    return data


def engine_settings(group: WorkerGroup, *, hami: bool) -> dict[str, Any]:
    """The engine settings the replica starts with.

    Inside a HAMi slice, HAMi-core reports the slice as the card's total memory, so vLLM's
    ``gpu_memory_utilization`` (a fraction of what it sees) must be the plan's fraction of
    the slice, not of the whole card; elsewhere the plan's whole-card fraction is right.
    """
    settings = group.shape.engine.model_dump(mode="json")
    slice_fraction = group.shape.engine.slice_memory_utilization
    if hami and group.shape.sliced and slice_fraction is not None:
        settings["gpu_memory_utilization"] = slice_fraction
    return settings


def serve_config(
    spec: FleetSpec,
    groups: list[WorkerGroup],
    runtime_pip: list[str] | None = None,
    *,
    hami: bool = False,
) -> dict[str, Any]:
    """The Serve config (``serveConfigV2`` parsed) of the fleet.

    ``runtime_pip``: requirements Ray installs for the app (``runtime_env.pip``) when the
    image does not contain fleetserve; ``hami``: GPU pods are HAMi slices.
    """
    first_group: dict[str, WorkerGroup] = {}
    pods_max: dict[str, int] = {}
    for group in groups:
        first_group.setdefault(group.model.name, group)
        replicas_max = group.max_replicas // group.pods_per_replica
        pods_max[group.model.name] = pods_max.get(group.model.name, 0) + replicas_max
    deployments = []
    engine = {}
    for model in spec.models:
        if model.name not in first_group:
            continue
        group = first_group[model.name]
        engine[model.name] = engine_settings(group, hami=hami)
        replicas = model.replicas
        # The worker groups hold pods_max replicas; asking Serve for more would leave
        # replicas pending forever (pitfall serve-replicas-exceed-workers).
        high = min(replicas.max, pods_max[model.name])
        deployment: dict[str, Any] = {
            "name": deployment_name(model.name),
            "max_ongoing_requests": replicas.max_ongoing_requests,
        }
        # As the app does in code (one source: serve.deployment_options): a fixed count
        # when min == max, else autoscaling with fleetserve's LLM policy (Serve rejects
        # num_replicas together with autoscaling_config); fleetserve's request router.
        deployment.update(replica_count_options(model, high))
        deployment.update(request_router_options(model))
        deployment["graceful_shutdown_timeout_s"] = _number(spec.server.drain_timeout_s)
        deployment.update(replica_options(model, group))
        deployments.append(deployment)
    app: dict[str, Any] = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": APP_IMPORT_PATH,
    }
    if runtime_pip:
        app["runtime_env"] = {"pip": list(runtime_pip)}
    app["args"] = {
        "spec": _with_ray_executor(spec_for_cluster(spec), spec, first_group),
        "engine": "vllm",
        "engine_settings": engine,
    }
    app["deployments"] = deployments
    return {
        "proxy_location": "EveryNode",
        "http_options": {
            "host": "0.0.0.0",
            "port": spec.server.port,
            # A backstop behind the gateway's own deadline (which answers with an SSE error).
            "request_timeout_s": _number(serve_request_timeout_s(spec.server.request_timeout_s)),
        },
        "applications": [app],
    }
