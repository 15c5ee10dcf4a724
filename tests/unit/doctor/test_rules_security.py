"""Security classes of 2025-26 in the vLLM stack (issue #30, item 5): raw embedding inputs
(GHSA-mrw7-hf4f-83pf) judged by the vLLM release the image names, and trust_remote_code with
a Hub model. Fixtures: tests/fixtures/doctor/prompt-embeds-enabled/ (production-stack's GIE
vLLM Deployment) and trust-remote-code-hub/ (KubeAI's DeepSeek-R1 Model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.k8s.doctor.loader import load_paths, load_text
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import FIXTURES

EMBEDS = (FIXTURES / "prompt-embeds-enabled" / "trigger.yaml").read_text(encoding="utf-8")
REMOTE = (FIXTURES / "trust-remote-code-hub" / "trigger.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("image", "severity", "advisories"),
    [
        # (image, severity, advisories the message must name)
        ("vllm/vllm-openai:v0.10.1", "warning", ()),  # before the sparse densification
        ("vllm/vllm-openai:v0.10.2", "error", ("GHSA-mrw7-hf4f-83pf", "GHSA-mcmc-2m55-j8jj")),
        ("vllm/vllm-openai:v0.11.0", "error", ("GHSA-mrw7-hf4f-83pf", "GHSA-mcmc-2m55-j8jj")),
        # 0.11.1 only turned the flag off by default: with it on, still unvalidated
        ("vllm/vllm-openai:v0.11.1", "error", ("GHSA-mcmc-2m55-j8jj",)),
        ("vllm/vllm-openai:v0.12.0", "error", ("GHSA-mcmc-2m55-j8jj", "GHSA-33cg-gxv8-3p8g")),
        ("vllm/vllm-openai:v0.13.0", "warning", ("GHSA-33cg-gxv8-3p8g",)),  # M-RoPE crash
        ("vllm/vllm-openai:v0.24.0", "warning", ()),
        ("vllm/vllm-openai:latest", "warning", ("GHSA-mrw7-hf4f-83pf", "GHSA-mcmc-2m55-j8jj")),
    ],
)
def test_prompt_embeds_by_release(image: str, severity: str, advisories: tuple[str, ...]) -> None:
    text = EMBEDS.replace("vllm/vllm-openai:v0.11.0", image)
    [f] = run_rules(load_text(text), {"prompt-embeds-enabled"})
    assert f.severity == severity
    for ghsa in advisories:
        assert ghsa in f.message
    if not advisories:
        assert "GHSA" not in f.message


@pytest.mark.parametrize(
    ("url", "found"),
    [
        ("hf://deepseek-ai/DeepSeek-R1", True),
        ("s3://models/deepseek-r1", False),  # the team's own copy
        ("pvc://models/deepseek-r1", False),
    ],
)
def test_trust_remote_code_only_for_hub_models(url: str, found: bool) -> None:
    text = REMOTE.replace("hf://deepseek-ai/DeepSeek-R1", url)
    assert bool(run_rules(load_text(text), {"trust-remote-code-hub"})) is found


def test_a_branch_revision_is_not_a_pin() -> None:
    text = REMOTE.replace("- --trust-remote-code", "- --trust-remote-code\n    - --revision=main")
    assert run_rules(load_text(text), {"trust-remote-code-hub"})


def test_an_ingress_without_auth_in_front_of_vllm() -> None:
    # tests/fixtures/doctor/vllm-exposed-without-auth/near_miss_ingress_auth without its
    # auth-url annotation: the Ingress is internet-facing and nothing asks for credentials.
    folder = FIXTURES / "vllm-exposed-without-auth" / "near_miss_ingress_auth"
    text = "\n---\n".join(
        (folder / name).read_text(encoding="utf-8") for name in ("deployment.yaml", "ingress.yaml")
    ).replace(
        'nginx.ingress.kubernetes.io/auth-url: "https://oauth2-proxy.auth.svc/oauth2/auth"', "a: b"
    )
    [f] = run_rules(load_text(text), {"vllm-exposed-without-auth"})
    assert f.severity == "error"
    assert f.object == "Ingress/default/vllm"
    assert f.path == "spec.rules[0].http.paths[0].backend.service.name"


# --------------------------------------------------------------------------- internal ports

INTERNAL = (FIXTURES / "vllm-internal-port-exposed" / "trigger.yaml").read_text(encoding="utf-8")


def test_an_exposed_kv_port_names_port_object_advisory_and_fix() -> None:
    [f] = run_rules(load_text(INTERNAL), {"vllm-internal-port-exposed"})
    assert (f.severity, f.object, f.path) == ("error", "Service/default/prefill", "spec.ports[1]")
    for part in ("port 14579", "CVE-2025-47277", "GHSA-hjq4-87xh-g4fv", "0.8.5, fixed there"):
        assert part in f.message


def test_a_fixed_release_still_exposes_an_unauthenticated_channel() -> None:
    text = INTERNAL.replace("v0.8.4", "v0.8.5")
    [f] = run_rules(load_text(text), {"vllm-internal-port-exposed"})
    assert f.severity == "error"
    assert "CVE-2025-47277, GHSA-hjq4-87xh-g4fv is fixed in vLLM 0.8.5" in f.message


def test_an_internal_load_balancer_is_a_warning() -> None:
    text = INTERNAL.replace(
        "  name: prefill\nspec:\n  type: LoadBalancer",
        "  name: prefill\n  annotations:\n    service.beta.kubernetes.io/aws-load-balancer-scheme:"
        " internal\nspec:\n  type: LoadBalancer",
    )
    [f] = run_rules(load_text(text), {"vllm-internal-port-exposed"})
    assert f.severity == "warning"


NIXL_ROUTE = """
# Shape of llm-d's decode pods (NixlConnector, VLLM_NIXL_SIDE_CHANNEL_PORT 5557) behind a
# Gateway API TCPRoute that forwards the side channel.
apiVersion: apps/v1
kind: Deployment
metadata: {name: decode, namespace: llm}
spec:
  selector: {matchLabels: {app: decode}}
  template:
    metadata: {labels: {app: decode}}
    spec:
      containers:
        - name: vllm
          image: ghcr.io/llm-d/llm-d:v0.2.0
          command: ["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8200",
                    "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
          env:
            - {name: VLLM_NIXL_SIDE_CHANNEL_PORT, value: "5557"}
          ports:
            - {name: nixl, containerPort: 5557}
---
apiVersion: v1
kind: Service
metadata: {name: decode, namespace: llm}
spec:
  selector: {app: decode}
  ports: [{name: nixl, port: 5557, targetPort: nixl}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: decode-nixl, namespace: llm}
spec:
  parentRefs: [{name: inference-gateway}]
  rules:
    - backendRefs: [{name: decode, port: 5557}]
"""


def test_a_route_to_the_nixl_side_channel() -> None:
    [f] = run_rules(load_text(NIXL_ROUTE), {"vllm-internal-port-exposed"})
    assert f.object == "TCPRoute/llm/decode-nixl"
    assert "port 5557" in f.message
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in f.message
    assert "unauthenticated and unencrypted" in f.message  # no advisory: the security guide


def test_a_disaggregated_pod_without_network_policy() -> None:
    [f] = run_rules(load_text(NIXL_ROUTE), {"vllm-multinode-exposed"})
    assert f.severity == "warning"  # NIXL: no advisory, unauthenticated by design
    assert f.path.endswith("env[0].value")  # where the side-channel port is set
    [f] = run_rules(load_text(INTERNAL), {"vllm-multinode-exposed"})
    assert f.severity == "error"
    assert "CVE-2025-47277" in f.message
    policy = """
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: prefill-peers}
spec:
  podSelector: {matchLabels: {app: prefill}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: decode}}}]}]
