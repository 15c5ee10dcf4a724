"""The routing decision through its pure seam: prompt hashing, the prefix index, and the
bounded-load choice over fake replicas with queues and cache state."""

from __future__ import annotations

import json

from fleetserve.engine.protocol import EngineRequest, EngineStats
from fleetserve.serve.routing.index import AdapterIndex, PrefixIndex
from fleetserve.serve.routing.ledger import (
    CHARS_PER_TOKEN,
    LEDGER_MAX_BLOCKS,
    REPORT_MAX_BLOCKS,
    CacheLedger,
    model_cache_span,
)
from fleetserve.serve.routing.policy import (
    PrefixParams,
    ReplicaView,
    load_bound,
    rank_replicas,
)
from fleetserve.serve.routing.prefix import (
    block_hashes,
    conversation_text,
    request_blocks,
    request_key,
)

SYSTEM = "You are a support agent for ACME. " * 20  # ~680 characters


def body(messages: list[dict[str, str]], model: str = "m") -> bytes:
    return json.dumps({"model": model, "messages": messages, "max_tokens": 4}).encode()


def turn(n: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i} " * 10})
        msgs.append({"role": "assistant", "content": f"answer {i} " * 10})
    return msgs


def views(loads: dict[str, int], max_ongoing: int = 64) -> list[ReplicaView]:
    return [ReplicaView(rid, load, max_ongoing) for rid, load in loads.items()]


# --------------------------------------------------------------------------- hashing


def test_a_longer_conversation_extends_the_block_chain() -> None:
    short = request_blocks(body(turn(1)), 64)
    longer = request_blocks(body(turn(2)), 64)
    assert len(short) >= 10
    assert longer[: len(short)] == short
    assert len(longer) > len(short)


def test_blocks_cover_whole_blocks_only_and_are_chained() -> None:
    assert block_hashes("a" * 63, 64) == []
    one = block_hashes("a" * 64, 64)
    two = block_hashes("a" * 128, 64)
    assert len(one) == 1
    assert len(two) == 2
    assert two[0] == one[0]
    assert two[1] != two[0]
    assert block_hashes("b" + "a" * 127, 64)[1] != two[1]  # block 2 carries block 1


def test_text_of_prompts_messages_and_content_parts() -> None:
    assert conversation_text({"prompt": "hello"}) == "hello"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert conversation_text(parts) == conversation_text(
        {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert conversation_text({"messages": []}) is None
    assert conversation_text([1, 2]) is None
    assert request_blocks(b"not json", 64) == []
    assert request_blocks(b"", 64) == []


# --------------------------------------------------------------------------- index


def test_index_matches_leading_blocks_per_replica() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(3)), 64)
    index.add("a", conv[:12])
    index.add("b", conv[:3])
    assert index.match(conv, ["a", "b", "c"]) == {"a": 12, "b": 3, "c": 0}


def test_index_is_bounded_by_capacity_lru() -> None:
    index = PrefixIndex(default_capacity=4)
    index.add("a", [1, 2, 3, 4])  # a prompt: its head (1) the most recent, its tail (4) the least
    index.add("a", [1])  # refresh 1
    index.add("a", [5])  # evicts 4, the least recent: the first prompt's tail
    assert index.size("a") == 4
    assert index.match([1, 2, 3, 4], ["a"]) == {"a": 3}
    assert index.match([4], ["a"]) == {"a": 0}


def test_replica_report_replaces_the_view_but_keeps_newer_routing() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2, 3])
    index.merge("a", [1, 2, 3])  # report: the replica holds what we sent
    index.add("a", [7, 8])  # routed after that report
    index.merge("a", [1, 2])  # replica evicted 3; report predates 7, 8
    assert index.match([1, 2, 3], ["a"]) == {"a": 2}
    assert index.match([7, 8], ["a"]) == {"a": 2}


def test_a_new_router_rebuilds_its_view_from_reports() -> None:
    ledger = CacheLedger(block_chars=64)
    request = EngineRequest("POST", "/v1/chat/completions", body(turn(2)))
    ledger.observe(request)
    report = ledger.report(EngineStats(running=1), {"kv_cache_usage": 0.5})
    assert report["served"] == 1
    assert report["kv_cache_usage"] == 0.5
    index = PrefixIndex()  # e.g. the ingress restarted
    index.merge("a", report["blocks"])
    blocks = request_blocks(request.body, 64)
    assert index.match(blocks, ["a"]) == {"a": len(blocks)}


