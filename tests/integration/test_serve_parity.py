"""Parity: the same greedy requests to `vllm serve` and to fleetserve give identical text and
token counts (same model directory, same engine options).

`vllm serve` here is the session's ``vllm`` (tests/integration/conftest.py): vLLM's own
OpenAI server that ``process_fleet`` runs beside its replica, its command line checked to
carry the engine options fleetserve gives the default model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fleetserve.spec import DEFAULT_MODEL_NAME as MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sea salty?"},
    ],
]
PROMPTS = ["Once upon a time", "def fibonacci(n):"]


@pytest.fixture
def fleetserve(fleetserve_url: str) -> Iterator[httpx.Client]:
    """A client of the session's default fleet (the in-replica frontend)."""
    with httpx.Client(base_url=fleetserve_url, timeout=300) as client:
        yield client


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    text, usage = "", {}
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            usage = chunk.get("usage") or usage
    return text, usage


@pytest.mark.parametrize("messages", CHATS)
def test_chat_is_identical(
    fleetserve: httpx.Client, vllm: httpx.Client, messages: list[Any]
) -> None:
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
    ours = post(fleetserve, "/v1/chat/completions", body)
    theirs = post(vllm, "/v1/chat/completions", body)
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    assert ours["usage"] == theirs["usage"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_is_identical(fleetserve: httpx.Client, vllm: httpx.Client, prompt: str) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 32, "temperature": 0}
    ours = post(fleetserve, "/v1/completions", body)
    theirs = post(vllm, "/v1/completions", body)
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert ours["usage"] == theirs["usage"]


def test_streamed_chat_is_identical(fleetserve: httpx.Client, vllm: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": CHATS[0],
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ours = stream(fleetserve, "/v1/chat/completions", body)
    theirs = stream(vllm, "/v1/chat/completions", body)
    assert ours == theirs
    assert ours[1]["completion_tokens"] > 0


def test_errors_are_identical(fleetserve: httpx.Client, vllm: httpx.Client) -> None:
    body = {"model": MODEL, "messages": CHATS[0], "max_tokens": 100_000}
    ours = fleetserve.post("/v1/chat/completions", json=body)
    theirs = vllm.post("/v1/chat/completions", json=body)
    assert ours.status_code == theirs.status_code == 400
    assert ours.json() == theirs.json()