"""
    assert run_rules(load_text(INTERNAL + policy), {"vllm-multinode-exposed"}) == []


@pytest.mark.parametrize(
    ("flags", "port"),
    [
        (["--data-parallel-size", "4", "--data-parallel-size-local", "2"], 29550),
        (["--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"], 13345),
        (["--headless", "--data-parallel-size", "2"], 29550),
        (["--nnodes", "2", "--node-rank", "0", "--master-port", "29600"], 29600),
    ],
)
def test_data_parallel_and_multinode_ports(flags: list[str], port: int) -> None:
    kv_lines = [
        line
        for line in INTERNAL.splitlines()
        if line.startswith("            - ") and ("kv-transfer" in line or "kv_connector" in line)
    ]
    text = INTERNAL.replace(
        "\n".join(kv_lines), "\n".join(f"            - {w!r}" for w in flags)
    ).replace("{name: kv, port: 14579, targetPort: kv}", f"{{name: peer, port: {port}}}")
    [f] = run_rules(load_text(text), {"vllm-internal-port-exposed"})
    assert f"port {port}" in f.message


# --------------------------------------------------------------------------- Ray ports

RAY_GCS_SERVICE = """
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: rc}
spec:
  rayVersion: "2.46.0"
  headGroupSpec:
    rayStartParams: {}
    template:
      spec:
        containers: [{name: ray-head, image: rayproject/ray:2.46.0}]
