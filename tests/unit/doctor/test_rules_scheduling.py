"""Scheduling rules beyond the catalogue fixtures: pools from every source, edge cases."""

from __future__ import annotations

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory
from fleetserve.k8s.doctor.loader import load_python_text, load_text
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import FIXTURES

RS = (FIXTURES / "head-schedulable" / "near_miss.yaml").read_text(encoding="utf-8")
CLUSTER = (FIXTURES / "train-coordinator-cpu" / "trigger" / "raycluster.yaml").read_text(
    encoding="utf-8"
)
TRAIN = (FIXTURES / "train-coordinator-cpu" / "trigger" / "train.py").read_text(encoding="utf-8")

GPU_WORKER_POD = """                    nvidia.com/gpu: "1"
"""


def _rules(text: str, *rules: str) -> list[Finding]:
    return run_rules(load_text(text, "x.yaml"), set(rules))


def _with_pod(extra: str) -> str:
    return RS.replace(GPU_WORKER_POD, GPU_WORKER_POD + extra)


FLEET = """
---
models:
  - name: m
    source: builtin:gemma-3-270m
pools:
  - name: l4
    labels: {pool: l4}
    gpu: {count: 1, memory_gb: 24}
    taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
"""


def test_fleet_spec_pools_join_with_the_rayservice() -> None:
    text = _with_pod("            nodeSelector: {pool: a100}\n") + FLEET
    [f] = _rules(text, "node-selector-no-pool")
    assert "x.yaml pool l4 has pool=l4" in f.message
    assert "pool: l4" in f.fix
    [t] = _rules(text, "missing-gpu-toleration")
    assert "nvidia.com/gpu:NoSchedule" in t.message
    ok = _with_pod(
        "            nodeSelector: {pool: l4}\n"
        "            tolerations: [{operator: Exists}]\n"  # tolerates every taint
    )
    assert _rules(ok + FLEET, "node-selector-no-pool", "missing-gpu-toleration") == []


def test_node_objects_are_pools() -> None:
    node = """
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-1
  labels: {node.kubernetes.io/instance-type: g5.xlarge}
spec:
  taints: [{key: dedicated, value: llm, effect: NoSchedule}]
status:
  capacity: {nvidia.com/gpu: "1"}
"""
    text = _with_pod("            nodeSelector: {node.kubernetes.io/instance-type: g5.xlarge}\n")
    assert _rules(text + node, "node-selector-no-pool") == []
    [f] = _rules(text + node, "missing-gpu-toleration")
    assert "dedicated=llm:NoSchedule" in f.message
    # Plain Nodes know no label they do not carry (unlike Karpenter's well-known labels).
    text = _with_pod("            nodeSelector: {topology.kubernetes.io/zone: us-east-1a}\n")
    assert len(_rules(text + node, "node-selector-no-pool")) == 1


def test_no_pools_means_no_pool_findings() -> None:
    text = _with_pod("            nodeSelector: {anything: at-all}\n")
    assert _rules(text, "node-selector-no-pool", "missing-gpu-toleration") == []


def test_affinity_not_in_excludes_the_only_pool() -> None:
    pools = (FIXTURES / "node-selector-no-pool" / "trigger.yaml").read_text(encoding="utf-8")
    pools = pools.split("apiVersion: ray.io/v1")[0]
    affinity = """            affinity:
              nodeAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                  nodeSelectorTerms:
                    - matchExpressions:
                        - {key: karpenter.sh/nodepool, operator: NotIn, values: [gpu, default]}
"""
    [f] = _rules(pools + _with_pod(affinity), "node-selector-no-pool")
    assert f.path.endswith("template.spec.affinity")


def test_train_v2_by_ray_version_has_no_coordinator() -> None:
    v260 = CLUSTER.replace("2.41.0", "2.60.0")
    inv = load_text(v260, "c.yaml")
    py = load_python_text(TRAIN, "train.py")
    both = Inventory(inv.manifests, (), py.scaling_configs)
    assert run_rules(both, {"train-coordinator-cpu"}) == []
    older = Inventory(load_text(CLUSTER, "c.yaml").manifests, (), py.scaling_configs)
    assert len(run_rules(older, {"train-coordinator-cpu"})) == 1


def test_unresolved_resources_are_not_guessed() -> None:
    src = TRAIN.replace('{"CPU": CPUS_PER_WORKER, "GPU": 1}', "load_resources()")
    inv = Inventory(
        load_text(CLUSTER, "c.yaml").manifests, (), load_python_text(src).scaling_configs
    )
    assert run_rules(inv, {"train-coordinator-cpu", "infeasible-request"}) == []


