"""Issue #11 points 4 and 5: less noise, messages that say what is true.

Each case is a trigger and a near miss written for this test (shapes of real manifests:
KubeRay samples, blueprints with monitors of other namespaces, templated names).
"""

from __future__ import annotations

import textwrap

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, is_template
from fleetserve.k8s.doctor.loader import load_python_text, load_text
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import FIXTURES


def _run(text: str, *rules: str) -> list[Finding]:
    found = run_rules(load_text(textwrap.dedent(text), "x.yaml"), set(rules))
    return [f for f in found if f.rule in rules]


def _ray(
    kind: str = "RayService",
    name: str = "svc",
    ns: str = "serve",
    extra_spec: str = "",
    head_extra: str = "",
    worker: str = "",
    ray: str = "2.52.0",
) -> str:
    """A small Ray object; ``extra_spec``/``head_extra`` are indented into the cluster spec /
    head group, ``worker`` is a whole workerGroupSpecs item."""
    inner = {"RayService": "rayClusterConfig", "RayJob": "rayClusterSpec"}.get(kind)
    ind = "    " if inner else "  "
    serve = (
        "  serveConfigV2: |\n    applications:\n      - name: a\n        import_path: app:b\n"
        "        deployments: [{name: D, num_replicas: 1, ray_actor_options: {num_gpus: 1}}]\n"
        if kind == "RayService"
        else ""
    )
    job = "  entrypoint: python train.py\n" if kind == "RayJob" else ""
    out = (
        f"---\napiVersion: ray.io/v1\nkind: {kind}\nmetadata: {{name: '{name}', namespace: {ns}}}\n"
        f"spec:\n{serve}{job}"
        + (f"  {inner}:\n" if inner else "")
        + f"{ind}rayVersion: '{ray}'\n"
        + textwrap.indent(textwrap.dedent(extra_spec).strip("\n"), ind)
        + ("\n" if extra_spec else "")
        + f"{ind}headGroupSpec:\n{ind}  rayStartParams: {{num-cpus: '0'}}\n"
        + textwrap.indent(textwrap.dedent(head_extra).strip("\n"), ind + "  ")
        + ("\n" if head_extra else "")
        + f"{ind}  template:\n{ind}    spec:\n{ind}      containers:\n"
        f"{ind}        - {{name: head, image: 'rayproject/ray:{ray}'}}\n"
        f"{ind}workerGroupSpecs:\n"
    )
    item = worker or (
        "- groupName: gpu\n  replicas: 1\n  minReplicas: 1\n  maxReplicas: 2\n"
        "  rayStartParams: {}\n  template:\n    spec:\n      containers:\n"
        f"        - name: w\n          image: rayproject/ray:{ray}\n"
        "          resources: {limits: {cpu: '8', memory: 32Gi, nvidia.com/gpu: '1'}}\n"
    )
    return out + textwrap.indent(item, ind + "  ")


VLLM = """---
apiVersion: apps/v1
kind: Deployment
metadata: {name: llm, namespace: serve}
spec:
  template:
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.10.1
          args: [--model, org/m]
"""


# ------------------------------------------------------------------ no-network-policy


def test_network_policy_once_per_namespace_naming_every_open_workload() -> None:
    text = _ray(name="a") + _ray(name="b") + VLLM + _ray(name="c", ns="other")
    found = _run(text, "no-network-policy")
    assert len(found) == 2
    serve = next(f for f in found if "'serve'" in f.message)
    for ref in ("RayService/serve/a", "RayService/serve/b", "Deployment/serve/llm"):
        assert ref in serve.message
    assert "bypassing your gateway" in serve.message


def test_network_policy_ignores_batch_work() -> None:
    serve_port = _ray(kind="RayCluster", name="dev").replace(
        "{name: head, image: 'rayproject/ray:2.52.0'}",
        "{name: head, image: 'rayproject/ray:2.52.0', ports: [{name: serve, containerPort: 8000}]}",
    )
    text = _ray(kind="RayJob", name="train") + serve_port
    assert _run(text, "no-network-policy") == []


def test_network_policy_lists_at_most_five_workloads() -> None:
    text = "".join(_ray(name=f"s{i}") for i in range(7))
    (f,) = _run(text, "no-network-policy")
    assert "; and 2 more" in f.message


