"""The ingress logic through its HTTP app, with fake engines in-process (no Ray).

Routing by ``model``, tenant keys, and every error the ingress itself answers, in vLLM's
error shape with the right status codes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.serve.ingress.gateway import Gateway
from fleetserve.serve.ingress.model_client import ModelOverloadedError, ModelUnavailableError
from fleetserve.serve.ingress.probes import ModelHealth

SPEC: dict[str, list[dict[str, Any]]] = {
    "models": [
        {"name": "alpha", "source": "fake"},
        {"name": "beta", "source": "fake", "tenant": "team-b"},
    ],
    "tenants": [
        {"name": "team-a", "api_keys": ["${KEY_A}"]},
        {"name": "team-b", "api_keys": ["${KEY_B}"]},
    ],
}
KEYS = {"KEY_A": "sk-a", "KEY_B": "sk-b"}


def chat(model: str | None = "alpha", **extra: object) -> dict[str, object]:
    body: dict[str, object] = {"messages": [{"role": "user", "content": "hi there"}]}
    if model is not None:
        body["model"] = model
    body.update(extra)
    return body


@pytest.fixture
async def open_gateway(gateways: Any) -> Gateway:
    gateway, _ = await gateways.build({"models": SPEC["models"][:1]})
    return gateway  # type: ignore[no-any-return]


@pytest.fixture
async def keyed_gateway(gateways: Any) -> Gateway:
    gateway, _ = await gateways.build(SPEC, KEYS)
    return gateway  # type: ignore[no-any-return]


async def test_routes_by_model_and_relays_engine_json(open_gateway: Gateway, gateways: Any) -> None:
    async with gateways.client(open_gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=3))
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "alpha"
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2"
    assert body["usage"]["completion_tokens"] == 3


async def test_streams_sse_through_unchanged(open_gateway: Gateway, gateways: Any) -> None:
    req = {"model": "alpha", "prompt": "a b", "max_tokens": 4, "stream": True}
    req["stream_options"] = {"include_usage": True}
    async with (
        gateways.client(open_gateway) as c,
        c.stream("POST", "/v1/completions", json=req) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == (
        "tok0 tok1 tok2 tok3"
    )
    assert chunks[-1]["usage"]["completion_tokens"] == 4


async def test_single_model_fleet_accepts_a_request_without_model(
    open_gateway: Gateway, gateways: Any
) -> None:
    async with gateways.client(open_gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat(None, max_tokens=1))
    assert r.status_code == 200


async def test_unknown_model_is_404_in_vllms_words(open_gateway: Gateway, gateways: Any) -> None:
    async with gateways.client(open_gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat("nope"))
    error = gateways.error(r, 404, "NotFoundError")
    assert error["message"] == "The model `nope` does not exist."


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object"), (b"", "JSON")],
)
async def test_bad_bodies_are_400(
    open_gateway: Gateway, content: bytes, message: str, gateways: Any
) -> None:
    async with gateways.client(open_gateway) as c:
        r = await c.post(
            "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
        )
    error = gateways.error(r, 400, "BadRequestError")
    assert message in str(error["message"])


async def test_engine_errors_pass_through_with_their_status(
    open_gateway: Gateway, gateways: Any
) -> None:
    async with gateways.client(open_gateway) as c:
        too_long = await c.post("/v1/chat/completions", json=chat(max_tokens=1000))
        bad_temp = await c.post("/v1/chat/completions", json=chat(temperature=-1))
    assert gateways.error(too_long, 400, "BadRequestError")["param"] == "max_tokens"
    assert gateways.error(bad_temp, 400, "BadRequestError")["param"] == "temperature"


async def test_models_list_and_card(open_gateway: Gateway, gateways: Any) -> None:
    async with gateways.client(open_gateway) as c:
        listing = (await c.get("/v1/models")).json()
        card = await c.get("/v1/models/alpha")
        missing = await c.get("/v1/models/zeta")
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["alpha"]
    assert listing["data"][0]["max_model_len"] == 64
    assert card.json()["id"] == "alpha"
    gateways.error(missing, 404, "NotFoundError")


async def test_health_and_ready(open_gateway: Gateway, gateways: Any) -> None:
    async with gateways.client(open_gateway) as c:
        health = await c.get("/health")
        ready = await c.get("/ready")
    assert health.status_code == 200
    assert ready.status_code == 200
    assert ready.json()["models"]["alpha"]["ready"] is True


# ---------------------------------------------------------------- tenants and keys


async def test_keys_required_when_any_tenant_has_keys(
    keyed_gateway: Gateway, gateways: Any
) -> None:
    async with gateways.client(keyed_gateway) as c:
        missing = await c.post("/v1/chat/completions", json=chat())
        wrong = await c.post(
            "/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer sk-x"}
        )
        basic = await c.post(
            "/v1/chat/completions", json=chat(), headers={"Authorization": "Basic sk-a"}
        )
        models = await c.get("/v1/models")
    for r in (missing, wrong, basic, models):
        gateways.error(r, 401, "AuthenticationError")


async def test_a_key_uses_its_tenants_and_untagged_models_only(
    keyed_gateway: Gateway, gateways: Any
) -> None:
    a = {"Authorization": "Bearer sk-a"}
    b = {"Authorization": "Bearer sk-b"}
    async with gateways.client(keyed_gateway) as c:
        a_alpha = await c.post("/v1/chat/completions", json=chat("alpha", max_tokens=1), headers=a)
        a_beta = await c.post("/v1/chat/completions", json=chat("beta", max_tokens=1), headers=a)
        b_beta = await c.post("/v1/chat/completions", json=chat("beta", max_tokens=1), headers=b)
        a_models = (await c.get("/v1/models", headers=a)).json()
        b_models = (await c.get("/v1/models", headers=b)).json()
        a_card = await c.get("/v1/models/beta", headers=a)
    assert a_alpha.status_code == 200
    assert b_beta.status_code == 200
    # Another tenant's model answers exactly like an unknown model.
    assert gateways.error(a_beta, 404, "NotFoundError")["message"] == (
        "The model `beta` does not exist."
    )
    gateways.error(a_card, 404, "NotFoundError")
    assert [m["id"] for m in a_models["data"]] == ["alpha"]
    assert [m["id"] for m in b_models["data"]] == ["alpha", "beta"]


async def test_model_is_required_when_the_caller_sees_several(
    keyed_gateway: Gateway, gateways: Any
) -> None:
    async with gateways.client(keyed_gateway) as c:
        b = await c.post(
            "/v1/chat/completions", json=chat(None), headers={"Authorization": "Bearer sk-b"}
        )
        a = await c.post(
            "/v1/chat/completions",
            json=chat(None, max_tokens=1),
            headers={"Authorization": "Bearer sk-a"},
        )
    assert gateways.error(b, 400, "BadRequestError")["param"] == "model"
    assert a.status_code == 200  # team-a sees one model


# ---------------------------------------------------------------- overload and drain


class FailingClient:
    """A model client whose replicas refuse, as Ray Serve does when overloaded."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        raise self.error
        yield b""  # pragma: no cover - makes this an async generator

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        raise ModelUnavailableError(f"model '{model}' has no replica")

    async def health(self) -> dict[str, ModelHealth]:
        # Overloaded replicas are running; an unavailable model has none.
        running = 0 if isinstance(self.error, ModelUnavailableError) else 1
        return {"alpha": ModelHealth(running=running)}