def test_ledger_capacity_is_the_cache_a_router_should_see() -> None:
    # vLLM's token count x the model's span (sliding windows), in prompt blocks
    ledger = CacheLedger(block_chars=64, span=2.5)
    ledger.set_kv_capacity_tokens(64_000)
    assert ledger.capacity == int(64_000 * 2.5 * CHARS_PER_TOKEN) // 64
    assert ledger.capacity > REPORT_MAX_BLOCKS  # a GPU-sized cache outgrows one report
    ledger.set_kv_capacity_tokens(10**9)
    assert ledger.capacity == LEDGER_MAX_BLOCKS
    # the span comes from the model's config; an unreadable one gives the plain count
    assert 2.6 < model_cache_span("gemma-3-4b", 4096) < 2.9
    assert model_cache_span("llama-3.1-8b", 4096) == 1.0
    assert model_cache_span("/nowhere/model", 4096) == 1.0


def test_a_partial_report_refreshes_the_view_instead_of_replacing_it() -> None:
    """A big cache's report carries only its newest blocks: the router keeps the older
    ones it knows (within the capacity), so long-idle conversations keep their replica."""
    ledger = CacheLedger(block_chars=8, capacity_blocks=10 * REPORT_MAX_BLOCKS)
    old = EngineRequest("POST", "/v1/completions", json.dumps({"prompt": "x" * 800}).encode())
    ledger.observe(old)  # 100 blocks, then many newer ones
    chars = 8 * (REPORT_MAX_BLOCKS + 50)
    new = EngineRequest("POST", "/v1/completions", json.dumps({"prompt": "y" * chars}).encode())
    ledger.observe(new)
    report = ledger.report(EngineStats(), {})
    assert len(report["blocks"]) == REPORT_MAX_BLOCKS
    assert report["complete"] is False
    index = PrefixIndex()
    index.set_capacity("a", report["capacity_blocks"])
    old_blocks = request_blocks(old.body, 8)
    index.add("a", old_blocks)  # this router routed the old conversation there
    index.merge("a", report["blocks"], complete=report["complete"])
    assert index.match(old_blocks, ["a"]) == {"a": len(old_blocks)}
    # a complete report is the authority: what it lacks, the replica no longer holds
    index.merge("a", report["blocks"][-10:], complete=True)
    assert index.match(old_blocks, ["a"]) == {"a": 0}
    small = CacheLedger(block_chars=64)
    small.observe(old)
    assert small.report(EngineStats(), {})["complete"] is True


def test_dropped_replica_is_forgotten() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2])
    index.add("b", [1])
    index.drop("a")
    assert index.match([1, 2], ["a", "b"]) == {"a": 0, "b": 1}
    index.retain(["c"])
    assert index.replicas() == set()


# --------------------------------------------------------------------------- choice


def test_multi_turn_conversation_follows_its_cache() -> None:
    index = PrefixIndex()
    first = request_blocks(body(turn(1)), 64)
    index.add("b", first)
    second = request_blocks(body(turn(2)), 64)
    choice = rank_replicas(second, views({"a": 0, "b": 1}), index, PrefixParams())
    assert choice.order[0] == "b"
    assert choice.reason == "affinity"
    assert choice.matched_blocks == len(first)


def test_saturated_preferred_replica_loses_affinity_for_this_request() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(3)), 64)
    index.add("b", conv)
    # b at its max_ongoing_requests: never first, but still tried last.
    choice = rank_replicas(conv, views({"a": 0, "b": 8}, max_ongoing=8), index, PrefixParams())
    assert choice.order == ("a", "b")
    assert choice.reason == "balance"


def test_conversation_moves_only_when_home_queue_costs_more_than_its_reprefill() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(3)), 64)
    index.add("b", conv)
    params = PrefixParams(load_weight=4)
    # Moving to a costs len(conv) blocks of prefill; staying costs 4 blocks per request
    # queued at b beyond a's: stay while 4 x (b - a) < len(conv).
    stay, move = (len(conv) - 1) // 4, len(conv) // 4 + 1
    assert rank_replicas(conv, views({"a": 0, "b": stay}), index, params).order[0] == "b"
    assert rank_replicas(conv, views({"a": 0, "b": move}), index, params).order[0] == "a"


