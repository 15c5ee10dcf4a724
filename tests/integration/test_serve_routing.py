"""Routing, autoscaling and scale to zero through real Ray Serve with the fake engine.

The session's fake-engine fleet (``fake_fleet``, tests/integration/conftest.py, whose
``FAKE_FLEET_SPEC`` holds these models) serves four models for this file:

* ``chat`` - 2 replicas, prefix routing: a multi-turn conversation stays on one replica, and
  moves when that replica is saturated (``max_ongoing_requests`` in use);
* ``elastic`` - 1..2 replicas on the LLM autoscaling policy: a burst scales it up, idleness
  back down;
* ``sleepy`` / ``sleepy-fast`` - ``replicas.min: 0``: after scaling to zero it is still
  listed, a request waits for the first replica and is answered; with a tiny
  ``cold_start_timeout_s`` the wait ends in 503 + Retry-After.

Which replica answered is read from the replicas themselves (their ``record_routing_stats``
report, over Ray by a probe process), never from timing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SYSTEM = "You are the routing test assistant. Answer briefly and precisely. " * 12


class Fleet:
    def __init__(self, url: str, ray: Any) -> None:
        self.url = url
        # Which replica served what, and how many run: asked of the replicas and Serve.
        self.served = ray.served
        self.running = ray.running

    def chat(self, model: str, messages: list[dict[str, str]], max_tokens: int = 2) -> Any:
        r = httpx.post(
            f"{self.url}/v1/chat/completions",
            json={"model": model, "messages": messages, "max_tokens": max_tokens},
            timeout=180,
        )
        return r


@pytest.fixture
def fleet(fake_fleet: Any) -> Fleet:
    return Fleet(fake_fleet.url, fake_fleet.ray)


def conversation(user: str, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{user}: question {i} " * 8})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {i} " * 8})
    return messages


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def test_multi_turn_conversation_stays_on_one_replica(fleet: Fleet) -> None:
    for user in ("alice", "bob"):
        before = fleet.served("model-chat")
        for turn in range(1, 7):
            r = fleet.chat("chat", conversation(user, turn))
            assert r.status_code == 200, r.text
        moved = delta(before, fleet.served("model-chat"))
        assert list(moved.values()) == [6], f"{user}'s 6 turns spread over replicas: {moved}"


def test_affinity_breaks_when_the_preferred_replica_is_saturated(fleet: Fleet) -> None:
    # Turn 1 finds the conversation's replica.
    before = fleet.served("model-chat")
    assert fleet.chat("chat", conversation("carol", 1)).status_code == 200
    home = next(iter(delta(before, fleet.served("model-chat"))))
    # Two long turns of the same conversation fill home's max_ongoing_requests (2).
    results: list[int] = []
    long_turns = [
        threading.Thread(
            target=lambda: results.append(
                fleet.chat("chat", conversation("carol", 2), max_tokens=120).status_code
            )
        )
        for _ in range(2)
    ]
    mid = fleet.served("model-chat")
    for t in long_turns:
        t.start()
    time.sleep(2.0)  # both are running on home now (6 s each)
    assert delta(mid, fleet.served("model-chat")) == {home: 2}
    # The next turn cannot wait for home: another replica answers it at once.
    start = time.monotonic()
    assert fleet.chat("chat", conversation("carol", 3)).status_code == 200
    assert time.monotonic() - start < 3.0
    after = delta(mid, fleet.served("model-chat"))
    assert after.get(home) == 2
    assert sum(after.values()) == 3
    for t in long_turns:
        t.join()
    assert results == [200, 200]


def test_burst_scales_up_and_idleness_scales_down(fleet: Fleet) -> None:
    assert fleet.running("model-elastic") == 1
    stop = time.monotonic() + 120
    burst: list[threading.Thread] = []

    def one() -> None:
        fleet.chat("elastic", [{"role": "user", "content": "burst"}], max_tokens=300)

    for _ in range(8):  # 8 ongoing vs target 2 per replica -> wants 4, capped at max 2
        burst.append(threading.Thread(target=one))
        burst[-1].start()
    while fleet.running("model-elastic") < 2:
        assert time.monotonic() < stop, "the burst did not scale the model up"
        time.sleep(1)
    for t in burst:
        t.join()
    stop = time.monotonic() + 120
    while fleet.running("model-elastic") > 1:
        assert time.monotonic() < stop, "idleness did not scale the model down"
        time.sleep(1)


def wait_scaled_to_zero(fleet: Fleet, deployment: str) -> None:
    stop = time.monotonic() + 180
    while fleet.running(deployment) > 0:
        assert time.monotonic() < stop, f"{deployment} did not scale to zero"
        time.sleep(1)


def test_request_at_zero_replicas_waits_and_is_answered(fleet: Fleet) -> None:
    wait_scaled_to_zero(fleet, "model-sleepy")
    models = httpx.get(f"{fleet.url}/v1/models", timeout=30).json()["data"]
    assert "sleepy" in {m["id"] for m in models}
    stop = time.monotonic() + 30  # the probes' view of the fleet refreshes every second
    while True:
        ready = httpx.get(f"{fleet.url}/ready", timeout=30)
        assert ready.status_code == 200, ready.text  # min 0: scaled to zero is ready
        if ready.json()["models"]["sleepy"].get("scaled_to_zero") or time.monotonic() > stop:
            break
        time.sleep(0.5)
    assert ready.json()["models"]["sleepy"]["scaled_to_zero"] is True
    start = time.monotonic()
    r = fleet.chat("sleepy", [{"role": "user", "content": "wake up"}])
    cold_start_s = time.monotonic() - start
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "tok0 tok1"
    assert fleet.running("model-sleepy") == 1
    print(f"fake-engine cold start through Serve: {cold_start_s:.1f} s")


def test_request_past_the_cold_start_timeout_gets_503_with_retry_after(fleet: Fleet) -> None:
    wait_scaled_to_zero(fleet, "model-sleepy-fast")
    r = fleet.chat("sleepy-fast", [{"role": "user", "content": "hurry"}])
    assert r.status_code == 503, r.text
    assert r.headers.get("retry-after")
    assert "scaled to zero" in r.json()["error"]["message"]
    # The request that timed out still woke the model, with no retry: it was queued for
    # 0.05 s, far less than Serve's handle samples its queue, so it must stay queued
    # (the waker) until the autoscaler has started a replica.
    stop = time.monotonic() + 120
    while True:
        ready = httpx.get(f"{fleet.url}/ready", timeout=30).json()["models"]["sleepy-fast"]
        if not ready.get("scaled_to_zero") or time.monotonic() > stop:
            break
        time.sleep(0.5)
    assert not ready.get("scaled_to_zero"), ready
    r = fleet.chat("sleepy-fast", [{"role": "user", "content": "again"}])
    assert r.status_code == 200, r.text
