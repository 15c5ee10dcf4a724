"""plan_local: `fleetserve serve` on this machine (CPU host and GPU host)."""

from __future__ import annotations

import pytest

from fleetserve.plan import LocalHost, plan_local
from fleetserve.plan.local import local_deployment
from fleetserve.plan.memory import CUDA_CONTEXT_BYTES, MiB, estimate_replica, load_model_config
from fleetserve.spec import default_fleet, parse_spec


def test_detect_reports_this_machine() -> None:
    host = LocalHost.detect()
    assert host.cpus >= 1
    assert host.memory_mb > 1024
    assert all(mb > 0 for mb in host.gpu_memory_mb)


def test_cpu_host_fraction_covers_weights_runtime_and_kv() -> None:
    host = LocalHost(cpus=2, memory_mb=21_209)
    result = plan_local(default_fleet(), host)
    assert result.feasible
    (r,) = result.replicas
    assert r.gpus == []
    cfg = load_model_config("gemma-3-270m")
    need = estimate_replica(
        cfg,
        max_model_len=4096,
        concurrency=8,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        device="cpu",
    )
    asked = r.engine.gpu_memory_utilization * host.memory_mb * MiB
    # the worker gets its RSS plus a KV cache for concurrency x max_model_len ...
    assert asked >= need.total
    # ... and not wildly more (bounded)
    assert asked <= need.total * 1.2 + 0.01 * host.memory_mb * MiB
    assert r.engine.kv_cache_tokens == 8 * 4096
    assert r.engine.max_num_seqs == 64


def test_cpu_host_without_room_reports_memory() -> None:
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "big",
                    "source": "x",
                    "config": "llama-3-8b",
                    "max_model_len": 8192,
                    "concurrency": 16,
                }
            ]
        }
    )
    result = plan_local(spec, LocalHost(cpus=2, memory_mb=16_000))
    assert not result.feasible
    (u,) = result.unplaced
    assert u.resource == "memory"
    assert "MiB" in u.reason


def test_cpu_host_sums_replicas() -> None:
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "q",
                    "source": "x",
                    "config": "qwen2.5-0.5b",
                    "max_model_len": 4096,
                    "replicas": {"min": 3, "max": 3},
                    "resources": {"cpu": 0.5},
                }
            ]
        }
    )
    result = plan_local(spec, LocalHost(cpus=2, memory_mb=64_000))
    assert len(result.replicas) == 3
    assert sum(r.engine.gpu_memory_utilization for r in result.replicas) < 0.9


def test_gpu_host_uses_fractions_of_whole_cards() -> None:
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "a",
                    "source": "x",
                    "config": "llama-3-8b",
                    "max_model_len": 8192,
                    "concurrency": 4,
                    "pools": None,
                },
                {
                    "name": "b",
                    "source": "x",
                    "config": "qwen2.5-1.5b",
                    "max_model_len": 4096,
                    "replicas": {"min": 0, "max": 2},
                },
            ]
        }
    )
    result = plan_local(spec, LocalHost(cpus=16, memory_mb=128_000, gpu_memory_mb=[81_559]))
    assert result.feasible
    assert {r.model for r in result.replicas} == {"a", "b"}  # min 0 still gets one locally
    assert all(r.gpus == [0] for r in result.replicas)
    total = sum(r.engine.gpu_memory_utilization for r in result.replicas)
    assert total <= 1.0
    for r in result.replicas:
        assert 0 < r.num_gpus < 1
        assert r.engine.gpu_memory_utilization * 81_559 <= r.memory_mb


def test_gpu_host_too_small_is_reported() -> None:
    spec = parse_spec(
        {"models": [{"name": "a", "source": "x", "config": "llama-3-70b", "max_model_len": 8192}]}
    )
    result = plan_local(spec, LocalHost(cpus=16, memory_mb=128_000, gpu_memory_mb=[24_576]))
    assert not result.feasible
    assert result.unplaced[0].resource == "gpu_memory"
    assert result.unplaced[0].fixes


@pytest.mark.parametrize("gpus", [[], [24_576, 24_576]])
def test_local_plan_is_json_serialisable(gpus: list[int]) -> None:
    result = plan_local(default_fleet(), LocalHost(cpus=4, memory_mb=32_000, gpu_memory_mb=gpus))
    data = result.model_dump(mode="json")
    assert data["scenario"] == "local"


