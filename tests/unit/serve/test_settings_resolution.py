"""Unset model fields resolve to the same engine limits wherever they are resolved:
local planning (``serve`` on this machine), a joined cluster (settings from the spec) and
the fleet planner."""

from __future__ import annotations

from fleetserve.host import HostFacts
from fleetserve.plan.local import joined_deployment, local_deployment
from fleetserve.plan.planner import plan_fleet
from fleetserve.spec import parse_spec

LIMITS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens")

# Nothing set but concurrency: context, sequences and batched tokens are all defaults.
SPEC = parse_spec(
    {
        "models": [{"name": "q", "source": "x", "config": "qwen2.5-0.5b", "concurrency": 4}],
        "pools": [{"name": "p", "gpu": {"type": "L4", "count": 1}}],
    }
)


def test_local_planning_and_a_joined_cluster_resolve_the_same_limits() -> None:
    local = local_deployment(SPEC, HostFacts(cpus=16, memory_mb=128 * 1024)).models["q"].engine
    joined = joined_deployment(SPEC, gpu=False).models["q"].engine
    assert {k: getattr(joined, k) for k in LIMITS} == {k: getattr(local, k) for k in LIMITS}
    # the model config's context (what vLLM itself uses), not a made-up default
    assert local.max_model_len == 32768
    assert local.max_num_seqs == 4
    assert local.kv_cache_tokens == 4 * 32768


def test_the_fleet_planner_resolves_them_the_same_way() -> None:
    planned = plan_fleet(SPEC, scenario="min").replicas[0].engine
    joined = joined_deployment(SPEC, gpu=True).models["q"].engine
    # an L4 is a < 70 GB card: vLLM's batched-tokens default there is the CPU one
    assert {k: getattr(joined, k) for k in LIMITS} == {k: getattr(planned, k) for k in LIMITS}


def test_without_a_readable_config_the_fallback_is_stated() -> None:
    spec = parse_spec({"models": [{"name": "f", "source": "not-a-model", "concurrency": 2}]})
    joined = joined_deployment(spec, gpu=False).models["f"].engine
    assert joined.max_model_len == 4096  # engine.settings.FALLBACK_MAX_MODEL_LEN
    assert joined.max_num_batched_tokens == 2048


def test_a_joined_gpu_cluster_uses_vllms_batched_tokens_default_for_its_cards() -> None:
    # vLLM's OpenAI server defaults to 8192 batched tokens on an H100 and 16384 on a B200
    # (vllm/engine/arg_utils.py); a joined cluster must run what the planner sized for.
    # Tensor parallel: whole cards in the plan too (a small model alone would be a slice).
    for card, expected in (("H100-80GB", 8192), ("B200", 16384), ("A100-80GB", 2048)):
        model = {"name": "q", "source": "x", "config": "qwen2.5-0.5b", "tensor_parallel": 2}
        spec = parse_spec(
            {"models": [model], "pools": [{"name": "p", "gpu": {"type": card, "count": 2}}]}
        )
        planned = plan_fleet(spec, scenario="min").replicas[0].engine
        joined = joined_deployment(spec, gpu=True).models["q"].engine
        assert joined.max_num_batched_tokens == planned.max_num_batched_tokens == expected, card


def test_a_joined_gpu_cluster_takes_the_smallest_default_of_the_models_pools() -> None:
    spec = parse_spec(
        {
            "models": [{"name": "q", "source": "x", "config": "qwen2.5-0.5b", "pools": ["h"]}],
            "pools": [
                {"name": "l4", "gpu": {"type": "L4", "count": 1}},
                {"name": "h", "gpu": {"type": "H200", "count": 1}},
            ],
        }
    )
    assert joined_deployment(spec, gpu=True).models["q"].engine.max_num_batched_tokens == 8192
    unpinned = spec.models[0].model_copy(update={"pools": None})
    spec = spec.model_copy(update={"models": [unpinned]})
    assert joined_deployment(spec, gpu=True).models["q"].engine.max_num_batched_tokens == 2048
