"""Bounded fuzzing of the gateway over the OpenAI request schema (fake engine): zero 5xx.

Hypothesis builds chat/completion requests from the schema's fields with valid, boundary
and wrongly-typed values, plus raw bodies and stray headers (Serve's control headers
among them). Every answer must be below 500 and every error in the OpenAI shape.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.fake_engine import FakeEngine
from fleetserve.engine.settings import EngineSettings
from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.serve.ingress.gateway import Gateway, ModelRoute, create_api
from fleetserve.serve.ingress.limits import RequestLimits
from fleetserve.serve.ingress.model_client import LocalModelClient
from fleetserve.spec import parse_spec

SETTINGS = EngineSettings(
    gpu_memory_utilization=0.1, max_num_seqs=8, max_model_len=256, max_num_batched_tokens=64
)

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
content = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"])}),
        max_size=2,
    ),
    junk,
)
message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"])},
        optional={"content": content, "name": junk},
    ),
    junk,
)
common = {
    "model": st.one_of(st.just("alpha"), st.text(max_size=10), junk),
    "max_tokens": st.one_of(st.integers(min_value=-5, max_value=300), junk),
    "max_completion_tokens": st.one_of(st.integers(min_value=-5, max_value=300), junk),
    "temperature": st.one_of(st.floats(min_value=-1, max_value=3), junk),
    "top_p": junk,
    "n": st.one_of(st.integers(min_value=-1, max_value=4), junk),
    "stream": st.one_of(st.booleans(), junk),
    "stream_options": st.one_of(
        st.fixed_dictionaries({}, optional={"include_usage": st.one_of(st.booleans(), junk)}),
        junk,
    ),
    "stop": junk,
    "seed": junk,
    "user": junk,
    "logprobs": junk,
}
chat_body = st.fixed_dictionaries(
    {}, optional={**common, "messages": st.one_of(st.lists(message, max_size=3), junk)}
)
completion_body = st.fixed_dictionaries(
    {}, optional={**common, "prompt": st.one_of(st.text(max_size=100), junk)}
)
headers = st.dictionaries(
    st.sampled_from(
        ["x-request-id", "x-request-timeout-seconds", "x-session-id", "content-type", "x-a"]
    ),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
    max_size=3,
)
case = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), chat_body.map(json.dumps), headers),
    st.tuples(st.just("/v1/completions"), completion_body.map(json.dumps), headers),
    st.tuples(
        st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
        headers,
    ),
)


@pytest.fixture(scope="module")
async def api() -> Any:
    fleet = parse_spec({"models": [{"name": "alpha", "source": "fake"}]})
    engine = FakeEngine(
        EngineConfig.from_spec(fleet.models[0], model_path="fake", settings=SETTINGS, kind="fake")
    )
    await engine.start()
    gateway = Gateway(
        [ModelRoute("alpha", SETTINGS.max_model_len)],
        ApiKeyTable.from_spec(fleet, {}),
        LocalModelClient({"alpha": engine}),
        limits=RequestLimits(request_timeout_s=10),
    )
    return create_api(gateway)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=case)
async def test_no_request_gets_a_5xx(api: Any, case: tuple[str, str, dict[str, str]]) -> None:
    path, body, extra = case
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://fuzz") as c:
        r = await c.post(path, content=body.encode("utf-8", "surrogatepass"), headers=extra)
    assert r.status_code < 500, (case, r.status_code, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, r.text
