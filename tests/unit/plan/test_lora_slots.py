"""The memory model counts vLLM's preallocated LoRA slots (max_loras x max_lora_rank)."""

from __future__ import annotations

from fleetserve.plan.memory import estimate_replica, load_model_config, lora_slot_bytes
from fleetserve.plan.planner import plan_fleet
from fleetserve.spec import parse_spec


def test_slots_are_a_and_b_of_every_projection_per_layer() -> None:
    cfg = load_model_config("gemma-3-270m")  # hidden 640, 4 q heads, 1 kv head, dim 256
    # per layer, per slot, per rank: qkv 640+1536, o 1024+640, gate_up 640+4096, down 2048+640
    per_rank = (640 + 1536) + (1024 + 640) + (640 + 2 * 2048) + (2048 + 640)
    assert lora_slot_bytes(cfg, 1, 8, "bfloat16") == per_rank * 8 * 18 * 2
    assert lora_slot_bytes(cfg, 4, 8, "bfloat16") == 4 * lora_slot_bytes(cfg, 1, 8, "bfloat16")
    assert lora_slot_bytes(cfg, 0, 8) == 0


def test_tensor_parallel_shards_the_wide_side_of_each_slot() -> None:
    cfg = load_model_config("llama-3-8b")
    whole = lora_slot_bytes(cfg, 4, 64, "bfloat16")
    assert whole == 1088 * 2**20  # 4 slots of rank 64 on Llama 3 8B: about 1.1 GiB
    assert whole / 2 < lora_slot_bytes(cfg, 4, 64, "bfloat16", tensor_parallel=2) < whole


def test_a_replica_with_adapters_needs_its_slots_more() -> None:
    cfg = load_model_config("llama-3-8b")
    args = {"max_model_len": 4096, "concurrency": 8, "dtype": "bfloat16"}
    plain = estimate_replica(cfg, **args)  # type: ignore[arg-type]
    lora = estimate_replica(cfg, max_loras=4, max_lora_rank=64, **args)  # type: ignore[arg-type]
    assert lora.total - plain.total == lora.lora == 1088 * 2**20


def test_the_plan_gives_a_model_with_adapters_its_slots() -> None:
    model = {"name": "m", "source": "x", "config": "llama-3-8b", "max_model_len": 4096}
    pools = [{"name": "p", "gpu": {"type": "L40S", "count": 1}, "max_nodes": 1}]
    lora = {**model, "max_loras": 4, "max_lora_rank": 64, "adapter_dir": "/a"}
    plain = plan_fleet(parse_spec({"models": [model], "pools": pools}))
    with_slots = plan_fleet(parse_spec({"models": [lora], "pools": pools}))
    [a], [b] = plain.replicas, with_slots.replicas
    assert b.need_mb - a.need_mb == 1088  # memory_mb adds the planner's margin on top


def test_the_max_model_len_fix_leaves_room_for_the_slots() -> None:
    """The suggested context must fit the same replica the planner sizes, slots included."""
    model = {"name": "m", "source": "x", "config": "llama-3-8b", "max_model_len": 8192}
    lora = {**model, "concurrency": 8, "max_loras": 4, "max_lora_rank": 64, "adapter_dir": "/a"}
    pools = [{"name": "p", "gpu": {"type": "L4", "count": 1}, "max_nodes": 1}]
    [unplaced] = plan_fleet(parse_spec({"models": [lora], "pools": pools})).unplaced
    [fix] = [f for f in unplaced.fixes if f.startswith("max_model_len: ")]
    longest = int(fix.split()[1])
    fixed = plan_fleet(parse_spec({"models": [{**lora, "max_model_len": longest}], "pools": pools}))
    assert fixed.feasible
