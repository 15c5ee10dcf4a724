"""What ``render`` needs besides the fleet spec and the plans: cluster-side knobs.

These are facts about the target cluster, not about the fleet (where Prometheus runs, which
Karpenter node class to use), so they are options of the render step rather than spec
fields; the CLI exposes each as a flag.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.observe.alerts import AlertThresholds

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class RenderOptions(BaseModel):
    """Cluster-side settings of one render."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    monitoring_labels: dict[str, str] | None = Field(
        default=None,
        description="Labels the Prometheus CR selects monitors/rules by "
        "(default: spec.kubernetes.monitoring_labels).",
    )
    prometheus_namespace: str = Field(
        default="kube-prometheus-stack",
        pattern=_DNS_LABEL,
        max_length=63,
        description="Namespace Prometheus scrapes from; the NetworkPolicy lets it reach the "
        "metrics port (8080) and nothing else.",
    )
    kuberay_namespace: str = Field(
        default="kuberay-operator",
        pattern=_DNS_LABEL,
        max_length=63,
        description="Namespace of the KubeRay operator; the NetworkPolicy lets it reach the "
        "dashboard port (8265), through which it deploys the Serve config.",
    )
    gpu_sharing: Literal["auto", "hami", "none"] = Field(
        default="auto",
        description="How GPU pods get their cards: 'hami' (HAMi vGPU slices, "
        "schedulerName hami-scheduler), 'none' (whole cards, the default scheduler; a plan "
        "that shares a card is refused), 'auto' (HAMi exactly when the max plan puts two "
        "replicas on one card).",
    )
    with_nodepools: bool = Field(
        default=False, description="Also render one Karpenter NodePool (karpenter.sh/v1) per pool."
    )
    node_class: str = Field(
        default="default",
        pattern=_DNS_LABEL,
        max_length=63,
        description="EC2NodeClass the rendered NodePools reference.",
    )
    head_pool: str | None = Field(
        default=None,
        pattern=_DNS_LABEL,
        description="Pool the Ray head runs on (default: the first pool without GPUs, else "
        "any untainted node).",
    )
    head_cpu: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Head pod CPUs (GCS, Serve controller, proxy, dashboard; it runs no replicas).",
    )
    head_memory_gib: int = Field(default=8, ge=2, le=512, description="Head pod memory (GiB).")
    idle_timeout_s: int = Field(
        default=600,
        ge=0,
        le=86_400,
        description="Ray autoscaler: seconds a worker pod stays idle before it is removed "
        "(GPU pods reload weights when re-added, so this is long by default).",
    )
    runtime_env_pip: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="pip requirements the Serve application installs at start (runtime_env); "
        "empty when the image already contains fleetserve (the recommended way).",
    )
    alerts: AlertThresholds = Field(
        default_factory=AlertThresholds, description="Alert thresholds of the PrometheusRule."
    )
    hami_namespace: str = Field(
        default="kube-system",
        pattern=_DNS_LABEL,
        max_length=63,
        description="Namespace of HAMi's device plugin, whose vGPU monitor (port 9394) the "
        "rendered ServiceMonitor scrapes when GPU pods use HAMi slices.",
    )
