"""Request limits, Serve control headers and timeouts through real Ray Serve (fake engine).

One `fleetserve serve --engine fake` (direct ingress, so the HTTP server is the ingress
replica's uvicorn with fleetserve's guarded protocol) with tight limits; raw sockets play
the slow or oversized clients. The last test stops the server through its drain timeout.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "guarded"
SPEC = f"""
models:
  - name: {MODEL}
    source: fake
    max_model_len: 4096
    resources: {{cpu: 0.5}}
server:
  max_body_mb: 8
  max_header_count: 50
  max_header_bytes: 16384
  max_header_value_bytes: 4096
  header_timeout_s: 2
  body_timeout_s: 2
  request_timeout_s: 8
  drain_timeout_s: 1.5
"""
MIB = 2**20


class Fleet:
    def __init__(self, server: Any, url: str, port: int) -> None:
        self.server = server
        self.url = url
        self.port = port


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, servers: Any) -> Iterator[Fleet]:
    started = servers.start_fleetserve(
        tmp_path_factory.mktemp("guard"), SPEC, "guard", fake_token_delay=0.05
    )
    yield Fleet(started.server, started.url, started.port)
    started.server.stop()


def chat(max_tokens: int = 2, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return {**body, "max_tokens": max_tokens, **extra}


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == status
    return error  # type: ignore[no-any-return]


def raw_exchange(port: int, parts: list[bytes], pause_s: float = 0.0) -> tuple[bytes, float]:
    """Send ``parts`` (pausing between them), then read until the server closes."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            for part in parts:
                s.sendall(part)
                if pause_s:
                    time.sleep(pause_s)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-send: what the server answered is read below
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data, time.monotonic() - start


def status_and_json(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body)


# ---------------------------------------------------------------- bodies


def test_a_body_over_4_mib_crosses_the_replica_hop(fleet: Fleet) -> None:
    # Ray Serve's gRPC hop refuses messages over 4 MiB unless fleetserve raised it.
    content = "x" * (5 * MIB)
    r = httpx.post(
        f"{fleet.url}/v1/chat/completions",
        json={**chat(), "messages": [{"role": "user", "content": content}]},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_a_body_over_the_limit_is_413(fleet: Fleet) -> None:
    r = httpx.post(
        f"{fleet.url}/v1/chat/completions",
        content=b'{"pad": "' + b"x" * (9 * MIB) + b'"}',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert error_of(r, 413)["type"] == "RequestEntityTooLargeError"


def test_a_slow_body_is_408(fleet: Fleet) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    data, took = raw_exchange(fleet.port, [head, b'{"model": '])
    status, body = status_and_json(data)
    assert status == 408
    assert body["error"]["type"] == "RequestTimeoutError"
    assert took < 10


# ---------------------------------------------------------------- headers


def test_slow_headers_are_cut(fleet: Fleet) -> None:
    data, took = raw_exchange(fleet.port, [b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"])
    status, body = status_and_json(data)
    assert status == 408
    assert "headers" in body["error"]["message"]
    assert 1.5 < took < 8


def test_an_idle_connection_is_closed(fleet: Fleet) -> None:
    data, took = raw_exchange(fleet.port, [])
    assert data.startswith(b"HTTP/1.1 408")
    assert took < 8


@pytest.mark.parametrize(
    "headers",
    [
        [f"x-h{i}: v" for i in range(10_000)],  # many headers
        ["x-big: " + "v" * 100_000],  # one 100 KB header
        ["Authorization: Bearer " + "k" * MIB],  # a 1 MB key
    ],
    ids=["10000-headers", "100KB-header", "1MB-authorization"],
)
def test_oversized_headers_are_431_before_they_are_read(fleet: Fleet, headers: list[str]) -> None:
    block = "\r\n".join(["POST /v1/chat/completions HTTP/1.1", "Host: x", *headers]).encode()
    chunks = [block[i : i + 16384] for i in range(0, len(block), 16384)]
    data, _ = raw_exchange(fleet.port, [*chunks, b"\r\n\r\n"])
    status, body = status_and_json(data)
    assert status == 431
    assert body["error"]["type"] == "RequestHeaderFieldsTooLargeError"


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-request-timeout-seconds", "0"), ("x-request-disconnect-disabled", "?1")],
)
def test_clients_cannot_lift_serve_limits(fleet: Fleet, name: str, value: str) -> None:
    r = httpx.post(
        f"{fleet.url}/v1/chat/completions", json=chat(), headers={name: value}, timeout=30
    )
    assert error_of(r, 400)["param"] == name


# ---------------------------------------------------------------- timeouts


def test_a_stream_outliving_the_request_timeout_ends_with_an_error_event(fleet: Fleet) -> None:
    with httpx.stream(
        "POST", f"{fleet.url}/v1/chat/completions", json=chat(400, stream=True), timeout=60
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 504
    assert "request timeout (8 s)" in error["message"]


def test_a_non_stream_timeout_is_a_json_504(fleet: Fleet) -> None:
    r = httpx.post(f"{fleet.url}/v1/chat/completions", json=chat(400), timeout=60)
    assert error_of(r, 504)["type"] == "TimeoutError"


def test_probes_answer_quickly(fleet: Fleet) -> None:
    for path in ("/health", "/ready"):
        start = time.monotonic()
        r = httpx.get(fleet.url + path, timeout=10)
        assert r.status_code == 200
        assert time.monotonic() - start < 1.0


def test_drain_timeout_ends_streams_with_an_error_event(fleet: Fleet, servers: Any) -> None:
    """Runs last: SIGTERM stops the module's server (drain_timeout_s 1.5 < the stream)."""
    stream = servers.Stream(f"{fleet.url}/v1/chat/completions", chat(140, stream=True), 60)
    assert stream.first.wait(30)
    fleet.server.proc.send_signal(signal.SIGTERM)
    stream.join(60)
    events = stream.events
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503
    assert "drain timeout" in error["message"]
    assert fleet.server.proc.wait(120) == 0
