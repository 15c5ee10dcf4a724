"""``render(spec, plan_min, plan_max) -> list of Kubernetes objects``: the pure core.

The objects, in a fixed order (the writer sorts files by name anyway): Namespace,
NetworkPolicy, RayService, ServiceMonitor, PodMonitor, PrometheusRule, dashboard ConfigMap
and, on request, one Karpenter NodePool per pool. Nothing here reads files, the clock or the
environment: the same spec and plans always give equal objects, whoever made the plans.
"""

from __future__ import annotations

from typing import Any

from fleetserve.errors import RenderError
from fleetserve.k8s.render.groups import (
    check_pool_selectors,
    plan_worker_groups,
    shared_cards,
)
from fleetserve.k8s.render.monitoring import (
    dashboard_configmap,
    hami_service_monitor,
    pod_monitor,
    prometheus_rule,
    service_monitor,
)
from fleetserve.k8s.render.network import namespace, network_policy
from fleetserve.k8s.render.nodepool import node_pool
from fleetserve.k8s.render.options import RenderOptions
from fleetserve.k8s.render.rayservice import rayservice
from fleetserve.k8s.render.secrets import fleet_secret_envs
from fleetserve.k8s.render.serveconfig import serve_config
from fleetserve.k8s.render.volumes import check_adapter_volumes
from fleetserve.plan.deployment import planned_spec
from fleetserve.plan.result import PlanResult
from fleetserve.spec import FleetSpec, PoolSpec


def _head_pool(spec: FleetSpec, options: RenderOptions) -> PoolSpec | None:
    if options.head_pool is not None:
        for pool in spec.pools:
            if pool.name == options.head_pool:
                return pool
        raise RenderError(
            f"head pool '{options.head_pool}' is not in the spec's pools "
            f"({', '.join(p.name for p in spec.pools) or 'none'})"
        )
    for pool in spec.pools:
        if pool.gpu is None or pool.gpu.count == 0:
            return pool
    return None


def use_hami(plan_max: PlanResult, options: RenderOptions) -> bool:
    """Whether GPU pods are HAMi slices (see ``RenderOptions.gpu_sharing``)."""
    shared = shared_cards(plan_max)
    if options.gpu_sharing == "none" and shared:
        raise RenderError(
            f"--gpu-sharing none, but the max plan shares cards between replicas ({shared[0]}"
            + (f", and {len(shared) - 1} more" if len(shared) > 1 else "")
            + "): without HAMi each pod takes whole cards",
            hint="install HAMi and use --gpu-sharing hami (or auto), or give the pools more cards",
        )
    return options.gpu_sharing == "hami" or (options.gpu_sharing == "auto" and bool(shared))


def render(
    spec: FleetSpec,
    plan_min: PlanResult,
    plan_max: PlanResult,
    options: RenderOptions | None = None,
) -> list[dict[str, Any]]:
    """Every Kubernetes object of the fleet, as plain dicts: ``spec`` as the plan resolved
    it (a traffic-planned model's choices, :func:`~fleetserve.plan.deployment.planned_spec`)."""
    opts = options or RenderOptions()
    spec = planned_spec(spec, plan_max)
    spec.require_weights("render")  # the RayService's replicas load the weights from source
    check_adapter_volumes(spec)  # ... and their adapters from paths the pods must see
    groups = plan_worker_groups(spec, plan_min, plan_max)
    check_pool_selectors(spec, groups)
    hami = use_hami(plan_max, opts)
    secrets = fleet_secret_envs(spec)
    labels = dict(sorted((opts.monitoring_labels or spec.kubernetes.monitoring_labels).items()))
    objects: list[dict[str, Any]] = [
        namespace(spec),
        network_policy(
            spec,
            prometheus_namespace=opts.prometheus_namespace,
            kuberay_namespace=opts.kuberay_namespace,
        ),
        rayservice(
            spec,
            groups,
            serve_config(spec, groups, opts.runtime_env_pip, hami=hami),
            options=opts,
            head_pool=_head_pool(spec, opts),
            secrets=secrets,
            hami=hami,
        ),
        service_monitor(spec, labels),
        pod_monitor(spec, labels),
        prometheus_rule(spec, labels, opts.alerts),
        dashboard_configmap(spec),
    ]
    if hami:
        # HAMi's per-slice memory and cores, joined with the engines on the dashboard.
        objects.append(hami_service_monitor(spec, labels, hami_namespace=opts.hami_namespace))
    if opts.with_nodepools:
        objects.extend(node_pool(spec, pool, opts.node_class) for pool in spec.pools)
    return objects
