"""Security classes of 2025-26 in the vLLM stack (issue #30, item 5): raw embedding inputs
(GHSA-mrw7-hf4f-83pf) judged by the vLLM release the image names, and trust_remote_code with
a Hub model. Fixtures: tests/fixtures/doctor/prompt-embeds-enabled/ (production-stack's GIE
vLLM Deployment) and trust-remote-code-hub/ (KubeAI's DeepSeek-R1 Model)."""

from __future__ import annotations

import pytest

from fleetserve.k8s.doctor.loader import load_text
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
