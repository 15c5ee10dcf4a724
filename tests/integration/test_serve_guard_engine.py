"""Issue #9 on the real engine (the session's `fleetserve serve`, vLLM): a non-streamed
request is aborted when its client leaves, and a short bounded fuzz gets no 5xx."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]

MODEL = "gemma-3-270m"


def _engine(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/ready?engine=1", timeout=30)
    return r.json()["models"][MODEL]  # type: ignore[no-any-return]


def test_a_non_streamed_request_is_aborted_when_the_client_leaves(fleetserve_url: str) -> None:
    before = _engine(fleetserve_url)["aborted"]
    body = {
        "model": MODEL,
        "prompt": "Write a very long story about the sea.",
        "max_tokens": 3000,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fleetserve_url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=3))
    left = time.monotonic()
    stats = _engine(fleetserve_url)
    while time.monotonic() - left < 10 and (stats["running"] or stats["aborted"] <= before):
        time.sleep(0.2)
        stats = _engine(fleetserve_url)
    assert stats["aborted"] == before + 1
    assert stats["running"] == 0  # the engine stopped generating for nobody


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=10),
)
fields = {
    "model": st.one_of(st.just(MODEL), junk),
    "max_tokens": st.one_of(st.integers(-2, 8), junk),
    "temperature": st.one_of(st.floats(-1, 3), junk),
    "n": st.one_of(st.integers(-1, 3), junk),
    "stream": st.one_of(st.booleans(), junk),
    "stop": junk,
    "logprobs": junk,
}
chat = st.fixed_dictionaries(
    {
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "x"]),
                        "content": st.one_of(st.text(max_size=30), junk),
                    }
                ),
                max_size=2,
            ),
            junk,
        )
    },
    optional=fields,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=chat)
def test_bounded_fuzz_gets_no_5xx(fleetserve_url: str, body: dict[str, Any]) -> None:
    r = httpx.post(f"{fleetserve_url}/v1/chat/completions", content=json.dumps(body), timeout=120)
    assert r.status_code < 500, (body, r.status_code, r.text)
