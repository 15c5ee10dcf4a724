"""The RayService's ``serveConfigV2``: fleetserve's Serve app with the plan's deployments.

Design: one Serve application (``fleetserve.serve.control.app:build_app``, args of its
``BuildArgs`` shape) serves every model of the fleet behind one OpenAI endpoint: an
``ingress`` deployment and one ``model-<name>`` deployment per model. Its ``args`` carry the
fleet spec (secret references rewritten to the env vars the pods get, see :mod:`.secrets`)
and each model's deployment as the plan resolves it for its pods
(:func:`fleetserve.plan.deployment.pod_deployment`: vLLM's settings, Ray's reservation,
Serve's options), which the app builds verbatim. The same objects are written where Ray
Serve and ``doctor`` read Ray-level options, in ``deployments[]`` (they override the app's
code, and say the same), one per model:

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
  pods and ``distributed_executor_backend: ray`` in its
  engine args.

What must stay true: ``http_options.port`` is the pods' ``serve`` container port, and the
config is JSON-able and deterministic (dicts in a fixed order).
"""

from __future__ import annotations

from typing import Any

from fleetserve.k8s.render.groups import WorkerGroup
from fleetserve.k8s.render.secrets import spec_for_cluster
from fleetserve.plan.deployment import (
    APP_IMPORT_PATH,
    APP_NAME,
    ModelDeployment,
    PodTarget,
    pod_deployment,
    serve_request_timeout_s,
)
from fleetserve.spec import FleetSpec


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def pod_target(group: WorkerGroup, max_replicas: int, *, hami: bool) -> PodTarget:
    """How the plan's replica runs in ``group``'s pods."""
    return PodTarget(
        gpus=group.shape.gpus,
        pods_per_replica=group.pods_per_replica,
        ray_resource=group.ray_resource,
        max_replicas=max_replicas,
        hami_slice=hami and group.shape.sliced,
    )


def model_deployments(
    spec: FleetSpec, groups: list[WorkerGroup], *, hami: bool = False
) -> dict[str, ModelDeployment]:
    """Every placed model's deployment, as the plan resolves it for its pods."""
    first_group: dict[str, WorkerGroup] = {}
    pods_max: dict[str, int] = {}
    for group in groups:
        first_group.setdefault(group.model.name, group)
        replicas_max = group.max_replicas // group.pods_per_replica
        pods_max[group.model.name] = pods_max.get(group.model.name, 0) + replicas_max
    out: dict[str, ModelDeployment] = {}
    for i, model in enumerate(spec.models):
        if model.name not in first_group:
            continue
        group = first_group[model.name]
        # The worker groups hold pods_max replicas; asking Serve for more would leave
        # replicas pending forever (pitfall serve-replicas-exceed-workers).
        target = pod_target(group, pods_max[model.name], hami=hami)
        out[model.name] = pod_deployment(spec, i, group.shape.engine, target)
    return out


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
    planned = model_deployments(spec, groups, hami=hami)
    deployments = [planned[m.name].options() for m in spec.models if m.name in planned]
    cluster_spec = spec_for_cluster(spec)
    for i, model in enumerate(spec.models):
        if model.name in planned and planned[model.name].engine_args != model.engine_args:
            # The spec the app serves says how the engine runs (doctor reads it there too).
            cluster_spec["models"][i]["engine_args"] = dict(planned[model.name].engine_args)
    app: dict[str, Any] = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": APP_IMPORT_PATH,
    }
    if runtime_pip:
        app["runtime_env"] = {"pip": list(runtime_pip)}
    app["args"] = {
        "spec": cluster_spec,
        "engine": "vllm",
        # The plan's resolved deployments: what the app builds (vLLM, Ray and Serve
        # options), the same objects deployments[] below is written from.
        "deployments": {name: d.model_dump(mode="json") for name, d in planned.items()},
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
