"""HAMi rules: the webhook's and scheduler's real behaviour, card memory from pools, no guessing."""

from __future__ import annotations

import math
import textwrap

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_paths, load_text
from fleetserve.k8s.doctor.registry import run_rules
from fleetserve.k8s.doctor.rules._devices import card_memory, memory_of_gpu_name, pods
from fleetserve.k8s.doctor.rules._engines import parse_vllm_cli
from fleetserve.k8s.doctor.rules._models import replica_need

from .conftest import FIXTURES


def _run(rule_id: str, text: str) -> list[Finding]:
    return [f for f in run_rules(load_text(textwrap.dedent(text)), {rule_id}) if f.rule == rule_id]


def _fixture(rule_id: str, name: str) -> list[Finding]:
    inv = load_paths([FIXTURES / rule_id / name])
    return [f for f in run_rules(inv, {rule_id}) if f.rule == rule_id]


def _pod(
    limits: str,
    *,
    name: str = "p",
    extra_spec: str = "",
    container_extra: str = "",
    labels: str = "",
) -> str:
    out = [
        "apiVersion: v1",
        "kind: Pod",
        "metadata:",
        f"  name: {name}",
        "  namespace: ns",
    ]
    if labels:
        out += ["  labels:"] + ["    " + x for x in textwrap.dedent(labels).strip().splitlines()]
    out += ["spec:"]
    if extra_spec:
        out += ["  " + x for x in textwrap.dedent(extra_spec).strip().splitlines()]
    out += [
        "  containers:",
        "    - name: vllm",
        "      image: vllm/vllm-openai:v0.11.0",
    ]
    if container_extra:
        out += ["      " + x for x in textwrap.dedent(container_extra).strip().splitlines()]
    out += ["      resources:", "        limits:"]
    out += ["          " + x for x in textwrap.dedent(limits).strip().splitlines()]
    return "\n".join(out) + "\n"


_VALUES = """
scheduler:
  kubeScheduler:
    enabled: {kube}
  admissionWebhook:
    enabled: {webhook}
  forceOverwriteDefaultScheduler: {force}
devicePlugin:
  deviceSplitCount: 10
  deviceMemoryScaling: {scaling}
"""


def _values(kube: bool = True, webhook: bool = True, force: bool = True, scaling: float = 1) -> str:
    return _VALUES.format(
        kube=str(kube).lower(),
        webhook=str(webhook).lower(),
        force=str(force).lower(),
        scaling=scaling,
    )


SLICE = "nvidia.com/gpu: 1\nnvidia.com/gpumem: 8000\nnvidia.com/gpucores: 30"


# --------------------------------------------------------------------------- card memory


@pytest.mark.parametrize(
    ("name", "mib"),
    [
        ("NVIDIA-A100-SXM4-80GB", (81920,)),
        ("NVIDIA-A100-SXM4-40GB", (40960,)),
        ("Tesla-T4", (15360,)),
        ("NVIDIA-A10G", (23028,)),
        ("NVIDIA-GeForce-RTX-3090", (24576,)),
        ("NVIDIA-RTX-A6000", (49140,)),
        ("l4", (23034,)),
        ("a100", (40960, 81920)),
        ("nvidia-tesla-a100", (40960,)),
        ("NVIDIA-H100-80GB-HBM3", (81559,)),
        ("NVIDIA-L20-48GB", (49152,)),
        ("mystery-card", ()),
    ],
)
def test_memory_of_gpu_name(name: str, mib: tuple[float, ...]) -> None:
    assert memory_of_gpu_name(name) == mib


def test_card_memory_from_custom_label_is_unknown() -> None:
    # Seed 004 selects gpu.cubox.ai/family: ampere (a 3090 or an A6000): nothing to compare.
    inv = load_paths([FIXTURES.parent / "seeds" / "seed004" / "rayservice-llama3-70b.yaml"])
    worker = next(p for p in pods(inv) if p.group is not None and not p.group.is_head)
    assert card_memory(worker, inv) is None


def test_card_memory_from_fleet_spec_pool() -> None:
    fleet = textwrap.dedent("""
        models:
          - name: m
            source: Qwen/Qwen2.5-7B-Instruct
        pools:
          - name: a10
            labels: {fleetserve.io/pool: a10}
            gpu: {type: A10G, count: 1}
        """)
    text = fleet + "---\n" + _pod(SLICE, extra_spec="nodeSelector:\n  fleetserve.io/pool: a10")
    inv = load_text(text)
    (pod,) = pods(inv)
    card = card_memory(pod, inv)
    assert card is not None
    assert card.candidates == (23028.0,)


# --------------------------------------------------------------------------- scheduler


