"""``frontend: process`` on the real engine: the replica's own ``vllm serve`` on a Unix socket.

The engine adapter's seams are in tests/unit/engine/test_vllm_process.py; here the whole
path runs on the session's ``process_fleet`` (the default fleet with ``frontend: process``,
tests/integration/conftest.py): the official ``openai`` SDK through the ingress, Serve
and the relay to a replica that forwards to vLLM's server beside it. It must answer as
that `vllm serve` does when asked on its own socket (greedy: same text, usage and error
bodies), abort what a client leaves, report the engine's load to the routers, export the
engine's series through Ray, and leave no process behind when the fleet stops.

That server is also the session's `vllm serve` of the default model (the parity tests
compare the in-replica frontend with it), so it runs compiled, with the default fleet's
engine options, and this file starts no engine of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.engine.compile_cache import AOT_COMPILE_ENV
from fleetserve.engine.signals import (
    GENERATED_SERIES,
    KV_CAPACITY_TOKENS,
    RUNNING_SERIES,
    SERIES,
    metrics_values,
)
from fleetserve.observe.metrics import ALL_METRICS, ray_exported_name
from fleetserve.spec import DEFAULT_MODEL_NAME as MODEL
from fleetserve.spec import DEFAULT_MODEL_SOURCE

from .conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

#: A stream that would run for minutes: what a test breaks or leaves mid-way.
LONG_STREAM = {
    "model": MODEL,
    "prompt": "Once upon a time",
    "max_tokens": 3000,
    "ignore_eos": True,
    "stream": True,
}


def engine_metrics(socket: str) -> str:
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket), timeout=10) as c:
        return c.get("http://engine/metrics").text


def running(socket: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in engine_metrics(socket).splitlines()
        if line.startswith("vllm:num_requests_running")
    )


def test_answers_as_vllm_serve_does(process_fleet: Any) -> None:
    # the replica's server runs beside it, not inside: one vllm serve per replica, and
    # fleetserve says so as it starts
    (socket,) = process_fleet.engine_sockets()
    started = " ".join(process_fleet.server.log.read_text(errors="replace").split())  # unwrapped
    assert f"{MODEL} ({DEFAULT_MODEL_SOURCE}, its vLLM server beside the replica)" in started
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0,
    }
    transport = httpx.HTTPTransport(uds=socket)
    with httpx.Client(base_url="http://engine", transport=transport, timeout=300) as vllm:
        ours = httpx.post(f"{process_fleet.url}/v1/chat/completions", json=body, timeout=300)
        theirs = vllm.post("/v1/chat/completions", json=body)
        assert ours.status_code == theirs.status_code == 200, ours.text
        a, b = ours.json(), theirs.json()
        assert a["choices"][0]["message"] == b["choices"][0]["message"]
        assert a["usage"] == b["usage"]
        # vLLM's own validation error, byte for byte in its body
        bad = {"model": MODEL, "messages": [], "max_tokens": 4}
        ours = httpx.post(f"{process_fleet.url}/v1/chat/completions", json=bad, timeout=60)
        theirs = vllm.post("/v1/chat/completions", json=bad)
        assert ours.status_code == theirs.status_code == 400
        assert ours.json() == theirs.json()


def test_streams_through_the_openai_sdk(process_fleet: Any) -> None:
    client = openai.OpenAI(base_url=f"{process_fleet.url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text
    assert usage is not None
    assert usage.completion_tokens == 16


def test_a_client_that_leaves_aborts_its_request(process_fleet: Any) -> None:
    (socket,) = process_fleet.engine_sockets()
    with httpx.stream(
        "POST", f"{process_fleet.url}/v1/completions", json=LONG_STREAM, timeout=300
    ) as r:
        assert r.status_code == 200
        # The iterator is held, not left by `break`: a generator left that way is closed at
        # once, and httpx then closes the connection - the very abort this test waits for,
        # before it has read the gauge (CI read 0 that way after one line).
        lines = r.iter_lines()
        seen = [next(lines)]
        # vLLM's gauge moves with its stat logging, not with the first bytes: read on until
        # the engine's own count shows the request
        began = time.monotonic()
        while running(socket) != 1 and time.monotonic() - began < 60:
            seen.append(next(lines))
        assert running(socket) == 1, (len(seen), seen[:2], seen[-2:])
    # without the abort the engine would generate for minutes here
    deadline = time.monotonic() + 30
    while running(socket) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running(socket) == 0


def test_vllms_server_gets_the_in_replica_engines_compile_environment(
    process_fleet: Any, servers: Any
) -> None:
    # the same environment as the in-replica engine's (engine/compile_cache.py)
    pids = list(process_fleet.engine_servers())
    assert pids, process_fleet.processes()
    found = {pid: servers.environ(pid).get(AOT_COMPILE_ENV) for pid in pids}
    assert found == dict.fromkeys(pids, "0")


def test_vllms_log_is_in_the_replica_workers_log(process_fleet: Any, servers: Any) -> None:
    """What vLLM's server prints (here: the KV cache it sized) lands in the file Ray keeps
    for the replica's worker, as the in-replica engine's output does - not in Serve's
    buffered logger, where it stayed unseen."""
    (pid,) = process_fleet.engine_servers()
    replica = servers.ppid(pid)
    log = Path(os.readlink(f"/proc/{replica}/fd/2"))
    assert log.name.endswith(".err"), log
    text = log.read_text(errors="replace")
    assert "KV cache size" in text, text[-2000:]


def test_the_routers_signals_read_vllms_own_metrics(process_fleet: Any) -> None:
    """The replica's routing signals come from its server's /metrics by series name: every
    name must be one this vLLM exports (a renamed series would leave routing blind)."""
    (socket,) = process_fleet.engine_sockets()
    r = httpx.post(
        f"{process_fleet.url}/v1/completions",
        json={"model": MODEL, "prompt": "Hi there", "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    found = metrics_values(engine_metrics(socket))
    assert set(found) == {*SERIES, RUNNING_SERIES, GENERATED_SERIES, KV_CAPACITY_TOKENS}
    assert found[KV_CAPACITY_TOKENS] > 0
    assert found[GENERATED_SERIES] >= 2


def sums(text: str) -> dict[str, float]:
    """Each sample name's total over its label sets (``le`` buckets kept apart)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            le = s.labels.get("le")
            key = s.name if le is None else f"{s.name}{{le={float(le):g}}}"
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def test_the_engines_metrics_reach_rays_export_as_the_in_replica_engines_do(
    process_fleet: Any,
) -> None:
    """Dashboards, alerts and ``fleetserve top`` read ``ray_vllm_*``. The replica relays its
    server's /metrics to Ray's (engine/metrics_relay.py): every vLLM series the dashboards
    name is exported with the server's counts - counters and histogram buckets equal to
    what the server itself says - and tagged with the replica."""
    (socket,) = process_fleet.engine_sockets()
    for prompt in ("One", "Two two", "Three three three"):
        r = httpx.post(
            f"{process_fleet.url}/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 3},
            timeout=120,
        )
        assert r.status_code == 200, r.text
    server = sums(engine_metrics(socket))
    pairs = {
        ray_exported_name(name, "counter"): server[name]
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    }
    ttft = "vllm:time_to_first_token_seconds"
    for suffix in ("_count", "_bucket{le=0.1}", "_bucket{le=inf}"):
        pairs[ray_exported_name(ttft, "histogram") + suffix] = server[ttft + suffix]
    assert pairs["ray_vllm_time_to_first_token_seconds_count"] >= 3
    # Ray's agent exports what its workers reported within its last interval (10 s)
    deadline, exported = time.monotonic() + 90, {}
    while time.monotonic() < deadline:
        exported = sums(httpx.get(process_fleet.metrics_url, timeout=10).text)
        if all(exported.get(k) == v for k, v in pairs.items()):
            break
        time.sleep(2)
    assert {k: exported.get(k) for k in pairs} == pairs
    # every vLLM series a panel names is there (a counter at 0 is never exported: none are
    # asked for that the requests above leave at 0)
    at_zero = {
        m.recorded
        for m in ALL_METRICS
        if m.kind == "counter"
        and not server.get(m.recorded if m.recorded.endswith("_total") else f"{m.recorded}_total")
    }
    wanted = {
        m.count if m.kind == "histogram" else m.name
        for m in ALL_METRICS
        if m.source == "vllm" and m.recorded not in at_zero
    }
    assert wanted <= set(exported), sorted(wanted - set(exported))
    text = httpx.get(process_fleet.metrics_url, timeout=10).text
    replicas = {
        s.labels.get("ReplicaId")
        for f in text_string_to_metric_families(text)
        if f.name.startswith("ray_vllm_")
        for s in f.samples
    }
    assert len(replicas) == 1
    assert replicas != {""}


