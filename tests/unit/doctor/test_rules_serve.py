"""Serve and vLLM rules: the numbers in the messages, the edges, and no guessing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_paths, load_text
from fleetserve.k8s.doctor.registry import run_rules
from fleetserve.k8s.doctor.rules._devices import pods
from fleetserve.k8s.doctor.rules._engines import engine_replicas
from fleetserve.k8s.doctor.rules.serve import ray_version_of_image

from .conftest import FIXTURES, SEEDS


def _run(rule_id: str, text: str) -> list[Finding]:
    return [f for f in run_rules(load_text(textwrap.dedent(text)), {rule_id}) if f.rule == rule_id]


def _fixture(rule_id: str, name: str) -> list[Finding]:
    inv = load_paths([FIXTURES / rule_id / name])
    return [f for f in run_rules(inv, {rule_id}) if f.rule == rule_id]


_CLUSTER = """  rayClusterConfig:
    rayVersion: '{ray}'
    enableInTreeAutoscaling: true
    headGroupSpec:
      rayStartParams:
        num-cpus: "0"
      template:
        spec:
          containers:
            - name: ray-head
              image: rayproject/ray:{ray}-py311
    workerGroupSpecs:
"""


def _rayservice(serve: str, workers: str, ray: str = "2.60.0") -> str:
    head = "apiVersion: ray.io/v1\nkind: RayService\nmetadata:\n  name: svc\n  namespace: ns\n"
    return (
        head
        + "spec:\n  serveConfigV2: |\n"
        + textwrap.indent(textwrap.dedent(serve).strip("\n"), "    ")
        + "\n"
        + _CLUSTER.format(ray=ray)
        + textwrap.indent(workers, "      ")
        + "\n"
    )


def _worker(gpus: int = 1, env: str = "", selector: str = "") -> str:
    lines = [
        "- groupName: gpu",
        "  minReplicas: 1",
        "  maxReplicas: 4",
        "  rayStartParams: {}",
        "  template:",
        "    spec:",
        "      containers:",
        "        - name: ray-worker",
        "          image: rayproject/ray:2.60.0-py311-cu128",
    ]
    if env:
        lines.append("          env:")
        lines += ["            " + x for x in textwrap.dedent(env).strip("\n").splitlines()]
    lines += [
        "          resources:",
        "            limits:",
        "              cpu: 8",
        "              memory: 32Gi",
        f"              nvidia.com/gpu: {gpus}",
    ]
    if selector:
        lines += ["      nodeSelector:", f"        {selector}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------- engines view


def test_engine_view_reads_env_args_and_serve_llm() -> None:
    inv = load_paths([FIXTURES / "max-num-batched-tokens" / "trigger.yaml"])
    (r,) = engine_replicas(inv.manifests[0])
    assert r.engine["model"] == "mistralai/Mistral-7B-Instruct-v0.2"
    assert r.engine["max_num_seqs"] == 4  # MAX_NUM_SEQ, seed 002's spelling
    assert r.engine["gpu_memory_utilization"] == 0.9
    assert r.num_gpus == 1
    assert r.engine_paths["max_num_seqs"].endswith("runtime_env.env_vars.MAX_NUM_SEQ")

    inv = load_paths([FIXTURES / "tp-gpus-mismatch" / "near_miss_serve_llm.yaml"])
    (r,) = engine_replicas(inv.manifests[0])
    assert r.serve_llm
    assert r.engine["tensor_parallel_size"] == 4
    assert r.bundles == [{"GPU": 1.0}] * 4  # Serve LLM: one bundle per TP rank


def test_finding_line_points_inside_serve_config() -> None:
    (f,) = _fixture("tp-gpus-mismatch", "trigger.yaml")
    assert f.file is not None
    assert f.line is not None
    line = Path(f.file).read_text(encoding="utf-8").splitlines()[f.line - 1]
    assert line.strip() == 'TENSOR_PARALLEL_SIZE: "4"'


# --------------------------------------------------------------------------- deprecated


def test_deprecated_fields_name_the_values_that_really_apply() -> None:
    found = {
        f.path.rsplit(".", 1)[-1]: f for f in _fixture("deprecated-serve-field", "trigger.yaml")
    }
    target = found["target_num_ongoing_requests_per_replica"]
    assert "targets 2 ongoing requests per replica (Ray's default), not 20" in target.message
    assert "target_ongoing_requests: 20" in target.fix
    queries = found["max_concurrent_queries"]
    assert "max_ongoing_requests = 5 (Ray's default), not 100" in queries.message
    assert "max_ongoing_requests: 100" in queries.fix


def test_deprecated_field_with_new_name_present_reports_the_new_value() -> None:
    found = _run(
        "deprecated-serve-field",
        _rayservice(
            """
            applications:
              - name: a
                import_path: app:app
                deployments:
                  - name: D
                    max_concurrent_queries: 100
                    max_ongoing_requests: 32
                    ray_actor_options: {num_gpus: 1}
            """,
            _worker(),
        ),
    )
    (f,) = found
    assert "max_ongoing_requests = 32, not 100" in f.message


def test_seed_002_original_has_both_removed_fields() -> None:
    inv = load_paths([SEEDS / "seed002" / "original"])
    found = run_rules(inv, {"deprecated-serve-field"})
    assert sorted(f.path.rsplit(".", 1)[-1] for f in found) == [
        "max_concurrent_queries",
        "target_num_ongoing_requests_per_replica",
    ]


# --------------------------------------------------------------------------- TP


def test_tp_mismatch_says_which_way() -> None:
    (fewer,) = _fixture("tp-gpus-mismatch", "trigger.yaml")
    assert "tensor_parallel_size 4 = 4 GPUs but Ray gives it 2 GPUs" in fewer.message
    assert "NCCL init hangs" in fewer.message
    (more,) = _fixture("tp-gpus-mismatch", "trigger_bundles.yaml")
    assert "4 GPU bundles" in more.message
    assert "2 of the 4 GPUs sit idle" in more.message


def test_tp_in_code_only_is_not_guessed() -> None:
    # Seed 004 writes num_gpus: 4 in the config and tensor_parallel_size=4 in llm_app.py:
    # the config alone says nothing about TP, so there is no finding.
    inv = load_paths([SEEDS / "seed004" / "rayservice-llama3-70b.yaml"])
    assert not run_rules(inv, {"tp-gpus-mismatch"})


def test_fractional_gpu_with_tp_is_a_mismatch() -> None:
    (f,) = _run(
        "tp-gpus-mismatch",
        _rayservice(
            """
            applications:
              - name: a
                import_path: app:app
                args: {model: Qwen/Qwen2.5-7B-Instruct, tensor_parallel_size: 2}
                deployments:
                  - name: D
                    ray_actor_options: {num_gpus: 0.5}
            """,
            _worker(gpus=2),
        ),
    )
    assert "a fraction of a card" in f.message


def test_tp_across_pods_is_fine_with_ray_executor() -> None:
    serve = """
        applications:
          - name: a
            import_path: app:app
            args:
              model: meta-llama/Llama-3.1-70B-Instruct
              tensor_parallel_size: 4
              distributed_executor_backend: {backend}
            deployments:
              - name: D
                ray_actor_options: {{num_cpus: 1}}
        """
    assert not _run("tp-gpus-mismatch", _rayservice(serve.format(backend="ray"), _worker()))
    (f,) = _run("tp-gpus-mismatch", _rayservice(serve.format(backend="mp"), _worker()))
    assert "largest: worker group 'gpu', 1 GPU per pod" in f.message


# --------------------------------------------------------------------------- ports


def test_vllm_port_on_serve_port_names_the_owner() -> None:
    (f,) = _fixture("vllm-port-conflict", "trigger.yaml")
    assert "VLLM_PORT=8000" in f.message
    assert "Ray Serve's HTTP proxy" in f.message


def test_vllm_port_shared_pod_counts_replicas() -> None:
    (f,) = _fixture("vllm-port-conflict", "trigger_shared_pod.yaml")
    assert "holds up to 4 vLLM replicas" in f.message


def test_vllm_port_follows_custom_http_port() -> None:
    serve = """
        http_options:
          port: 9000
        applications:
          - name: a
            import_path: app:app
            runtime_env:
              env_vars: {{MODEL_ID: Qwen/Qwen2.5-7B-Instruct, VLLM_PORT: "{port}"}}
            deployments:
              - name: D
                ray_actor_options: {{num_gpus: 1}}
        """
    (f,) = _run("vllm-port-conflict", _rayservice(serve.format(port=9000), _worker()))
    assert "VLLM_PORT=9000" in f.message
    assert not _run("vllm-port-conflict", _rayservice(serve.format(port=8000), _worker()))


def test_service_link_needs_a_service_named_vllm() -> None:
    found = _fixture("vllm-port-conflict", "trigger_service_link.yaml")
    assert [f.path for f in found] == [
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0]"
    ]
    assert "appears to be a URI" in found[0].message


# --------------------------------------------------------------------------- rayVersion


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("rayproject/ray:2.35.0-py311-cu121", "2.35.0"),
        ("rayproject/ray-ml:2.9.3", "2.9.3"),
        ("rayproject/ray-llm:2.60.0-py311-cu128", "2.60.0"),
        ("docker.io/anyscale/ray:2.44.1-slim", "2.44.1"),
        ("public.ecr.aws/data-on-eks/ray2.24.0-py310-vllm-gpu:v1", "2.24.0"),
        ("rayproject/ray:2.35.0@sha256:abcd", "2.35.0"),
        ("rayproject/ray:nightly-py311", None),
        ("vllm/vllm-openai:v0.6.3", None),
        ("harbor.internal/llm/serve:1.4.2", None),
        ("rayproject/ray", None),
    ],
)
def test_ray_version_of_image(image: str, version: str | None) -> None:
    assert ray_version_of_image(image) == version


def test_rayversion_mismatch_message() -> None:
    found = _fixture("rayversion-image-mismatch", "trigger.yaml")
    assert len(found) == 2  # head and worker
    assert "rayVersion is 2.24.0 but the head group runs rayproject/ray:2.35.0-py311" in (
        found[0].message
    )
    assert "rayVersion: '2.35.0'" in found[0].fix


# --------------------------------------------------------------------------- memory


def test_kv_cache_message_has_the_arithmetic() -> None:
    (f,) = _fixture("kv-cache-too-small", "trigger.yaml")
    assert "gpu_memory_utilization 0.9 of a 23034 MiB card" in f.message
    assert "instance-gpu-name in ['l4']" in f.message
    assert "gives each rank 20.24 GiB" in f.message
    assert "weights take 14.99 GiB" in f.message
    assert "one 131072-token sequence needs 16.00 GiB" in f.message


def test_kv_cache_inside_hami_slice_uses_the_slice() -> None:
    (f,) = _fixture("kv-cache-too-small", "trigger_hami_whole_card_fraction.yaml")
    assert "gpu_memory_utilization 0.25 of the 20000 MiB HAMi slice" in f.message
    assert "gives each rank 4.88 GiB" in f.message


def test_kv_cache_silent_without_card_facts() -> None:
    serve = """
        applications:
          - name: a
            import_path: app:app
            args: {model: meta-llama/Llama-3.1-8B-Instruct, max_model_len: 131072}
            deployments:
              - name: D
                ray_actor_options: {num_gpus: 1}
        """
    # Unknown card (no selector): silent. A 24 GB card named by GFD: reported.
    assert not _run("kv-cache-too-small", _rayservice(serve, _worker()))
    found = _run(
        "kv-cache-too-small",
        _rayservice(serve, _worker(selector="nvidia.com/gpu.product: NVIDIA-A10G")),
    )
    assert found
    assert "23028 MiB card" in found[0].message


def test_kv_cache_uses_the_largest_card_of_an_ambiguous_pool() -> None:
    serve = """
        applications:
          - name: a
            import_path: app:app
            args: {model: meta-llama/Llama-3.1-8B-Instruct, max_model_len: 131072}
            deployments:
              - name: D
                ray_actor_options: {num_gpus: 1}
        """
    # 'a100' is p4d's 40 GB or p4de's 80 GB card: 0.9 x 80 GB holds 32 GiB, so no finding.
    assert not _run(
        "kv-cache-too-small",
        _rayservice(serve, _worker(selector="karpenter.k8s.aws/instance-gpu-name: a100")),
    )


def test_fractional_replicas_default_utilization() -> None:
    (f,) = _fixture("gpu-memory-utilization-exceeds-slice", "trigger_default_util.yaml")
    assert "holds 0.25 of a GPU, so Ray packs up to 4 replicas on one card" in f.message
    assert "0.92 (vLLM's default)" in f.message
    assert "<= 0.25" in f.fix


def test_fractional_gpu_without_vllm_evidence_is_silent() -> None:
    serve = """
        applications:
          - name: a
            import_path: embedder:app
            deployments:
              - name: D
                ray_actor_options: {num_gpus: 0.5}
        """
    assert not _run("gpu-memory-utilization-exceeds-slice", _rayservice(serve, _worker()))


# --------------------------------------------------------------------------- batching


def test_max_num_seqs_vs_autoscaling_target() -> None:
    (f,) = _fixture("max-num-batched-tokens", "trigger.yaml")
    assert "max_num_seqs 4" in f.message
    assert "keep 20 requests per replica" in f.message
    assert "16 of them wait" in f.message


def test_chunked_prefill_default_on_allows_small_batches() -> None:
    serve = """
        applications:
          - name: a
            import_path: app:app
            args:
              model: meta-llama/Llama-3.1-8B-Instruct
              max_model_len: 8192
              max_num_batched_tokens: 2048
              {extra}
            deployments:
              - name: D
                ray_actor_options: {{num_gpus: 1}}
        """
    assert not _run("max-num-batched-tokens", _rayservice(serve.format(extra=""), _worker()))
    (f,) = _run(
        "max-num-batched-tokens",
        _rayservice(serve.format(extra="enable_chunked_prefill: false"), _worker()),
    )
    assert "max_num_batched_tokens 2048 < max_model_len 8192" in f.message


# --------------------------------------------------------------------------- vllm serve pods


def test_vllm_server_pod_tp_against_its_gpus() -> None:
    (f,) = _fixture("tp-gpus-mismatch", "trigger_vllm_server.yaml")
    assert "= 4 ranks but the container gets nvidia.com/gpu: 2" in f.message
    assert f.path.endswith("args[3]")  # the value after --tensor-parallel-size


def test_vllm_server_pod_kv_cache_on_an_instance_type() -> None:
    (f,) = _fixture("kv-cache-too-small", "trigger_vllm_server.yaml")
    assert "0.92 of a 23034 MiB card" in f.message  # vLLM's default utilization, g6 = L4
    assert "instance-type in ['g6.2xlarge']" in f.message


def test_vllm_server_pod_without_chunked_prefill() -> None:
    (f,) = _fixture("max-num-batched-tokens", "trigger_vllm_server.yaml")
    assert "max_num_batched_tokens 8192 < max_model_len 32768" in f.message


def test_unset_max_model_len_is_vllms_default_only_for_complete_args() -> None:
    # Ray Serve LLM's engine_kwargs are the whole engine: vLLM takes the model's own context
    # (131072 for Llama 3.1), which does not fit an L4.
    serve_llm = """
        applications:
          - name: llm
            import_path: ray.serve.llm:build_openai_app
            args:
              llm_configs:
                - model_loading_config:
                    model_id: chat
                    model_source: meta-llama/Llama-3.1-8B-Instruct
                  engine_kwargs:
                    gpu_memory_utilization: 0.9
        """
    l4 = "karpenter.k8s.aws/instance-gpu-name: l4"
    (f,) = _run("kv-cache-too-small", _rayservice(serve_llm, _worker(selector=l4)))
    assert "max_model_len 131072 - vLLM's default, the model's context" in f.message
    # An app reading MODEL_ID from env may set max_model_len in its code: unknown, silent.
    env_app = """
        applications:
          - name: a
            import_path: app:app
            runtime_env:
              env_vars: {MODEL_ID: meta-llama/Llama-3.1-8B-Instruct}
            deployments:
              - name: D
                ray_actor_options: {num_gpus: 1}
        """
    assert not _run("kv-cache-too-small", _rayservice(env_app, _worker(selector=l4)))


def test_a_leaderworkerset_names_its_two_templates() -> None:
    # tests/fixtures/doctor/tp-gpus-mismatch/near_miss_lws.yaml (kubernetes-sigs/lws' vLLM
    # example): messages say which template, not "pod template, pod template".
    inv = load_paths([FIXTURES / "tp-gpus-mismatch" / "near_miss_lws.yaml"])
    assert [(p.label, p.hosts) for p in pods(inv)] == [
        ("leader template", 2),
        ("worker template", 1),
    ]


# --------------------------------------------------------------------------- eager engines


def test_an_eager_gpu_engine_is_told_what_it_costs_and_how_to_keep_memory_small() -> None:
    (f,) = _fixture("enforce-eager", "trigger.yaml")
    assert f.path.endswith("args[4]")  # the --enforce-eager word itself
    assert "one CPU core, not the GPU, sets the token rate" in f.message
    assert "max_cudagraph_capture_size" in f.fix
    (f,) = _fixture("enforce-eager", "trigger_serve.yaml")
    assert f.path.endswith("args.enforce_eager")
    assert f.message.startswith("Serve replica 'chat/VLLMDeployment' runs on a GPU")


# --------------------------------------------------------------------------- admission


_ADMIT = """
    applications:
      - name: a
        import_path: vllm_app:app
        args:
          model: meta-llama/Llama-3.1-8B-Instruct
          {seqs}
        deployments:
          - name: D
            {cap}
            ray_actor_options: {{num_gpus: 1}}
    """


def _admit(cap: str = "", seqs: str = "", ray: str = "2.60.0") -> list[Finding]:
    serve = _ADMIT.format(cap=cap or "num_replicas: 1", seqs=seqs or "max_model_len: 8192")
    return _run("serve-admits-below-batch", _rayservice(serve, _worker(), ray=ray))


def test_rays_default_cap_against_an_unwritten_batch() -> None:
    # Ray 2.32+: 5 per replica; vLLM's smallest default batch is 128. The config writes no
    # cap, and the app's @serve.deployment may: info, worded as a condition.
    (f,) = _admit()
    assert f.severity == "info"
    assert "unless the app's @serve.deployment sets one" in f.message
    assert "admits 5 requests at once (Ray's default on Ray 2.60.0" in f.message
    assert "at least 128 sequences at once (vLLM's smallest default max_num_seqs)" in f.message
    assert "3 % of its batch" in f.message
    assert "at least 128; 256 also keeps a batch waiting" in f.fix


def test_the_default_cap_follows_the_ray_version() -> None:
    # Before Ray 2.32 the default was 100: under a batch of 128, over a batch of 64.
    (f,) = _admit(ray="2.20.0")
    assert "admits 100 requests at once (Ray's default on Ray 2.20.0" in f.message
    assert not _admit(seqs="max_num_seqs: 64", ray="2.20.0")


def test_a_written_cap_is_a_warning_cited_where_it_is_written() -> None:
    (f,) = _admit(cap="max_ongoing_requests: 32", seqs="max_num_seqs: 64")
    assert f.severity == "warning"
    assert "(max_ongoing_requests: 32)" in f.message
    assert "up to 64 sequences at once (max_num_seqs)" in f.message
    assert f.path.endswith("deployments[0].max_ongoing_requests")
    # one batch admitted is enough for this rule (fleetserve admits two by default)
    assert not _admit(cap="max_ongoing_requests: 64", seqs="max_num_seqs: 64")


def test_the_old_name_counts_only_where_ray_reads_it() -> None:
    # Ray 2.9 reads only max_concurrent_queries; 2.33 and later drop it (Ray's default 5).
    assert not _admit(cap="max_concurrent_queries: 200", ray="2.9.3")
    (f,) = _admit(cap="max_concurrent_queries: 200", ray="2.40.0")
    assert "admits 5 requests at once (Ray's default on Ray 2.40.0" in f.message


def test_a_model_name_alone_does_not_make_a_replica_vllm() -> None:
    # A transformers-neuronx or diffusers app reads MODEL_ID too (AI-on-EKS's inf2
    # blueprints); "vllm" in the app's import path, or an argument only vLLM takes, does.
    serve = """
        applications:
          - name: sd
            import_path: ray_serve_stablediffusion:entrypoint
            runtime_env:
              env_vars: {{MODEL_ID: stabilityai/stable-diffusion-2{extra}}}
            deployments:
              - name: D
                ray_actor_options: {{num_gpus: 1}}
        """
    rule = "serve-admits-below-batch"
    assert not _run(rule, _rayservice(serve.format(extra=""), _worker()))
    (f,) = _run(rule, _rayservice(serve.format(extra=", GPU_MEMORY_UTILIZATION: '0.9'"), _worker()))
    assert f.severity == "info"
    vllm_app = serve.replace("ray_serve_stablediffusion", "vllm_serve").format(extra="")
    assert _run(rule, _rayservice(vllm_app, _worker()))


def test_fleetserves_own_rendered_app_with_a_cap_below_its_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fleet spec may set replicas.max_ongoing_requests below max_num_seqs (fleetserve keeps
    # what the user writes); its rendered RayService is where doctor sees both numbers.
    import yaml  # noqa: PLC0415

    from fleetserve.cli import main  # noqa: PLC0415
    from fleetserve.k8s.doctor.command import diagnose  # noqa: PLC0415

    spec = yaml.safe_load(
        (Path(__file__).parents[3] / "examples/k8s/whole-gpu-tp.yaml").read_text()
    )
    spec["models"] = spec["models"][:1]  # the 7B: max_ongoing_requests 100
    spec["models"][0]["max_num_seqs"] = 128
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["render", str(path), "-o", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    found = [
        f
        for f in diagnose([str(tmp_path / "out")]).findings
        if f.rule == "serve-admits-below-batch"
    ]
    (f,) = found
    assert f.severity == "warning"
    assert "admits 100 requests at once (max_ongoing_requests: 100)" in f.message
    assert "up to 128 sequences at once (max_num_seqs)" in f.message