def test_kuberay_network_policy_counts() -> None:
    deny = _ray(extra_spec="networkPolicy: {mode: DenyAllIngress}")
    assert _run(deny, "no-network-policy") == []
    default_mode = _ray(extra_spec="networkPolicy: {}")  # CRD default: DenyAll
    assert _run(default_mode, "no-network-policy") == []
    (f,) = _run(_ray(extra_spec="networkPolicy: {mode: DenyAllEgress}"), "no-network-policy")
    assert "restricts egress only" in f.message
    gate_off = deny + "---\nfeatureGates: [{name: RayClusterStatusConditions, enabled: true}]\n"
    gate_off += "operatorCommand: /manager\n"
    (f,) = _run(gate_off, "no-network-policy")
    assert "RayClusterNetworkPolicy feature gate off" in f.message
    gate_on = deny + (
        "---\nfeatureGates: [{name: RayClusterNetworkPolicy, enabled: true}]\n"
        "operatorCommand: /manager\n"
    )
    assert _run(gate_on, "no-network-policy") == []
    operator = (
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: kuberay-operator, "
        "namespace: kuberay}}\nspec:\n  template:\n    spec:\n      containers:\n"
        "        - {{name: op, image: 'quay.io/kuberay/operator:v{v}'}}\n"
    )
    (f,) = _run(deny + operator.format(v="1.6.0"), "no-network-policy")
    assert "older than 1.7 where the field appeared" in f.message
    assert _run(deny + operator.format(v="1.7.0"), "no-network-policy") == []
    assert _run(deny + operator.format(v="1.8.1"), "no-network-policy") == []


# ------------------------------------------------------------------ worker-metrics-podmonitor


def _monitor(ns: str, selector: str = "") -> str:
    return (
        f"---\napiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n"
        f"metadata: {{name: m, namespace: {ns}, labels: {{release: kube-prometheus-stack}}}}\n"
        f"spec:\n  selector: {{matchLabels: {{app: other}}}}\n"
        + (f"  namespaceSelector: {selector}\n" if selector else "")
        + "  endpoints: [{port: metrics}]\n"
    )


def test_monitors_of_other_namespaces_do_not_count() -> None:
    svc = _ray()
    assert _run(svc + _monitor("other"), "worker-metrics-podmonitor") == []
    assert (
        _run(svc + _monitor("other", "{matchNames: [elsewhere]}"), "worker-metrics-podmonitor")
        == []
    )
    (f,) = _run(svc + _monitor("other", "{any: true}"), "worker-metrics-podmonitor")
    assert "ServiceMonitor/other/m" in f.message
    (f,) = _run(svc + _monitor("other", "{matchNames: [serve]}"), "worker-metrics-podmonitor")
    assert len(_run(svc + _monitor("serve"), "worker-metrics-podmonitor")) == 1


# ------------------------------------------------------------------ templated names


def test_templated_names_are_not_judged() -> None:
    for name in (
        "${JOB_ID}-fine-tune-llama-3-70b-with-a-really-long-suffix",
        "$NAMESPACE-raycluster-for-the-whole-team-and-its-long-name",
        "{{ .Release.Name }}-raycluster",
        '{{ include "chart.fullname" . }}',
    ):
        assert is_template(name)
        assert _run(_ray(kind="RayJob", name=name), "name-too-long") == [], name
    (f,) = _run(
        _ray(kind="RayJob", name="fine-tune-llama-3-70b-with-a-really-long-suffix-v2"),
        "name-too-long",
    )
    assert f.severity == "error"
    assert not is_template("rayjob-sample")


def test_generate_name_is_named_in_reports() -> None:
    text = _ray(kind="RayJob", name="x").replace(
        "metadata: {name: 'x', ", "metadata: {generateName: train-, "
    )
    text = text.replace(
        "entrypoint: python train.py", "entrypoint: python train.py\n  entrypointNumGpus: 4"
    )
    (m,) = load_text(text, "x.yaml").manifests
    assert m.ref == "RayJob/serve/train-*"
    (f,) = _run(text, "infeasible-request")
    assert f.object == "RayJob/serve/train-*"


# ------------------------------------------------------------------ messages


