"""Fleets, hand-made plans and schema validators for the render tests.

The plans are built by hand (not by the planner) so these tests pin render's behaviour for a
known placement; the planner-backed path is covered by the example-fleet tests.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fleetserve.engine.settings import EngineSettings
from fleetserve.plan.result import PlanResult, ReplicaPlacement
from fleetserve.spec import FleetSpec, parse_spec

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO.parent / "shared" / "k8s" / "crds"
EXAMPLES = REPO / "examples" / "k8s"
GOLDEN = REPO / "tests" / "golden" / "render"

SLICED_SPEC: dict[str, Any] = {
    "kubernetes": {"name": "llm", "namespace": "llm-serving"},
    "pools": [
        {"name": "cpu", "cpu": 8, "memory_gb": 32, "labels": {"pool": "cpu"}},
        {
            "name": "a6000",
            "gpu": {"type": "RTX-A6000", "count": 2, "memory_gb": 48},
            "cpu": 32,
            "memory_gb": 128,
            "max_nodes": 2,
            "labels": {"pool": "a6000"},
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
        {
            "name": "t4",
            "gpu": {"type": "T4", "count": 4, "memory_gb": 16},
            "cpu": 16,
            "memory_gb": 64,
            "labels": {"pool": "t4"},
            "taints": [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
        },
    ],
    "tenants": [
        {"name": "internal", "api_keys": ["${INTERNAL_API_KEY}"]},
        {"name": "customer", "api_keys": [{"secret": "customer-keys", "key": "api-key"}]},
    ],
    "models": [
        {
            "name": "llama-3-8b",
            "source": "meta-llama/Meta-Llama-3-8B-Instruct",
            "max_model_len": 8192,
            "replicas": {"min": 1, "max": 3, "target_ongoing_requests": 8},
            "pools": ["a6000"],
            "hf_token": {"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},
        },
        {
            "name": "Qwen/Qwen2.5-7B",
            "source": "Qwen/Qwen2.5-7B-Instruct",
            "max_model_len": 8192,
            "replicas": {"min": 2, "max": 2},
            "pools": ["t4"],
        },
    ],
}

WHOLE_SPEC: dict[str, Any] = {
    "kubernetes": {"name": "vllm", "namespace": "rayserve-vllm"},
    "pools": [
        {"name": "x86", "cpu": 8, "memory_gb": 32, "labels": {"karpenter.sh/nodepool": "x86"}},
        {
            "name": "p4de",
            "gpu": {"type": "A100-80GB", "count": 8, "memory_gb": 80},
            "cpu": 96,
            "memory_gb": 1100,
            "max_nodes": 1,
            "labels": {"karpenter.sh/nodepool": "p4de"},
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
    ],
    "models": [
        {
            "name": "llama-3-70b",
            "source": "meta-llama/Meta-Llama-3-70B-Instruct",
            "tensor_parallel": 4,
            "resources": {"cpu": 4, "memory_gb": 64},
            "replicas": {"min": 1, "max": 2},
            "hf_token": "${HF_TOKEN}",
        }
    ],
}


def engine(gmu: float, seqs: int = 8) -> EngineSettings:
    return EngineSettings(
        gpu_memory_utilization=gmu,
        max_num_seqs=seqs,
        max_model_len=8192,
        max_num_batched_tokens=8192,
    )


def place(
    model: str,
    index: int,
    pool: str,
    node: int,
    gpus: list[int],
    memory_mb: int,
    cores: int,
    gmu: float,
) -> ReplicaPlacement:
    return ReplicaPlacement(
        model=model,
        index=index,
        pool=pool,
        node=node,
        gpus=gpus,
        memory_mb=memory_mb,
        cores_percent=cores,
        engine=engine(gmu),
    )


def plan(replicas: list[ReplicaPlacement]) -> PlanResult:
    return PlanResult(
        feasible=True,
        gpus_used=len({(r.pool, r.node, g) for r in replicas for g in r.gpus}),
        nodes={},
        optimality_gap=0.0,
        replicas=replicas,
        unplaced=[],
    )


def sliced_fleet() -> tuple[FleetSpec, PlanResult, PlanResult]:
    """Two models on HAMi slices: the min plan shares card 0 of a6000 node 0."""
    spec = parse_spec(copy.deepcopy(SLICED_SPEC))
    llama = [place("llama-3-8b", i, "a6000", 0, [i % 2], 24000, 50, 0.48) for i in range(3)]
    qwen = [place("Qwen/Qwen2.5-7B", i, "t4", 0, [0], 7000, 40, 0.42) for i in range(2)]
    return spec, plan([llama[0], *qwen]), plan([*llama, *qwen])


def whole_fleet() -> tuple[FleetSpec, PlanResult, PlanResult]:
    """A TP=4 model on whole A100s, two replicas on one 8-card node."""
    spec = parse_spec(copy.deepcopy(WHOLE_SPEC))
    reps = [
        place("llama-3-70b", i, "p4de", 0, [4 * i + k for k in range(4)], 81920, 100, 0.9)
        for i in range(2)
    ]
    return spec, plan(reps[:1]), plan(reps)


#: The whole-card fleet serving LoRA adapters from two volumes (a PVC and a hostPath) and
#: one HF repo id (no volume).
LORA_VOLUMES: list[dict[str, Any]] = [
    {"name": "adapters", "claim": "lora-adapters", "mount_path": "/adapters"},
    {"name": "scratch", "host_path": "/mnt/lora", "mount_path": "/scratch", "read_only": False},
]
LORA_ADAPTERS: list[dict[str, Any]] = [
    {"name": "sql", "source": "/adapters/sql"},
    {"name": "chat", "source": "acme/llama-70b-chat-lora"},
]


def lora_fleet() -> tuple[FleetSpec, PlanResult, PlanResult]:
    """:func:`whole_fleet` with adapters on volumes."""
    data = copy.deepcopy(WHOLE_SPEC)
    data["kubernetes"]["volumes"] = copy.deepcopy(LORA_VOLUMES)
    data["models"][0].update(
        adapters=copy.deepcopy(LORA_ADAPTERS), adapter_dir="/scratch/llama", max_loras=2
    )
    _, plan_min, plan_max = whole_fleet()
    return parse_spec(data), plan_min, plan_max


FLEETS: dict[str, Callable[[], tuple[FleetSpec, PlanResult, PlanResult]]] = {
    "sliced": sliced_fleet,
    "whole-tp": whole_fleet,
    "lora": lora_fleet,
}


# --------------------------------------------------------------------------- schemas


def _to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (structural, as in CRDs) -> JSON Schema that rejects unknown fields."""
    if isinstance(node, list):
        return [_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _crd_validators() -> dict[tuple[str, str], jsonschema.Validator]:
    validators: dict[tuple[str, str], jsonschema.Validator] = {}
    # libyaml's loader where PyYAML has it: the pure-Python one took 80-100 s for these
    # MBs of YAML on a loaded 2-core host (the same documents either way).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _to_json_schema(version["schema"]["openAPIV3Schema"])
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft202012Validator(
                schema
            )
    return validators


_VALIDATORS: dict[tuple[str, str], jsonschema.Validator] | None = None


def crd_errors(obj: dict[str, Any]) -> list[str] | None:
    """Schema errors of a custom resource, or None if no CRD in shared/k8s defines it."""
    global _VALIDATORS  # noqa: PLW0603 - parsed once per session (the CRDs are MBs)
    if _VALIDATORS is None:
        _VALIDATORS = _crd_validators()
    validator = _VALIDATORS.get((obj["apiVersion"], obj["kind"]))
    if validator is None:
        return None
    return [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


@pytest.fixture(scope="session")
def crds_present() -> None:
    if not CRDS.is_dir():
        pytest.skip(f"CRD schemas not found at {CRDS}")


@pytest.fixture
def kit() -> Any:
    """The helpers above, for test modules (conftest is not importable by name here)."""
    return types.SimpleNamespace(
        FLEETS=FLEETS,
        EXAMPLES=EXAMPLES,
        GOLDEN=GOLDEN,
        CRDS=CRDS,
        SLICED_SPEC=SLICED_SPEC,
        WHOLE_SPEC=WHOLE_SPEC,
        sliced_fleet=sliced_fleet,
        whole_fleet=whole_fleet,
        lora_fleet=lora_fleet,
        LORA_VOLUMES=LORA_VOLUMES,
        place=place,
        plan=plan,
        crd_errors=crd_errors,
    )