@pytest.mark.parametrize(
    ("error", "retry_after", "ready_status"),
    [
        (ModelOverloadedError("model 'alpha' is overloaded"), "1", 200),
        (ModelUnavailableError("gone"), "10", 503),
    ],
)
async def test_overload_and_unavailable_are_503_with_retry_after(
    error: Exception, retry_after: str, ready_status: int, gateways: Any
) -> None:
    gateway = gateways.over(FailingClient(error))
    async with gateways.client(gateway) as c:
        ready = await c.get("/ready")  # loads the fleet view
        r = await c.post("/v1/chat/completions", json=chat())
    gateways.error(r, 503, "ServiceUnavailableError")
    assert r.headers["retry-after"] == retry_after
    # Overload is not unreadiness (a probe must not pull a busy server); no replica is.
    assert ready.status_code == ready_status
    assert ready.json()["models"]["alpha"]["ready"] is (ready_status == 200)


async def test_draining_refuses_new_requests_with_503(open_gateway: Gateway, gateways: Any) -> None:
    open_gateway.draining = True
    async with gateways.client(open_gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat())
        ready = await c.get("/ready")
    gateways.error(r, 503, "ServiceUnavailableError")
    assert "retry-after" in r.headers
    assert ready.json()["status"] == "draining"


async def test_in_flight_counts_open_streams(gateways: Any) -> None:
    gateway, _ = await gateways.build({"models": SPEC["models"][:1]})
    req = {"model": "alpha", "prompt": "a", "max_tokens": 3, "stream": True}
    async with gateways.client(gateway) as c, c.stream("POST", "/v1/completions", json=req) as r:
        await r.aread()
    assert gateway.in_flight == 0