JOB = """apiVersion: ray.io/v1
kind: RayJob
metadata: {name: nightly, namespace: ml}
spec:
  entrypoint: python train.py
  entrypointNumGpus: 2
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {num-cpus: "0"}
      template:
        spec:
          containers: [{name: head, image: "rayproject/ray:2.60.0"}]
    workerGroupSpecs:
      - groupName: gpu
        replicas: 1
        minReplicas: 0
        maxReplicas: 2
        template:
          spec:
            containers:
              - name: worker
                image: rayproject/ray:2.60.0-gpu
                resources: {limits: {cpu: "4", nvidia.com/gpu: "1"}}
"""


def test_rayjob_entrypoint_must_fit_a_node() -> None:
    found = _rules(JOB, "infeasible-request")
    assert [f.path for f in found] == ["spec.entrypointNumGpus"]
    assert "{GPU: 2}" in found[0].message
    assert (
        _rules(JOB.replace("entrypointNumGpus: 2", "entrypointNumGpus: 1"), "infeasible-request")
        == []
    )


ACTOR = "            ray_actor_options:\n              num_cpus: 1\n              num_gpus: 1\n"
BUNDLES = (
    "            placement_group_bundles: [{CPU: 1, GPU: 1}, {GPU: 1}]\n"
    "            placement_group_strategy: STRICT_PACK\n"
)


def test_groups_without_pods_hold_nothing() -> None:
    # No autoscaler and replicas unset: KubeRay defaults replicas to 0, so no worker exists.
    job = JOB.replace("        replicas: 1\n", "").replace(
        "entrypointNumGpus: 2", "entrypointNumGpus: 1"
    )
    [f] = _rules(job, "infeasible-request")
    assert "with 0 pods (replicas 0, autoscaling off)" in f.message


def test_strict_pack_needs_one_node() -> None:
    serve = RS.replace(ACTOR, ACTOR + BUNDLES)
    [f] = _rules(serve, "infeasible-request")
    assert "all bundles together (STRICT_PACK) needs {CPU: 1, GPU: 2}" in f.message
    spread = serve.replace("STRICT_PACK", "SPREAD")
    assert _rules(spread, "infeasible-request") == []


def test_min_side_gpus_idle_is_a_warning() -> None:
    text = RS.replace(
        "minReplicas: 1\n        maxReplicas: 4", "minReplicas: 3\n        maxReplicas: 4"
    )
    [f] = _rules(text, "serve-replicas-exceed-workers")
    assert f.severity == "warning"
    assert "keep 3 GPUs at minimum" in f.message
    assert "needs only 1" in f.message


def test_unknown_cpu_is_assumed_to_fit() -> None:
    # No CPU limit/request/num-cpus on the workers: Ray auto-detects; doctor must not guess.
    text = RS.replace('                    cpu: "8"\n', "")
    assert _rules(text, "ingress-starved", "infeasible-request") == []


def test_head_with_gpu_is_schedulable() -> None:
    text = RS.replace(
        "                  memory: 8Gi\n",
        '                  memory: 8Gi\n                  nvidia.com/gpu: "1"\n',
        1,
    )
    [f] = _rules(text, "head-schedulable")
    assert "GPU 1" in f.message


def test_advertised_gpu_without_a_limit() -> None:
    text = RS.replace("rayStartParams: {}", 'rayStartParams: {num-gpus: "2"}').replace(
        '                    nvidia.com/gpu: "1"\n', ""
    )
    found = _rules(text, "advertised-vs-limit")
    assert any("requests no GPU" in f.message for f in found)


def test_pods_running_out_of_cpu_before_gpus() -> None:
    # 2 GPUs and 8 CPUs per pod, 6 CPUs per replica: one replica per pod, not two.
    text = RS.replace('nvidia.com/gpu: "1"', 'nvidia.com/gpu: "2"').replace(
        "              num_cpus: 1\n              num_gpus: 1",
        "              num_cpus: 6\n              num_gpus: 1",
    )
    text = text.replace("maxReplicas: 4", "maxReplicas: 2")
    [f] = [f for f in _rules(text, "serve-replicas-exceed-workers") if f.severity == "error"]
    assert "can place only 2" in f.message
    assert "worker group 'gpu': 1 per pod × 2 pods" in f.message
    fine = text.replace("num_cpus: 6", "num_cpus: 4")
    assert [f for f in _rules(fine, "serve-replicas-exceed-workers") if f.severity == "error"] == []