def test_gpu_from_group_resources_names_that_path() -> None:
    worker = (
        "- groupName: gpu\n  replicas: 1\n  minReplicas: 1\n  maxReplicas: 1\n"
        "  rayStartParams: {}\n  resources: {GPU: '1'}\n  template:\n    spec:\n      containers:\n"
        "        - {name: w, image: 'rayproject/ray:2.52.0', resources: {limits: {cpu: '4'}}}\n"
    )
    (f,) = _run(_ray(worker=worker), "advertised-vs-limit")
    assert f.path.endswith("workerGroupSpecs[0].resources.GPU")
    assert "rayStartParams" not in f.path
    assert "drop resources.GPU" in f.fix


def test_node_selector_fix_proposes_a_gpu_pool_for_a_gpu_group() -> None:
    pools = """---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: cpu}
spec:
  template:
    metadata: {labels: {workload: cpu-pool}}
    spec: {requirements: []}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: gpu}
spec:
  template:
    metadata: {labels: {workload: gpu-pool}}
    spec:
      requirements: []
      taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
"""
    worker = (
        "- groupName: gpu\n  replicas: 1\n  minReplicas: 1\n  maxReplicas: 1\n"
        "  rayStartParams: {}\n  template:\n    spec:\n      nodeSelector: {workload: a100}\n"
        "      tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n      containers:\n"
        "        - name: w\n          image: rayproject/ray:2.52.0\n"
        "          resources: {limits: {cpu: '8', nvidia.com/gpu: '1'}}\n"
    )
    (f,) = _run(pools + _ray(worker=worker), "node-selector-no-pool")
    assert "workload: gpu-pool" in f.fix
    assert "cpu-pool" not in f.fix
    assert "karpenter.sh/nodepool: gpu" in f.fix


def test_dashboard_with_token_auth_says_who_can_reach_it() -> None:
    head = "serviceType: LoadBalancer"
    (plain,) = _run(_ray(head_extra=head), "dashboard-exposed")
    assert plain.severity == "error"
    assert "Ray has no authentication unless RAY_AUTH_MODE=token" in plain.message
    (auth,) = _run(
        _ray(head_extra=head, extra_spec="authOptions: {mode: token}"), "dashboard-exposed"
    )
    assert auth.severity == "warning"
    assert (
        "token authentication is on (authOptions.mode: token on Ray 2.52.0 (rayVersion))"
        in auth.message
    )
    assert "Ray has no authentication" not in auth.message
    (old,) = _run(
        _ray(head_extra=head, extra_spec="authOptions: {mode: token}", ray="2.41.0"),
        "dashboard-exposed",
    )
    assert old.severity == "error"
    assert "Ray 2.41.0 (rayVersion) predates Ray's token authentication" in old.message
    env = _ray(head_extra=head).replace(
        "{name: head, image: 'rayproject/ray:2.52.0'}",
        "{name: head, image: 'rayproject/ray:2.52.0', env: [{name: RAY_AUTH_MODE, value: token}]}",
    )
    (by_env,) = _run(env, "dashboard-exposed")
    assert by_env.severity == "warning"
    assert "RAY_AUTH_MODE=token in the head's env" in by_env.message


def _lb(annotations: str) -> str:
    return f"""---
apiVersion: v1
kind: Service
metadata:
  name: dash
  namespace: serve
  annotations: {annotations}
spec:
  type: LoadBalancer
  selector: {{ray.io/node-type: head}}
  ports: [{{name: dashboard, port: 8265}}]
"""


def test_internal_load_balancer_is_vpc_reachable_not_internet() -> None:
    (public,) = _run(_lb("{}"), "dashboard-exposed")
    assert public.severity == "error"
    assert "internet-facing load balancer" in public.message
    for ann in (
        "{service.beta.kubernetes.io/aws-load-balancer-scheme: internal}",
        "{service.beta.kubernetes.io/aws-load-balancer-internal: 'true'}",
        "{networking.gke.io/load-balancer-type: Internal}",
        "{service.beta.kubernetes.io/azure-load-balancer-internal: 'true'}",
    ):
        (f,) = _run(_lb(ann), "dashboard-exposed")
        assert f.severity == "warning", ann
        assert "from inside the VPC/VNet" in f.message
        assert "not from the internet" in f.message


