"""Parity: the same greedy requests to `vllm serve` and to fleetserve give identical text and
token counts (same model directory, same engine options)."""

from __future__ import annotations

import json
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


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def stream(url: str, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    text, usage = "", {}
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=300) as r:
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
def test_chat_is_identical(fleetserve_url: str, vllm_url: str, messages: list[Any]) -> None:
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
    ours = post(fleetserve_url, "/v1/chat/completions", body)
    theirs = post(vllm_url, "/v1/chat/completions", body)
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    assert ours["usage"] == theirs["usage"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_is_identical(fleetserve_url: str, vllm_url: str, prompt: str) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 32, "temperature": 0}
    ours = post(fleetserve_url, "/v1/completions", body)
    theirs = post(vllm_url, "/v1/completions", body)
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert ours["usage"] == theirs["usage"]


def test_streamed_chat_is_identical(fleetserve_url: str, vllm_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": CHATS[0],
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ours = stream(fleetserve_url, "/v1/chat/completions", body)
    theirs = stream(vllm_url, "/v1/chat/completions", body)
    assert ours == theirs
    assert ours[1]["completion_tokens"] > 0


def test_errors_are_identical(fleetserve_url: str, vllm_url: str) -> None:
    body = {"model": MODEL, "messages": CHATS[0], "max_tokens": 100_000}
    ours = httpx.post(f"{fleetserve_url}/v1/chat/completions", json=body, timeout=60)
    theirs = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=60)
    assert ours.status_code == theirs.status_code == 400
    assert ours.json() == theirs.json()
