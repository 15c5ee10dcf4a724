"""Flow control through real Ray Serve: a reader that stalls holds its engine, not memory.

One `fleetserve serve --engine fake` with no token delay, so the engine could write a large
response at once. The client reads the headers, then nothing for a while, through a socket
with a small receive buffer: past the buffers on the way (the kernel's, uvicorn's, the
relay's and the engine bridge's), the stream relay must pause the stream at the replica and
the bridge must hold the engine, instead of the whole response piling up in the ingress.
"""

from __future__ import annotations

import json
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "flow"
SPEC = f"""
models:
  - name: {MODEL}
    source: fake
    max_model_len: 4096
    resources: {{cpu: 0.5}}
"""
#: 16 choices x 3,500 tokens: ~56,000 SSE events, ~8 MiB, twice the most the kernel's
#: send buffer holds on loopback (tcp_wmem max 4 MiB) plus the relay's and bridge's bounds.
CHOICES, TOKENS = 16, 3500
#: How long the reader stalls; without flow control the fake engine writes the whole
#: response into the ingress in a few seconds.
STALL_S = 15.0


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, servers: Any) -> Iterator[str]:
    started = servers.start_fleetserve(
        tmp_path_factory.mktemp("flow"), SPEC, "flow control", fake_token_delay=0
    )
    yield started.url
    started.server.stop()


def engine_stats(url: str) -> dict[str, int]:
    r = httpx.get(f"{url}/ready?engine=1", timeout=30)
    return r.json()["models"][MODEL]  # type: ignore[no-any-return]


def test_a_stalled_reader_holds_its_engine_and_then_gets_every_event(url: str) -> None:
    aborted = engine_stats(url)["aborted"]
    body = {"model": MODEL, "prompt": "go", "max_tokens": TOKENS, "n": CHOICES, "stream": True}
    small = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)])
    texts: dict[int, list[str]] = defaultdict(list)
    done = False
    with (
        httpx.Client(transport=small, timeout=120) as http,
        http.stream("POST", f"{url}/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        time.sleep(STALL_S)  # read nothing
        # The engine still holds the request: it was stopped, not run to its end.
        assert engine_stats(url)["running"] == 1
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                choice = json.loads(line[6:])["choices"][0]
                texts[choice["index"]].append(choice["text"])
    # Reading again resumed it: every event of every choice, in order, nothing lost.
    assert done
    expected = ["tok0", *(f" tok{i}" for i in range(1, TOKENS))]
    assert sorted(texts) == list(range(CHOICES))
    assert all(texts[i] == expected for i in range(CHOICES))
    stats = engine_stats(url)
    assert stats["running"] == 0
    assert stats["aborted"] == aborted