def _gpu_service(gpus_per_pod: int, min_pods: int, min_replicas: int) -> str:
    worker = (
        f"- groupName: gpu\n  replicas: {min_pods}\n  minReplicas: {min_pods}\n  maxReplicas: 4\n"
        "  rayStartParams: {}\n  template:\n    spec:\n      containers:\n"
        "        - name: w\n          image: rayproject/ray:2.52.0\n"
        "          resources: {limits: {cpu: '32', memory: 256Gi, "
        f"nvidia.com/gpu: '{gpus_per_pod}'}}}}\n"
    )
    text = _ray(worker=worker, extra_spec="enableInTreeAutoscaling: true")
    return text.replace(
        "[{name: D, num_replicas: 1, ray_actor_options: {num_gpus: 1}}]",
        f"[{{name: D, autoscaling_config: {{min_replicas: {min_replicas}, max_replicas: 4}}, "
        "ray_actor_options: {num_gpus: 1}}]",
    )


def test_idle_gpu_advice_is_actionable_when_the_pod_is_the_unit() -> None:
    (f,) = _run(
        _gpu_service(gpus_per_pod=8, min_pods=1, min_replicas=1), "serve-replicas-exceed-workers"
    )
    assert f.severity == "warning"
    assert "The pod is the unit" in f.fix
    assert "lowering minReplicas frees nothing" in f.fix
    assert "up to 8 replica(s)" in f.fix
    (f,) = _run(
        _gpu_service(gpus_per_pod=1, min_pods=3, min_replicas=1), "serve-replicas-exceed-workers"
    )
    assert f.fix.startswith("Set minReplicas of the worker group 'gpu' to 1")
    assert (
        _run(
            _gpu_service(gpus_per_pod=1, min_pods=1, min_replicas=1),
            "serve-replicas-exceed-workers",
        )
        == []
    )


def test_num_workers_from_the_rayjob_runtime_env() -> None:
    script = (FIXTURES / "train-coordinator-cpu" / "trigger" / "train.py").read_text(
        encoding="utf-8"
    )
    script = "import os\n" + script.replace(
        "num_workers=4", 'num_workers=int(os.environ["WORKERS"])'
    )
    cluster = (FIXTURES / "train-coordinator-cpu" / "trigger" / "raycluster.yaml").read_text(
        encoding="utf-8"
    )
    job = "apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: t, namespace: ml}\nspec:\n"
    job += "  entrypoint: python train.py\n  runtimeEnvYAML: |\n    env_vars: {WORKERS: '3'}\n"
    job += "  rayClusterSpec:\n" + textwrap.indent(cluster.split("spec:\n", 1)[1], "  ")
    inv = load_text(job, "j.yaml")
    py = load_python_text(script, "train.py")
    (f,) = run_rules(Inventory(inv.manifests, (), py.scaling_configs), {"train-coordinator-cpu"})
    assert "whatever num_workers (3, from WORKERS in spec.runtimeEnvYAML env_vars) is" in f.message


def test_neuron_pods_need_the_neuron_pool_toleration() -> None:
    pool = """---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: inferentia}
spec:
  template:
    metadata: {labels: {workload: inf2}}
    spec:
      requirements:
        - {key: karpenter.k8s.aws/instance-category, operator: In, values: [inf]}
      taints: [{key: aws.amazon.com/neuron, value: "true", effect: NoSchedule}]
"""
    worker = (
        "- groupName: inf2\n  replicas: 1\n  minReplicas: 1\n  maxReplicas: 1\n"
        "  rayStartParams: {}\n  template:\n    spec:\n      nodeSelector: {workload: inf2}\n"
        "{tolerations}      containers:\n"
        "        - name: w\n          image: rayproject/ray:2.52.0\n"
        "          resources: {limits: {cpu: '8', aws.amazon.com/neuron: '1'}}\n"
    )
    bare = pool + _ray(worker=worker.replace("{tolerations}", ""))
    (f,) = _run(bare, "missing-gpu-toleration")
    assert "requests accelerators" in f.message
    assert "aws.amazon.com/neuron=true:NoSchedule" in f.message
    tolerated = worker.replace(
        "{tolerations}", "      tolerations: [{key: aws.amazon.com/neuron, operator: Exists}]\n"
    )
    assert _run(pool + _ray(worker=tolerated), "missing-gpu-toleration") == []