def test_a_dead_engine_ends_its_streams_and_is_refused_at_once(
    retiring_process_fleet: Any, servers: Any
) -> None:
    """vLLM's engine core killed under the server beside the replica (the OOM killer, a
    GPU fault): the stream in flight ends with an error event, not a silent cut; vLLM's
    server exits, as fleetserve counts on; and every request after it is refused at once
    with 503 + Retry-After until Serve replaces the replica - never a 500 from the dead
    engine, never held. (Serve's replacement of a replica is tested on the fake engine,
    tests/integration/test_serve_chaos.py; here what is vLLM's own: how its server dies.)"""
    fleet = retiring_process_fleet
    fleet.engine_sockets()  # kept for the next test's check that none is left
    (server,) = fleet.engine_servers()
    engine = [pid for pid in fleet.processes() if servers.ppid(pid) == server]
    assert engine, fleet.processes()
    stream = servers.Stream(f"{fleet.url}/v1/completions", LONG_STREAM)
    assert stream.first.wait(60)
    for pid in engine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert stream.join(90), "the stream did not end after its engine died"
    assert stream.events[-1] == "[DONE]", stream.events[-3:]
    assert '"error"' in stream.events[-2], stream.events[-3:]
    # vllm serve exits once its engine core is gone (what the replica's refusal reads)
    deadline = time.monotonic() + 60
    while server in fleet.processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server not in fleet.processes(), "vLLM's server outlived its engine core"
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    for _ in range(5):
        began = time.monotonic()
        r = httpx.post(f"{fleet.url}/v1/completions", json=body, timeout=60)
        took = time.monotonic() - began
        if r.status_code == 200:  # Serve already runs a new replica: nothing to refuse
            break
        assert r.status_code == 503, r.text
        assert "retry-after" in r.headers, r.headers
        assert took < 12, took  # at most one health-check period before Serve knows
        time.sleep(0.5)