def test_scheduler_disabled_names_the_slices() -> None:
    (f,) = _fixture("hami-scheduler-disabled", "trigger.yaml")
    assert f.object.startswith("HelmValues/")
    assert f.path == "scheduler.kubeScheduler.enabled"
    assert "22000 MiB" in f.message
    assert f.line == 5


@pytest.mark.parametrize(
    ("values", "scheduler", "expected"),
    [
        (_values(), None, False),  # webhook sets hami-scheduler
        (_values(), "default-scheduler", False),  # rewritten: forceOverwriteDefaultScheduler
        (_values(force=False), "default-scheduler", True),  # left to the default scheduler
        (_values(), "hami-scheduler", False),
        (_values(), "volcano", True),  # webhook leaves other schedulers alone
        (_values(webhook=False), None, True),  # nothing sets it
        (_values(webhook=False), "hami-scheduler", False),
    ],
)
def test_who_schedules_a_slicing_pod(values: str, scheduler: str | None, expected: bool) -> None:
    spec = f"schedulerName: {scheduler}" if scheduler else ""
    found = _run("hami-scheduler-disabled", values + "---\n" + _pod(SLICE, extra_spec=spec))
    assert bool(found) is expected


def test_scheduler_rule_ignores_whole_gpu_pods() -> None:
    assert not _run(
        "hami-scheduler-disabled",
        _values() + "---\n" + _pod("nvidia.com/gpu: 1", extra_spec="schedulerName: volcano"),
    )


# --------------------------------------------------------------------------- overflow


def test_overflow_respects_device_memory_scaling() -> None:
    pod = _pod(
        "nvidia.com/gpu: 1\nnvidia.com/gpumem: 30000",
        extra_spec="nodeSelector:\n  nvidia.com/gpu.product: NVIDIA-A10G",
    )
    (f,) = _run("hami-gpumem-overflow", _values() + "---\n" + pod)
    assert "gpumem 30000 MiB per card" in f.message
    assert "23028 MiB" in f.message
    # HAMi's memory oversubscription (deviceMemoryScaling 1.5): 34542 MiB of virtual memory.
    assert not _run("hami-gpumem-overflow", _values(scaling=1.5) + "---\n" + pod)


def test_overflow_silent_when_the_card_is_unknown() -> None:
    assert not _run("hami-gpumem-overflow", _pod("nvidia.com/gpu: 1\nnvidia.com/gpumem: 300000"))


def test_gpucores_above_100_is_an_info_note() -> None:
    (f,) = _run("hami-gpumem-overflow", _pod("nvidia.com/gpu: 1\nnvidia.com/gpucores: 150"))
    assert f.severity == "info"
    assert "clamps it to 100" in f.message


def test_slices_of_one_pod_beyond_the_node() -> None:
    text = _pod(
        "nvidia.com/gpu: 2\nnvidia.com/gpumem: 20000",
        extra_spec=(
            "nodeSelector:\n  nvidia.com/gpu.product: NVIDIA-A10G\n  nvidia.com/gpu.count: '1'"
        ),
    )
    (f,) = _run("hami-gpumem-overflow", text)
    assert "40000 MiB of GPU memory together" in f.message
    assert "1 card(s)" in f.message


# --------------------------------------------------------------------------- privileged


def test_privileged_without_hami_is_not_ours() -> None:
    # Plain NVIDIA device plugin (no HAMi values, no HAMi resources): privileged GPU pods run.
    assert not _run(
        "hami-privileged-gpu",
        _pod("nvidia.com/gpu: 1", container_extra="securityContext:\n  privileged: true"),
    )


def test_privileged_with_hami_installed_is_denied_even_for_whole_gpus() -> None:
    (f,) = _run(
        "hami-privileged-gpu",
        _values()
        + "---\n"
        + _pod("nvidia.com/gpu: 1", container_extra="securityContext:\n  privileged: true"),
    )
    # No HAMi version in the input: both outcomes are named.
    assert "HAMi 2.10 and later deny it at admission" in f.message
    assert "container vllm is privileged" in f.message
    assert "older HAMi admits it without applying the slice" in f.message


@pytest.mark.parametrize(
    ("tag", "denied"), [("v2.9.0", False), ("v2.10.0", True), ("v2.11.1", True)]
)
def test_privileged_outcome_follows_the_hami_version(tag: str, denied: bool) -> None:
    values = _values() + f"global: {{imageTag: '{tag}'}}\n"
    assert "imageTag" in values
    (f,) = _run(
        "hami-privileged-gpu",
        values + "---\n" + _pod(SLICE, container_extra="securityContext:\n  privileged: true"),
    )
    assert f.severity == "error"
    assert f"HAMi {tag.lstrip('v')} (global.imageTag" in f.message
    assert ("denies it" in f.message) is denied
    assert ("skips privileged containers" in f.message) is not denied