---
apiVersion: v1
kind: Service
metadata: {name: rc-gcs}
spec:
  type: LoadBalancer
  selector: {ray.io/cluster: rc, ray.io/node-type: head}
  ports: [{name: gcs-server, port: 6379}, {name: dashboard, port: 8265}]
"""


def test_ray_gcs_and_dashboard_name_their_advisories() -> None:
    gcs, dash = run_rules(load_text(RAY_GCS_SERVICE), {"dashboard-exposed"})
    assert "port 6379 (Ray GCS)" in gcs.message
    assert "GHSA-6wgj-66m2-xxp2" in gcs.message
    assert "not fixed in any release" in gcs.message
    assert "CVE-2025-62593" in dash.message
    assert "Ray 2.46.0 (rayVersion) is affected" in dash.message
    newer = RAY_GCS_SERVICE.replace("2.46.0", "2.52.0")
    _, dash = run_rules(load_text(newer), {"dashboard-exposed"})
    assert "CVE-2025-62593" not in dash.message


def test_port_6379_of_a_plain_redis_is_not_rays() -> None:
    redis = """
apiVersion: v1
kind: Service
metadata: {name: redis}
spec:
  type: LoadBalancer
  selector: {app: redis}
  ports: [{port: 6379}]
"""
    assert run_rules(load_text(redis), {"dashboard-exposed"}) == []


# --------------------------------------------------------------------------- auth in front

AUTH = FIXTURES / "vllm-exposed-without-auth"


def _folder(name: str, drop: str = "") -> str:
    """Every document of a fixture folder, less those that contain ``drop``."""
    docs = [
        doc
        for f in sorted((AUTH / name).glob("*.yaml"))
        for doc in f.read_text(encoding="utf-8").split("\n---\n")
    ]
    return "\n---\n".join(d for d in docs if not drop or drop not in d)


def _auth_findings(text: str) -> list[str]:
    return [f.object for f in run_rules(load_text(text), {"vllm-exposed-without-auth"})]


def test_an_oauth2_proxy_sidecar_fronts_vllm() -> None:
    text = _folder("near_miss_oauth2_proxy_sidecar")
    assert _auth_findings(text) == []
    # the same Service sent to vLLM's own port instead of the sidecar's is open
    assert _auth_findings(text.replace("targetPort: auth-http", "targetPort: 8000")) == [
        "Service/default/vllm-cross-vgpu"
    ]


def test_istio_jwt_needs_the_authorization_policy() -> None:
    text = _folder("near_miss_istio")
    assert _auth_findings(text) == []
    # RequestAuthentication alone rejects bad tokens only: requests without one still pass
    alone = _folder("near_miss_istio", drop="kind: AuthorizationPolicy")
    assert _auth_findings(alone) == ["Service/default/vllm-cross-vgpu"]
    # an ALLOW policy that names no principal authenticates nobody
    open_policy = text.replace('requestPrincipals: ["*"]', 'namespaces: ["default"]')
    assert _auth_findings(open_policy) == ["Service/default/vllm-cross-vgpu"]


def test_istio_ext_authz_custom_action_and_envoy_filter() -> None:
    base = _folder("near_miss_istio", drop="security.istio.io")
    custom = """
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext-authz}
spec:
  selector: {matchLabels: {app: vllm-cross-vgpu}}
  action: CUSTOM
  provider: {name: oauth2-proxy}
  rules: [{to: [{operation: {paths: ["/v1/*"]}}]}]
"""
    assert _auth_findings(base + custom) == []
    envoy_filter = """
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: ext-authz}
spec:
  workloadSelector: {labels: {app: vllm-cross-vgpu}}
  configPatches:
    - applyTo: HTTP_FILTER
      patch:
        operation: INSERT_BEFORE
        value: {name: envoy.filters.http.ext_authz}