def test_nothing_is_left_after_the_fleet_stops(retiring_process_fleet: Any) -> None:
    """Stopped after its engine died (the test above), maybe while Serve starts the
    replica that replaces it: no process of the fleet is left, nor the socket directory
    of any of its servers."""
    process_fleet = retiring_process_fleet
    process_fleet.engine_sockets()  # a replacement's server, if one runs by now
    sockets = process_fleet.seen_sockets
    assert sockets
    process_fleet.server.stop()
    deadline = time.monotonic() + 60
    while process_fleet.processes() and time.monotonic() < deadline:
        time.sleep(1)
    assert process_fleet.processes() == {}
    assert [s for s in sockets if Path(s).parent.exists()] == []


def test_the_ingress_reads_each_stream_from_vllms_server_itself(process_fleet: Any) -> None:
    # server.stream_handoff (on by default): the replica admits each request and hands its
    # stream to the ingress on its node, which reads it from vLLM's server directly
    def counters() -> dict[str, int]:
        r = httpx.get(f"{process_fleet.url}/ready?engine=1", timeout=60)
        detail: dict[str, int] = r.json()["models"][MODEL]
        return detail

    before = counters()
    client = openai.OpenAI(base_url=f"{process_fleet.url}/v1", api_key="none", max_retries=0)
    for stream in (False, True):
        out = client.completions.create(
            model=MODEL, prompt="Say hi.", max_tokens=4, temperature=0, stream=stream
        )
        if stream:
            assert "".join(c.choices[0].text for c in out if c.choices)  # type: ignore[union-attr]
    # the replica counts a handed-off stream done when the ingress's RELEASE reaches it,
    # which is after the client has read the stream's end: wait for it, not for the reply
    after = wait_until(
        lambda: (c := counters())["completed"] - before["completed"] >= 2 and c,
        60,
        "both streams released to the replica",
        lambda: (before, counters()),
    )
    assert after["handed_off"] - before["handed_off"] == 2, (before, after)
    assert after["completed"] - before["completed"] == 2, (before, after)
    assert after["in_flight"] == 0, (before, after)