def test_no_hard_load_bound_by_default() -> None:
    # b holds 5 of 7 ongoing requests: the old default bound (1.25 x the mean) moved this
    # conversation and re-prefilled its history; the cost model keeps it home.
    index = PrefixIndex()
    conv = request_blocks(body(turn(3)), 64)
    index.add("b", conv)
    assert PrefixParams().load_factor is None
    choice = rank_replicas(conv, views({"a": 2, "b": 5}), index, PrefixParams())
    assert choice.order[0] == "b"
    assert choice.reason == "affinity"


def test_bounded_load_caps_affinity_at_load_factor_times_mean() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(3)), 64)
    index.add("b", conv)
    params = PrefixParams(load_factor=1.25, load_weight=0)
    # total 6 on 2 replicas -> bound ceil(1.25 * 7 / 2) = 5: b (4 -> 5) may still take it
    assert load_bound(6, 2, 1.25) == 5
    assert rank_replicas(conv, views({"a": 2, "b": 4}), index, params).order[0] == "b"
    # b (5 -> 6) would exceed the bound of ceil(1.25 * 8 / 2) = 5: a takes it
    assert rank_replicas(conv, views({"a": 2, "b": 5}), index, params).order[0] == "a"


def test_load_weight_trades_cache_for_queue() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(0)), 64)  # system prompt only: ~10 blocks
    index.add("b", conv)
    many = views({"a": 0, "b": 3})
    assert rank_replicas(conv, many, index, PrefixParams(4, load_weight=1)).order[0] == "b"
    assert rank_replicas(conv, many, index, PrefixParams(4, load_weight=8)).order[0] == "a"


def test_no_match_goes_to_least_loaded_then_stable_hash() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(1)), 64)
    assert rank_replicas(conv, views({"a": 3, "b": 1, "c": 2}), index, PrefixParams()).order == (
        "b",
        "c",
        "a",
    )
    tie = [rank_replicas(conv, views({"a": 0, "b": 0}), index, PrefixParams()) for _ in range(3)]
    assert len({c.order for c in tie}) == 1  # same prompt family, same replica


def test_kv_usage_breaks_ties() -> None:
    index = PrefixIndex()
    replicas = [ReplicaView("a", 0, 64, kv_usage=0.9), ReplicaView("b", 0, 64, kv_usage=0.1)]
    assert rank_replicas([], replicas, index, PrefixParams()).order[0] == "b"


def test_dead_replica_is_never_chosen_and_its_conversations_move() -> None:
    index = PrefixIndex()
    conv = request_blocks(body(turn(2)), 64)
    index.add("b", conv)
    index.drop("b")  # replica died; Serve no longer lists it
    choice = rank_replicas(conv, views({"a": 0, "c": 0}), index, PrefixParams())
    assert "b" not in choice.order
    assert choice.reason == "balance"
    index.add(choice.order[0], conv)
    assert (
        rank_replicas(conv, views({"a": 1, "c": 1}), index, PrefixParams()).order[0]
        == (choice.order[0])
    )


def test_empty_candidates() -> None:
    assert rank_replicas([1], [], PrefixIndex(), PrefixParams()).order == ()


# --------------------------------------------------------------------------- adapters


def test_blocks_are_keyed_by_the_model_like_vllms_lora_aware_cache() -> None:
    base = request_key(body(turn(1), model="m"), 64)
    tuned = request_key(body(turn(1), model="m-sql"), 64)
    assert base.model == "m"
    assert tuned.model == "m-sql"
    assert len(base.blocks) == len(tuned.blocks) > 0
    assert not set(base.blocks) & set(tuned.blocks)  # no hit across adapters
    assert request_key(body(turn(1), model="m-sql"), 64) == tuned


def adapter_views(loads: dict[str, int], held: dict[str, set[str]]) -> list[ReplicaView]:
    return [
        ReplicaView(rid, load, 8, adapters=frozenset(held.get(rid, set())))
        for rid, load in loads.items()
    ]