def test_gpu_host_short_of_ram_names_the_machine_not_a_crash() -> None:
    """Four models on one card of a host whose RAM holds three replicas' processes: the
    plan says which replica does not fit and why (it raised KeyError 'local' on an H200,
    diagnosing a pool the spec does not list)."""
    spec = parse_spec(
        {
            "models": [
                {"name": n, "source": "x", "config": c, "max_model_len": 4096, "concurrency": 16}
                for n, c in [
                    ("s", "gemma-3-270m"),
                    ("m", "gemma-3-1b"),
                    ("l", "gemma-3-4b"),
                    ("xl", "gemma-3-12b"),
                ]
            ]
        }
    )
    result = plan_local(spec, LocalHost(cpus=16, memory_mb=16_000, gpu_memory_mb=[143_155]))
    assert not result.feasible
    assert len(result.replicas) == 3
    (short,) = result.unplaced
    assert short.resource == "host_memory" or "RAM" in short.reason
    assert "local" in short.reason


def test_gpu_host_card_is_planned_at_its_nominal_memory() -> None:
    """The probe reads CUDA's figure (143,155 MiB on an H200); the plan takes the card's
    nominal one (nvidia-smi's 143,771) and applies CUDA's share once: each engine's fraction
    times CUDA's figure is what the plan gave it, less what vLLM's budget does not hold:
    the CUDA context (made before its snapshot) and the CUDA graphs (captured after it
    sized the KV cache)."""
    spec = parse_spec({"models": [{"name": "a", "source": "x", "config": "gemma-3-4b"}]})
    result = plan_local(spec, LocalHost(cpus=16, memory_mb=128_000, gpu_memory_mb=[143_155]))
    assert result.pools[0].card_memory_mb == 143_771
    (replica,) = result.replicas
    e = replica.engine
    graphs = estimate_replica(
        load_model_config("gemma-3-4b"),
        max_model_len=e.max_model_len,
        concurrency=e.kv_cache_tokens // e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
    ).cuda_graphs
    assert graphs > 0
    budget = replica.need_mb - (CUDA_CONTEXT_BYTES + graphs) / MiB
    assert replica.engine.gpu_memory_utilization * 143_155 == pytest.approx(budget, 0.002)


def _two_of(config: str, **fields: object) -> dict[str, object]:
    return {
        "name": "m",
        "source": "x",
        "config": config,
        "max_model_len": 4096,
        "concurrency": 16,
        "replicas": {"min": 2, "max": 2},
        **fields,
    }


def test_replicas_planned_on_cards_of_their_own_reserve_them_whole() -> None:
    """Ray gives a fraction of *some* card and fills one card before the next: two replicas
    of 0.37 that the plan spread over two cards would share card 0 (issue #32's "one replica
    per card"). A fixed-count model whose every replica has its planned card to itself
    reserves the whole card; vLLM still gets the plan's fraction."""
    host = LocalHost(cpus=32, memory_mb=256_000, gpu_memory_mb=[143_771, 143_771])
    spread = parse_spec({"models": [_two_of("gemma-3-12b")], "policy": {"gpu": "spread"}})
    plan = plan_local(spread, host)
    assert sorted(r.gpus[0] for r in plan.replicas) == [0, 1]
    deployment = local_deployment(spread, host).models["m"]
    assert deployment.ray.num_gpus == 1.0
    assert deployment.engine.gpu_memory_utilization < 0.5
    # packed on one card by the plan: Ray's fraction packs them the same way
    packed = parse_spec({"models": [_two_of("gemma-3-12b")]})
    assert {r.gpus[0] for r in plan_local(packed, host).replicas} == {0}
    assert local_deployment(packed, host).models["m"].ray.num_gpus < 0.5
    # autoscaled: replicas the plan did not count need what their cards have left
    scaled = parse_spec(
        {
            "models": [_two_of("gemma-3-12b", replicas={"min": 2, "max": 4})],
            "policy": {"gpu": "spread"},
        }
    )
    assert local_deployment(scaled, host).models["m"].ray.num_gpus < 0.5
