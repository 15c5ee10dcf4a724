"""Gateway metrics through the real HTTP app with fake engines (no Ray).

Requests, tokens, TTFT, latency and rejections are recorded with bounded labels: tenants and
models only from what the gateway serves, never from request data. The memory sink refuses
tag sets that do not match the metric definitions, as Ray's metrics do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.observe import metrics as m
from fleetserve.serve.guard.usage import Usage, UsageScanner, usage_from_body
from fleetserve.serve.ingress.gateway import Gateway
from fleetserve.serve.ingress.metrics import (
    NO_TENANT,
    UNKNOWN,
    GatewayMetrics,
    LabelBounds,
    MemorySink,
    RequestTags,
)
from fleetserve.serve.ingress.model_client import ModelOverloadedError

SPEC = {
    "models": [
        {"name": "alpha", "source": "fake"},
        {"name": "beta", "source": "fake", "tenant": "team-b"},
    ],
    "tenants": [
        {"name": "team-a", "api_keys": ["${KEY_A}"]},
        {"name": "team-b", "api_keys": ["${KEY_B}"]},
    ],
}
A = {"Authorization": "Bearer sk-a"}
B = {"Authorization": "Bearer sk-b"}


async def make_gateway(gateways: Any, sink: MemorySink) -> Gateway:
    gateway, _ = await gateways.build(SPEC, {"KEY_A": "sk-a", "KEY_B": "sk-b"}, metrics_sink=sink)
    return gateway  # type: ignore[no-any-return]


async def test_requests_tokens_and_latency_by_model_tenant_endpoint_status(gateways: Any) -> None:
    sink = MemorySink()
    gateway = await make_gateway(gateways, sink)
    async with gateways.client(gateway) as c:
        ok = await c.post(
            "/v1/completions",
            headers=A,
            json={"model": "alpha", "prompt": "a b c", "max_tokens": 4},
        )
        assert ok.status_code == 200
        usage = ok.json()["usage"]
        bad = await c.post(
            "/v1/completions", headers=B, json={"model": "beta", "prompt": "x", "max_tokens": -1}
        )
        assert bad.status_code == 400
        await c.get("/v1/models", headers=A)
        await c.get("/health")
        await c.get("/ready")
    assert (
        sink.counter(
            m.GATEWAY_REQUESTS,
            model="alpha",
            tenant="team-a",
            endpoint="/v1/completions",
            status_code="200",
        )
        == 1
    )
    assert (
        sink.counter(
            m.GATEWAY_REQUESTS,
            model="beta",
            tenant="team-b",
            endpoint="/v1/completions",
            status_code="400",
        )
        == 1
    )
    assert (
        sink.counter(
            m.GATEWAY_REQUESTS,
            model=UNKNOWN,
            tenant=UNKNOWN,
            endpoint="/v1/models",
            status_code="200",
        )
        == 1
    )
    # Probes are not client traffic.
    assert all(s["endpoint"] != "other" for s in sink.series(m.GATEWAY_REQUESTS))
    assert (
        sink.counter(m.GATEWAY_PROMPT_TOKENS, model="alpha", tenant="team-a")
        == usage["prompt_tokens"]
    )
    assert (
        sink.counter(m.GATEWAY_COMPLETION_TOKENS, model="alpha", tenant="team-a")
        == usage["completion_tokens"]
    )
    latency = sink.observations[
        (
            m.GATEWAY_LATENCY.recorded,
            (("endpoint", "/v1/completions"), ("model", "alpha"), ("tenant", "team-a")),
        )
    ]
    assert len(latency) == 1
    assert 0 < latency[0] < 10
    # Non-streamed responses have no first token the gateway could see.
    assert not sink.series(m.GATEWAY_TTFT)
    # The in-flight gauge is back at zero once the responses are done.
    assert sink.gauges[(m.GATEWAY_IN_FLIGHT.recorded, (("model", "alpha"),))] == 0


async def test_streams_record_ttft_and_usage_when_the_client_asks_for_it(gateways: Any) -> None:
    sink = MemorySink()
    gateway = await make_gateway(gateways, sink)
    req = {
        "model": "alpha",
        "prompt": "a b",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        gateways.client(gateway) as c,
        c.stream("POST", "/v1/completions", headers=A, json=req) as r,
    ):
        body = await r.aread()
    assert b"[DONE]" in body
    scanner = UsageScanner()
    scanner.feed(body)
    assert scanner.usage is not None
    assert scanner.usage.completion_tokens == 5
    assert sink.counter(m.GATEWAY_COMPLETION_TOKENS, model="alpha", tenant="team-a") == 5
    ttft = sink.observations[(m.GATEWAY_TTFT.recorded, (("model", "alpha"), ("tenant", "team-a")))]
    assert len(ttft) == 1
    # Without include_usage the stream carries no usage: nothing is counted (vLLM's rule).
    req.pop("stream_options")
    async with (
        gateways.client(gateway) as c,
        c.stream("POST", "/v1/completions", headers=A, json=req) as r,
    ):
        await r.aread()
    assert sink.counter(m.GATEWAY_COMPLETION_TOKENS, model="alpha", tenant="team-a") == 5
    assert len(ttft) == 2


async def test_rejections_by_reason_and_labels_never_come_from_request_data(gateways: Any) -> None:
    sink = MemorySink()
    gateway = await make_gateway(gateways, sink)
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/completions", json={"model": "alpha", "prompt": "a"})
        assert r.status_code == 401
        r = await c.post(
            "/v1/completions", headers=A, json={"model": "made-up-model-x", "prompt": "a"}
        )
        assert r.status_code == 404
        # team-a may not see team-b's model: still counted as the model it asked for, which the
        # spec knows; the tenant is the caller's.
        r = await c.post("/v1/completions", headers=A, json={"model": "beta", "prompt": "a"})
        assert r.status_code == 404
        gateway.draining = True
        r = await c.post("/v1/completions", headers=A, json={"model": "alpha", "prompt": "a"})
        assert r.status_code == 503
    assert sink.counter(m.GATEWAY_REJECTIONS, model=UNKNOWN, tenant=UNKNOWN, reason="auth") == 1
    assert sink.counter(m.GATEWAY_REJECTIONS, model=UNKNOWN, tenant=UNKNOWN, reason="draining") == 1
    models = {s["model"] for s in sink.series(m.GATEWAY_REQUESTS)}
    assert models <= {"alpha", "beta", UNKNOWN}
    assert "made-up-model-x" not in str(sink.counters)


class Overloaded:
    async def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        raise ModelOverloadedError("busy")
        yield b""  # pragma: no cover - makes this an async generator

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        raise NotImplementedError


async def test_overload_is_a_rejection_and_a_503(gateways: Any) -> None:
    sink = MemorySink()
    gateway = gateways.over(Overloaded(), metrics_sink=sink)
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json={"model": "alpha", "messages": []})
    assert r.status_code == 503
    assert (
        sink.counter(m.GATEWAY_REJECTIONS, model="alpha", tenant=NO_TENANT, reason="overload") == 1
    )
    assert (
        sink.counter(
            m.GATEWAY_REQUESTS,
            model="alpha",
            tenant=NO_TENANT,
            endpoint="/v1/chat/completions",
            status_code="503",
        )
        == 1
    )


def test_label_bounds_and_reasons() -> None:
    bounds = LabelBounds.of(["alpha"], ["team-a"])
    assert bounds.model("alpha") == "alpha"
    assert bounds.model("x" * 500) == UNKNOWN
    assert bounds.model(42) == UNKNOWN
    assert bounds.tenant(None) == NO_TENANT
    assert bounds.tenant("team-a") == "team-a"
    assert bounds.tenant("team-z") == UNKNOWN
    metrics = GatewayMetrics(bounds, MemorySink())
    with pytest.raises(ValueError, match="not one of"):
        metrics.record_rejection("alpha", None, "because")


def test_memory_sink_refuses_wrong_tags_like_ray() -> None:
    sink = MemorySink()
    with pytest.raises(ValueError, match="tag keys"):
        sink.inc(m.GATEWAY_REQUESTS, {"model": "a"})
    with pytest.raises(ValueError, match="cannot observe"):
        sink.observe(m.GATEWAY_REQUESTS, {}, 1.0)
    # The recorder swallows a failing sink: a lost sample never fails a request.
    metrics = GatewayMetrics(LabelBounds.of([], []), sink)
    tags = RequestTags(endpoint="/v1/completions")
    metrics.record_request(tags, 200, 0.1)
    assert sink.series(m.GATEWAY_REQUESTS) == [
        {"model": UNKNOWN, "tenant": UNKNOWN, "endpoint": "/v1/completions", "status_code": "200"}
    ]


def test_usage_parsing_is_lenient() -> None:
    assert usage_from_body(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2}}') == Usage(
        3, 2
    )
    assert usage_from_body(b'{"usage": {"prompt_tokens": 3}}') == Usage(3, 0)  # embeddings
    assert usage_from_body(b'{"usage": null}') is None
    assert usage_from_body(b'not json but has "usage"') is None
    assert usage_from_body(b"{}") is None
    scanner = UsageScanner()
    scanner.feed(
        b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n'
    )
    scanner.feed(
        b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}}\n\n'
    )
    scanner.feed(b"data: [DONE]\n\n")
    assert scanner.usage == Usage(1, 4)