"""
    assert _auth_findings(base + envoy_filter) == []


def test_an_envoy_gateway_security_policy_guards_the_route() -> None:
    text = _folder("near_miss_envoy_gateway")
    assert _auth_findings(text) == []
    unguarded = _folder("near_miss_envoy_gateway", drop="kind: SecurityPolicy")
    [f] = run_rules(load_text(unguarded), {"vllm-exposed-without-auth"})
    assert f.object == "HTTPRoute/default/vllm"
    assert f.severity == "error"  # class eg-external: the internet


def test_a_route_through_an_unknown_gateway_is_a_warning() -> None:
    text = _folder("trigger_httproute_pool").replace("gke-l7-regional-external-managed", "istio")
    [f] = run_rules(load_text(text), {"vllm-exposed-without-auth"})
    assert f.severity == "warning"
    assert "InferencePool/default/vllm-qwen" in f.message


@pytest.mark.parametrize(
    "annotation",
    [
        'nginx.ingress.kubernetes.io/auth-url: "https://oauth2-proxy.auth.svc/oauth2/auth"',
        "nginx.ingress.kubernetes.io/auth-type: basic",
        "alb.ingress.kubernetes.io/auth-type: oidc",
    ],
)
def test_ingress_auth_annotations(annotation: str) -> None:
    folder = AUTH / "near_miss_ingress_auth"
    text = "\n---\n".join(
        (folder / name).read_text(encoding="utf-8") for name in ("deployment.yaml", "ingress.yaml")
    ).replace(
        'nginx.ingress.kubernetes.io/auth-url: "https://oauth2-proxy.auth.svc/oauth2/auth"',
        annotation,
    )
    assert _auth_findings(text) == []


LWS = (FIXTURES / "vllm-multinode-exposed" / "trigger.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("image", "env", "severity"),
    [
        ("v0.7.3", "", "error"),  # V0 by default: CVE-2025-30165 and CVE-2025-30202
        ("v0.8.4", "", "error"),  # CVE-2025-30202 (fixed in 0.8.5)
        ("v0.8.5", "", "warning"),  # V1 by default: CVE-2025-30165 does not apply
        ("v0.8.5", "VLLM_USE_V1: '0'", "error"),  # V0 forced: CVE-2025-30165 applies
        ("v0.10.0", "VLLM_USE_V1: '0'", "warning"),  # V0 removed
    ],
)
def test_multinode_v0_pickle_follows_the_engine(image: str, env: str, severity: str) -> None:
    text = LWS.replace("vllm/vllm-openai:v0.8.4", f"vllm/vllm-openai:{image}")
    if env:
        name, value = env.split(": ")
        text = text.replace(
            '            resources:\n              limits: {nvidia.com/gpu: "8", memory: 1124Gi}\n'
            "            ports:",
            f"            env: [{{name: {name}, value: {value}}}]\n"
            '            resources:\n              limits: {nvidia.com/gpu: "8", memory: 1124Gi}\n'
            "            ports:",
        )
        assert name in text
    [f] = run_rules(load_text(text), {"vllm-multinode-exposed"})
    assert f.severity == severity
    assert "GHSA-9pcc-gvx5-r5wm" in f.message


def test_alternative_gateways_of_one_name(tmp_path: Path) -> None:
    # Shape of vllm-project/production-stack src/gateway_inference_extension/configs: gke/,
    # istio/ and kgateway/ variants of one Gateway 'inference-gateway', each with its route;
    # a route beside its own variant takes that one, a route above all of them none.
    docs = _folder("trigger_httproute_pool").split("\n---\n")
    deployment = next(d for d in docs if "kind: Deployment" in d)
    pool = next(d for d in docs if "kind: InferencePool" in d)
    gateway = next(d for d in docs if "kind: Gateway\n" in d)
    route = next(d for d in docs if "kind: HTTPRoute" in d)
    (tmp_path / "vllm.yaml").write_text(deployment + "\n---\n" + pool, encoding="utf-8")
    for variant, cls in (("gke", "gke-l7-regional-external-managed"), ("kgateway", "kgateway")):
        (tmp_path / variant).mkdir()
        (tmp_path / variant / "gateway.yaml").write_text(
            gateway.replace("gke-l7-regional-external-managed", cls), encoding="utf-8"
        )
        (tmp_path / variant / "httproute.yaml").write_text(route, encoding="utf-8")
    (tmp_path / "httproute.yaml").write_text(route, encoding="utf-8")
    found = {
        (Path(f.file).relative_to(tmp_path).as_posix(), f.severity)
        for f in run_rules(load_paths([tmp_path]), {"vllm-exposed-without-auth"})
    }
    assert found == {
        ("gke/httproute.yaml", "error"),
        ("kgateway/httproute.yaml", "warning"),
        ("httproute.yaml", "warning"),
    }
