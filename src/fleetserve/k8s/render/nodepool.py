"""Karpenter NodePools (karpenter.sh/v1, AWS provider) for the fleet's pools (pure).

Design: a NodePool is named after its pool and stamps the pool's labels on its nodes, so
the worker groups' nodeSelector (the pool's labels) matches exactly the nodes Karpenter
creates for them (pitfall ``node-selector-no-pool``); GPU pools also taint their nodes with
``nvidia.com/gpu:NoSchedule`` (the worker pods tolerate it) so nothing else lands on GPUs.
Instance requirements say "at least" what the spec's pool says (cards per node, card memory
and name, CPUs, memory), and ``limits`` cap the pool at ``max_nodes``. GPU nodes are only
consolidated when empty: moving a replica means reloading its weights.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fleetserve.k8s.render.naming import common_labels
from fleetserve.k8s.render.pods import GPU_RESOURCE, GPU_TAINT_KEY
from fleetserve.spec import FleetSpec, PoolSpec
from fleetserve.units import gib_ceil, gib_to_mib_ceil

#: Karpenter's AWS ``instance-gpu-name`` values for GPU family names.
_GPU_NAMES = ("a100", "a10g", "h100", "h200", "l40s", "l4", "t4", "v100", "b200")


def karpenter_gpu_name(gpu_type: str | None) -> str | None:
    """``A100-80GB`` -> ``a100``; None when the family is not one Karpenter names."""
    if not gpu_type:
        return None
    head = re.split(r"[-_ ]", gpu_type.strip().lower(), maxsplit=1)[0]
    return head if head in _GPU_NAMES else None


def _requirement(key: str, operator: str, values: list[str]) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": values}


def node_pool(spec: FleetSpec, pool: PoolSpec, node_class: str) -> dict[str, Any]:
    gpu = pool.gpu if pool.gpu is not None and pool.gpu.count > 0 else None
    requirements = [
        _requirement("karpenter.sh/capacity-type", "In", ["on-demand"]),
        _requirement("kubernetes.io/arch", "In", ["amd64"]),
        _requirement("karpenter.k8s.aws/instance-cpu", "Gt", [str(math.ceil(pool.cpu) - 1)]),
        _requirement(
            "karpenter.k8s.aws/instance-memory", "Gt", [str(gib_to_mib_ceil(pool.memory_gb) - 1)]
        ),
    ]
    taints = [
        {"key": t.key, "effect": t.effect, **({"value": t.value} if t.value is not None else {})}
        for t in pool.taints
    ]
    if gpu is not None:
        requirements.append(
            _requirement("karpenter.k8s.aws/instance-gpu-count", "In", [str(gpu.count)])
        )
        if gpu.memory_gb is not None:
            mib = gib_to_mib_ceil(gpu.memory_gb)
            requirements.append(
                _requirement("karpenter.k8s.aws/instance-gpu-memory", "Gt", [str(mib - 1)])
            )
        name = karpenter_gpu_name(gpu.type)
        if name is not None:
            requirements.append(_requirement("karpenter.k8s.aws/instance-gpu-name", "In", [name]))
        if not any(t["key"] == GPU_TAINT_KEY for t in taints):
            taints.append({"key": GPU_TAINT_KEY, "effect": "NoSchedule"})
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
        "requirements": requirements,
        "expireAfter": "720h",
    }
    if taints:
        template_spec["taints"] = sorted(taints, key=lambda t: (t["key"], t["effect"]))
    body: dict[str, Any] = {
        "template": {
            "metadata": {"labels": dict(sorted(pool.labels.items()))},
            "spec": template_spec,
        },
        "disruption": {
            "consolidationPolicy": "WhenEmpty" if gpu is not None else "WhenEmptyOrUnderutilized",
            "consolidateAfter": "10m",
        },
    }
    if pool.max_nodes is not None:
        limits: dict[str, str] = {
            "cpu": f"{math.ceil(pool.cpu * pool.max_nodes)}",
            "memory": f"{gib_ceil(pool.memory_gb * pool.max_nodes)}Gi",
        }
        if gpu is not None:
            limits[GPU_RESOURCE] = str(gpu.count * pool.max_nodes)
        body["limits"] = limits
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool.name, "labels": common_labels(spec.kubernetes.name)},
        "spec": body,
    }
