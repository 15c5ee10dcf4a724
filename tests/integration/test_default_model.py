"""The prepared default model, served by vLLM's own OpenAI server (the session's ``vllm``,
shared with the parity tests: no engine start of its own).

Checks what the preparation promises, through the layer users hit (vLLM's OpenAI API, not
transformers): completion prompts and chat prompts each start with exactly one BOS, greedy
text is sensible rather than a repetition loop, and chat replies stop at ``<end_of_turn>``.
The server runs with the engine options fleetserve gives the default model
(``default_engine_args``): what this file checks is the model directory, which those
options do not change.
"""

from __future__ import annotations

from typing import Any

import httpx

from fleetserve.modelstore.gemma import BOS_ID, END_OF_TURN_ID, START_OF_TURN_ID

MODEL = "gemma-3-270m"
MODEL_TOKEN, NEWLINE = 4368, 107  # "model", "\n" in Gemma's vocabulary


def post(vllm: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = vllm.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def distinct_trigram_ratio(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / max(1, len(grams))


def test_completion_prompt_starts_with_one_bos(vllm: httpx.Client) -> None:
    tokens = post(vllm, "/tokenize", {"prompt": "Once upon a time,"})["tokens"]
    assert tokens[0] == BOS_ID
    assert tokens.count(BOS_ID) == 1


def test_chat_prompt_starts_with_one_bos(vllm: httpx.Client) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hi"},
        ],
        "add_generation_prompt": True,
    }
    tokens = post(vllm, "/tokenize", body)["tokens"]
    assert tokens[:2] == [BOS_ID, START_OF_TURN_ID]
    assert tokens.count(BOS_ID) == 1  # template's BOS only: no second one from the tokenizer
    assert tokens[-3:] == [START_OF_TURN_ID, MODEL_TOKEN, NEWLINE]


def test_greedy_completion_is_sensible_text(vllm: httpx.Client) -> None:
    def complete(prompt: str, max_tokens: int) -> str:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        text: str = post(vllm, "/v1/completions", body)["choices"][0]["text"]
        return text

    # Without BOS this model answers " not." here and loops "upon a time,upon a time,..."
    # below: the failure mode the tokenizer fix removes.
    colors = complete("The three primary colors are", 12)
    assert "red" in colors, colors
    assert "blue" in colors, colors
    story = complete("Once upon a time,", 24)
    words = story.split()
    assert len(words) >= 10, story
    assert "upon a time" not in story, f"prompt echo loop: {story!r}"
    assert sum(w.strip(".,;:!?\"'").isalpha() for w in words) / len(words) > 0.8, story
    assert distinct_trigram_ratio(story) > 0.6, f"repetition loop: {story!r}"


def test_chat_completion_stops_at_end_of_turn(vllm: httpx.Client) -> None:
    # The base model's <end_of_turn> embedding is untrained (cosine 0.995 to <unusedN>), so
    # it never ends a turn by itself; push it to emit <end_of_turn> right after 3 tokens
    # (min_tokens holds back only stop tokens) and check that generation_config.json makes
    # that token stop the reply, invisibly. Without 106 among the stop ids, the reply would
    # run on to max_tokens.
    body = {
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 32,
        "temperature": 0,
        "min_tokens": 3,
        "logit_bias": {str(END_OF_TURN_ID): 100},
    }
    data = post(vllm, "/v1/chat/completions", body)
    choice = data["choices"][0]
    content = choice["message"]["content"]
    assert choice["finish_reason"] == "stop", data
    assert choice["stop_reason"] == END_OF_TURN_ID, data
    assert data["usage"]["completion_tokens"] == 4, data  # 3 tokens + <end_of_turn>
    assert content, data
    assert "<end_of_turn>" not in content
    assert "<start_of_turn>" not in content