def test_adapter_request_prefers_a_replica_holding_the_adapter() -> None:
    index = PrefixIndex()
    blocks = request_key(body(turn(0), model="sql"), 64).blocks
    held = {"b": {"sql"}}
    params = PrefixParams(load_weight=4, adapter_weight=32)
    choice = rank_replicas(blocks, adapter_views({"a": 0, "b": 3}, held), index, params, "sql")
    assert choice.order[0] == "b"
    assert choice.reason == "affinity"
    # ... unless its queue costs more than loading the adapter elsewhere (32 < 4 x 9) ...
    busy = adapter_views({"a": 0, "b": 9}, held)
    assert rank_replicas(blocks, busy, index, params, "sql").order[0] == "a"
    # ... or it is saturated (max_ongoing_requests in use).
    full = adapter_views({"a": 6, "b": 8}, held)
    assert rank_replicas(blocks, full, index, params, "sql").order == ("a", "b")
    # The base model's requests ignore adapters.
    base = request_key(body(turn(0)), 64).blocks
    assert rank_replicas(base, adapter_views({"a": 0, "b": 3}, held), index, params).order[0] == (
        "a"
    )


def test_adapter_and_prefix_affinity_add_up() -> None:
    index = PrefixIndex()
    conv = request_key(body(turn(3), model="sql"), 64).blocks
    index.add("a", conv)  # a served this conversation (and so loaded sql once)...
    held = {"b": {"sql"}}  # ... but evicted the adapter since; b holds it
    params = PrefixParams(load_weight=4, adapter_weight=16)
    # Re-prefilling the whole conversation costs more than reloading the adapter.
    assert len(conv) > 16
    choice = rank_replicas(conv, adapter_views({"a": 0, "b": 0}, held), index, params, "sql")
    assert choice.order[0] == "a"
    # A short prompt: the held adapter outweighs the few cached blocks.
    short = request_key(body([{"role": "user", "content": "x" * 200}], model="sql"), 64).blocks
    index.add("a", short)
    choice = rank_replicas(short, adapter_views({"a": 0, "b": 0}, held), index, params, "sql")
    assert choice.order[0] == "b"


def test_adapter_index_is_an_lru_of_the_replicas_slots() -> None:
    adapters = AdapterIndex(slots=2)
    adapters.add("a", "x")
    adapters.add("a", "y")
    adapters.add("a", "x")  # refresh x
    adapters.add("a", "z")  # evicts y, the least recent
    assert adapters.held("a") == {"x", "z"}
    adapters.merge("a", ["y", "x"])  # the replica's report wins; z was routed after it
    assert adapters.held("a") == {"x", "z"}
    adapters.merge("a", ["y"])
    assert adapters.held("a") == {"y"}
    adapters.retain(["b"])
    assert adapters.held("a") == frozenset()


def test_ledger_reports_models_served_and_engine_adapters() -> None:
    ledger = CacheLedger(block_chars=64)
    for model in ("m", "sql", "m", "chat"):
        ledger.observe(EngineRequest("POST", "/v1/chat/completions", body(turn(0), model)))
    report = ledger.report(EngineStats(), {})
    assert report["models"] == ["sql", "m", "chat"]  # most recently served last
    assert "adapters" not in report
    assert ledger.report(EngineStats(), {}, adapters=("chat",))["adapters"] == ["chat"]


def test_a_full_view_drops_conversation_tails_first_never_their_heads() -> None:
    """When the capacity binds, the least recent conversation loses its last blocks (as
    vLLM evicts a finished request's blocks tail first), so it still matches as far as it
    is kept; losing its first block instead would leave the rest unmatchable dead weight."""
    first = body([*turn(2), {"role": "user", "content": "a " * 200}])
    a = request_blocks(first, 64)
    b = [
        h ^ 1 for h in request_blocks(body([*turn(1), {"role": "user", "content": "b " * 400}]), 64)
    ]
    capacity = len(a) + len(b) - 5
    index = PrefixIndex()
    index.set_capacity("r", capacity)
    index.add("r", a)
    index.add("r", b)  # no block shared with a
    assert index.match(a, ["r"]) == {"r": len(a) - 5}
    assert index.match(b, ["r"]) == {"r": len(b)}
    # the replica's own ledger keeps the same order: its report (oldest first) ends with
    # the head of what it served last
    ledger = CacheLedger(block_chars=64, capacity_blocks=capacity)
    ledger.observe(EngineRequest("POST", "/v1/chat/completions", first))
    assert ledger.report(EngineStats(), {})["blocks"][-1] == a[0]