def test_privileged_pod_with_other_scheduler_skips_the_webhook() -> None:
    assert not _run(
        "hami-privileged-gpu",
        _values()
        + "---\n"
        + _pod(
            SLICE,
            extra_spec="schedulerName: volcano",
            container_extra="securityContext:\n  privileged: true",
        ),
    )


# --------------------------------------------------------------------------- GPU count


def test_gpu_count_seed_004_numbers() -> None:
    (f,) = _fixture("hami-gpu-count", "trigger.yaml")
    assert "needs 4 GPUs in one pod (num_gpus 4)" in f.message
    assert "nvidia.com/gpu: 1" in f.message
    assert "Set nvidia.com/gpu: 4 (one 22000 MiB slice on each of 4 cards)" in f.fix


def test_gpu_count_reads_vllm_cli_flags() -> None:
    (f,) = _fixture("hami-gpu-count", "trigger_vllm_server.yaml")
    assert "2 tensor/pipeline ranks" in f.message
    assert f.severity == "error"
    assert "not even one replica starts" in f.message
    assert f.path.endswith("resources.limits.nvidia.com/gpu")


# --------------------------------------------------------------------------- engine memory


def test_engine_memory_slice_too_small_for_weights() -> None:
    (f,) = _fixture("hami-engine-memory", "trigger.yaml")
    # The numbers are the planner's memory model's (fleetserve.plan.memory), not doctor's own.
    need = replica_need({"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 8192})
    assert need is not None
    total = need.per_card.total
    assert f"needs {total / 2**30:.2f} GiB per card" in f.message
    assert "weights 14.99 GiB" in f.message  # 8.03 B parameters + RoPE cache, bf16
    assert "12000 MiB" in f.message
    assert f">= {math.ceil(total / 2**20)} MiB" in f.fix


def test_an_eager_engine_needs_no_graphs_or_compile_peak() -> None:
    """``--enforce-eager`` reaches the memory model: no CUDA graphs, no compile peak."""
    engine, _ = parse_vllm_cli(
        [
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--max-model-len",
            "8192",
            "--enforce-eager",
        ],
        "args",
    )
    assert engine["enforce_eager"] is True
    eager = replica_need(engine)
    compiled = replica_need({**engine, "enforce_eager": False})
    assert eager is not None
    assert compiled is not None
    assert eager.per_card.cuda_graphs == 0 < compiled.per_card.cuda_graphs
    assert eager.per_card.activation < compiled.per_card.activation


def test_engine_memory_hook_disabled_uses_the_whole_card() -> None:
    (f,) = _fixture("hami-engine-memory", "trigger_hook_disabled.yaml")
    assert "0.9 x 81920 MiB = 73728 MiB" in f.message
    assert "18000 MiB" in f.message
    assert "<= 0.22" in f.fix


def test_engine_memory_with_hook_fraction_applies_to_slice() -> None:
    # Same pod as trigger_hook_disabled without CUDA_DISABLE_CONTROL: HAMi-core shows vLLM the
    # 18000 MiB slice as its card, 0.9 of it is 16200 MiB, and Qwen2.5-7B needs more than the
    # slice itself only if weights+KV exceed 18000 MiB - they do not at 4096 tokens.
    text = _pod(
        "nvidia.com/gpu: 1\nnvidia.com/gpumem: 18000",
        extra_spec="nodeSelector:\n  nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB",
        container_extra=(
            'args: ["--model", "Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "4096", '
            '"--gpu-memory-utilization", "0.9"]'
        ),
    )
    assert not _run("hami-engine-memory", text)


# --------------------------------------------------------------------------- tenants


def test_tenant_sharing_message() -> None:
    (f,) = _fixture("tenant-shares-gpu", "trigger.yaml")
    assert "tenant 'internal'" in f.message
    assert "tenant 'acme'" in f.message
    assert "software isolation" in f.message


def test_exclusive_slice_does_not_share() -> None:
    a = _pod(
        "nvidia.com/gpu: 1\nnvidia.com/gpumem: 8000\nnvidia.com/gpucores: 100",
        name="a",
        labels="fleetserve.io/tenant: acme",
    )
    b = _pod(SLICE, name="b", labels="fleetserve.io/tenant: internal")
    assert not _run("tenant-shares-gpu", a + "---\n" + b)
    c = _pod(SLICE, name="c", labels="fleetserve.io/tenant: acme")
    assert _run("tenant-shares-gpu", c + "---\n" + b)
