"""Routing by LoRA adapter through real Ray Serve with the fake engine (which loads
``adapter_dir`` adapters on first use and keeps them LRU, as vLLM does).

The session's fake-engine fleet (``fake_fleet``, tests/integration/conftest.py): its model
``lora-chat`` has 2 replicas and an adapter directory with two adapters:
an adapter's requests - unrelated prompts, so no prefix is shared - stay on the replica that
loaded the adapter, and go elsewhere when that replica is saturated. Which replica answered
is read from the replicas' ``record_routing_stats`` reports (over Ray), never from timing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEPLOYMENT = "model-lora-chat"


class Fleet:
    def __init__(self, url: str, ray: Any) -> None:
        self.url = url
        self._ray = ray

    def served(self) -> dict[str, int]:
        """Requests each live replica has taken (from the replicas)."""
        served: dict[str, int] = self._ray.served(DEPLOYMENT)
        return served

    def ask(self, model: str, n: int, max_tokens: int = 2) -> int:
        # Distinct prompts: nothing to share by prefix, only the adapter.
        prompt = f"request {n} for {model}: " + f"unrelated words {n * 7919} " * 6
        r = httpx.post(
            f"{self.url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
            },
            timeout=180,
        )
        return r.status_code


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


@pytest.fixture
def fleet(fake_fleet: Any) -> Fleet:
    return Fleet(fake_fleet.url, fake_fleet.ray)


def test_an_adapters_requests_stay_on_the_replica_that_loaded_it(fleet: Fleet) -> None:
    for adapter in ("sql", "legal"):
        before = fleet.served()
        for n in range(10):
            assert fleet.ask(adapter, n) == 200
        # Unrelated prompts would spread over both replicas (the fallback is rendezvous
        # hashing of each prompt); the adapter keeps all ten on one.
        landed = delta(before, fleet.served())
        assert list(landed.values()) == [10], f"{adapter}'s requests spread: {landed}"


def test_a_saturated_adapter_replica_sends_the_next_request_elsewhere(fleet: Fleet) -> None:
    before = fleet.served()
    assert fleet.ask("sql", 100) == 200
    home = next(iter(delta(before, fleet.served())))
    # Two long requests fill home's max_ongoing_requests (2).
    codes: list[int] = []
    long = [
        threading.Thread(target=lambda n=n: codes.append(fleet.ask("sql", 200 + n, 120)))
        for n in range(2)
    ]
    mid = fleet.served()
    for t in long:
        t.start()
    time.sleep(2.0)  # both are running on home now (6 s each)
    assert delta(mid, fleet.served()) == {home: 2}
    assert fleet.ask("sql", 300) == 200
    after = delta(mid, fleet.served())
    assert after.get(home) == 2
    assert sum(after.values()) == 3
    for t in long:
        t.join()
    assert codes == [200, 200]
