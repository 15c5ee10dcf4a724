"""One walk over Serve applications: every reader names deployments and paths the same way."""

from __future__ import annotations

from fleetserve.k8s.doctor.loader import load_text
from fleetserve.k8s.doctor.ray_objects import serve_apps
from fleetserve.k8s.doctor.rules._capacity import serve_demands
from fleetserve.k8s.doctor.rules._engines import engine_replicas

TEXT = """apiVersion: ray.io/v1
kind: RayService
metadata: {name: svc, namespace: ns}
spec:
  serveConfigV2: |
    applications:
      - import_path: app:build
        runtime_env: {env_vars: {MODEL_ID: org/m, TENSOR_PARALLEL_SIZE: "1"}}
        deployments:
          - {ray_actor_options: {num_gpus: 1}}
          - just-a-string
          - {name: Router, ray_actor_options: {num_cpus: 0.5}}
      - name: llm
        import_path: ray.serve.llm:build_openai_app
        args:
          llm_configs:
            - model_loading_config: {model_id: m}
              engine_kwargs: {tensor_parallel_size: 2}
              deployment_config: {autoscaling_config: {min_replicas: 1, max_replicas: 2}}
      - not-an-app
  rayClusterConfig:
    headGroupSpec: {template: {spec: {containers: [{name: h, image: 'rayproject/ray:2.52.0'}]}}}
"""


def test_one_walk_names_apps_and_deployments() -> None:
    (m,) = load_text(TEXT, "x.yaml").manifests
    first, llm = serve_apps(m)
    assert first.name == "#0"
    assert [d.name for d in first.deployments] == ["#0/#0", "#0/Router"]
    assert [d.path for d in first.deployments] == [
        "spec.serveConfigV2:applications[0].deployments[0]",
        "spec.serveConfigV2:applications[0].deployments[2]",
    ]
    assert llm.is_serve_llm
    assert not first.is_serve_llm


def test_demands_and_engines_agree_on_names_and_paths() -> None:
    (m,) = load_text(TEXT, "x.yaml").manifests
    demands = {d.name: d.path for d in serve_demands(m) if d.name.startswith("#0/")}
    replicas = {r.name: r.path for r in engine_replicas(m) if r.name.startswith("#0/")}
    assert demands == replicas
    assert set(demands) == {"#0/#0", "#0/Router"}
