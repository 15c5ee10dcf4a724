"""Two vLLM replicas of the default model behind fleetserve's prefix router: vLLM's own
prefix-cache hit counters follow the router.

Each of two conversations (different long system prompts) takes several turns. Every turn
of a conversation must land on one replica, and that replica's vLLM scheduler must report
prefix-cache hits for the conversation's later turns (their history is already in its KV
cache), while the hits of a conversation never show up on the other replica. Counters and
per-replica request counts are read from the replicas themselves over Ray.

Memory: two CPU engines with a 256 MiB KV cache each (~2.5 GiB RSS apiece), compiled
graphs off (``enforce_eager``) so the test does not spend minutes in torch.compile.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SPEC = """
models:
  - name: gemma-3-270m
    source: builtin:gemma-3-270m
    max_model_len: 2048
    concurrency: 4
    max_num_seqs: 8
    resources: {cpu: 0.9}
    replicas: {min: 2, max: 2}
    engine_args: {kv_cache_memory_bytes: 268435456, enforce_eager: true}
"""
DEPLOYMENT = "model-gemma-3-270m"
SYSTEMS = {
    "ops": "You are an operations assistant for a railway company. " * 40,
    "law": "You are a careful legal research assistant for contract review. " * 36,
}


def replica_counters(ray: Any) -> dict[str, dict[str, float]]:
    """Per live replica: requests served and vLLM's prefix-cache hits and queries."""
    return {
        replica: {
            "served": float(stats["served"]),
            "hits": float(stats.get("prefix_cache_hits", 0.0)),
            "queries": float(stats.get("prefix_cache_queries", 0.0)),
        }
        for replica, stats in ray.replica_stats(DEPLOYMENT).items()
    }


@pytest.fixture(scope="module")
def two_replicas(
    tmp_path_factory: pytest.TempPathFactory, servers: Any, real_engine: Any
) -> Iterator[tuple[str, Any]]:
    started = servers.start_fleetserve(
        tmp_path_factory.mktemp("routing-engine"), SPEC, "2 vLLM replicas"
    )
    try:
        with servers.ray_probe(started.server) as ray:  # the replicas' prefix-cache counters
            yield started.url, ray
    finally:
        started.server.stop()


def test_prefix_cache_hits_follow_the_router(two_replicas: tuple[str, Any]) -> None:
    url, ray = two_replicas
    homes: dict[str, str] = {}
    for topic, system in SYSTEMS.items():
        messages = [{"role": "user", "content": f"{system}\n\nFirst question about {topic}?"}]
        before = replica_counters(ray)
        for turn in range(4):
            r = httpx.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": "gemma-3-270m",
                    "messages": messages,
                    "max_tokens": 8,
                    "temperature": 0,
                },
                timeout=600,
            )
            assert r.status_code == 200, r.text
            reply = r.json()["choices"][0]["message"]["content"] or "ok"
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Follow-up {turn} about {topic}, please."},
            ]
        time.sleep(2)  # vLLM's stat loggers record after the engine's last step
        after = replica_counters(ray)
        served = {k: after[k]["served"] - before.get(k, {}).get("served", 0) for k in after}
        hits = {k: after[k]["hits"] - before.get(k, {}).get("hits", 0) for k in after}
        home = max(served, key=lambda k: served[k])
        assert served[home] == 4, f"{topic}: turns spread over replicas: {served}"
        # Turns 2-4 re-use the conversation's history: >= 3 x the system prompt's blocks.
        assert hits[home] >= 3 * 128, f"{topic}: few prefix hits on its replica: {hits}"
        assert all(h == 0 for k, h in hits.items() if k != home), hits
        homes[topic] = home
    print(f"conversation homes: {homes}")
