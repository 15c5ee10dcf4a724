"""The official OpenAI SDK against a running fleetserve (real vLLM engine, default model).

Also the error statuses (400/404, never 500 for a client mistake), the probes, and that
a client leaving mid-stream aborts its engine request.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from fleetserve.spec import DEFAULT_MODEL_NAME as MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(fleetserve_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleetserve_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_default_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_completion(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    assert r.model == MODEL
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None
    assert 0 < r.usage.completion_tokens <= 16
    assert r.usage.prompt_tokens > 0


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert not chunks[-1].choices
    assert 0 < usage.completion_tokens <= 12


def test_completion_n_logprobs_and_max_tokens(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=6, n=2, logprobs=2, temperature=1.0, seed=7
    )
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.top_logprobs is not None
        # The top-2 alternatives, plus the sampled token when it is not among them.
        assert all(2 <= len(top) <= 3 for top in choice.logprobs.top_logprobs if top)
    assert r.usage is not None
    assert r.usage.completion_tokens <= 12


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample() -> str | None:
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=10, temperature=1.0, top_p=0.9, seed=1234
        )
        return r.choices[0].message.content

    assert sample() == sample()


def test_stop_and_max_completion_tokens(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=["7"]
    )
    assert "7" not in r.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, temperature=0
    )
    assert chat.usage is not None
    assert chat.usage.completion_tokens <= 3


# ---------------------------------------------------------------- errors


def test_prompt_plus_max_tokens_over_the_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100_000)
    assert err.value.status_code == 400


@pytest.mark.parametrize(
    "extra",
    [{"temperature": -1}, {"n": 0}, {"top_p": 2}, {"max_tokens": -5}, {"logprobs": "maybe"}],
)
def test_invalid_parameters_are_400(fleetserve_url: str, extra: dict[str, object]) -> None:
    body = {"model": MODEL, "messages": MESSAGES, **extra}
    r = httpx.post(f"{fleetserve_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400
    assert error["message"]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert err.value.status_code == 404


@pytest.mark.parametrize("content", [b"{broken", b'{"model": "gemma-3-270m"}', b'"just a string"'])
def test_malformed_bodies_are_400_never_500(fleetserve_url: str, content: bytes) -> None:
    r = httpx.post(
        f"{fleetserve_url}/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_health_and_ready(fleetserve_url: str) -> None:
    assert httpx.get(f"{fleetserve_url}/health", timeout=10).status_code == 200
    ready = httpx.get(f"{fleetserve_url}/ready", timeout=30)
    assert ready.status_code == 200
    assert ready.json()["models"][MODEL]["ready"] is True


# ---------------------------------------------------------------- disconnect


def _engine_stats(url: str) -> dict[str, int]:
    # ?engine=1: the engines' counters (plain probes never ask the replicas).
    r = httpx.get(f"{url}/ready?engine=1", timeout=30)
    return r.json()["models"][MODEL]  # type: ignore[no-any-return]


def test_client_disconnect_mid_stream_aborts_the_engine_request(fleetserve_url: str) -> None:
    before = _engine_stats(fleetserve_url)["aborted"]
    body = {
        "model": MODEL,
        "prompt": "Count slowly:",
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", f"{fleetserve_url}/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                json.loads(line[6:])
                seen += 1
            if seen >= 3:
                break  # leaving the with-block closes the connection mid-stream
    deadline = time.monotonic() + 60
    stats = _engine_stats(fleetserve_url)
    while time.monotonic() < deadline and (stats["running"] or stats["aborted"] <= before):
        time.sleep(0.5)
        stats = _engine_stats(fleetserve_url)
    assert stats["aborted"] == before + 1
    assert stats["running"] == 0  # the engine holds no request any more
