"""``frontend: process``'s seams without vLLM: the spec's refusals, the engine choice, the
signals read from a server's Prometheus text, and the forwarding over a Unix socket (a
small aiohttp server stands in for ``vllm serve``; the real one is in
tests/integration/test_serve_frontend_process.py)."""

from __future__ import annotations

import asyncio
import collections
import io
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fleetserve.engine import vllm_process
from fleetserve.engine.config import EngineConfig, vllm_server_argv
from fleetserve.engine.factory import create_engine
from fleetserve.engine.protocol import EngineRequest, ResponseHead
from fleetserve.engine.settings import EngineSettings
from fleetserve.engine.signals import (
    KV_CACHE_USAGE,
    KV_CAPACITY_TOKENS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    TOKENS_PER_S,
    WAITING,
    MetricsSignals,
    metrics_values,
)
from fleetserve.engine.vllm_process import VllmProcessEngine
from fleetserve.errors import EngineError
from fleetserve.spec import parse_spec

#: The shape of a ``vllm serve``'s /metrics (vLLM 0.26-0.32): labelled gauges and counters,
#: histograms, the cache's configuration as the labels of an info gauge.
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="512"} 1.0
"""


def config(**fields: Any) -> EngineConfig:
    settings = EngineSettings(
        gpu_memory_utilization=0.5, max_num_seqs=8, max_model_len=1024, max_num_batched_tokens=1024
    )
    return EngineConfig(name="m", model_path="/models/m", settings=settings, **fields)


def spec(**model: Any) -> Any:
    return parse_spec({"models": [{"name": "m", "source": "/models/m", **model}]}, "fleet.yaml")


def test_the_spec_refuses_what_the_server_beside_the_replica_cannot_run(tmp_path: Path) -> None:
    assert spec(frontend="process").models[0].frontend == "process"
    assert spec().models[0].frontend == "auto"  # resolved by the plan (test_one_writer.py)
    # auto is never refused: where the server beside the replica cannot run, it is `replica`
    assert spec(tensor_parallel=2, adapter_dir=str(tmp_path)).models[0].frontend == "auto"
    with pytest.raises(Exception, match="frontend 'process' with tensor_parallel 2"):
        spec(frontend="process", tensor_parallel=2)
    with pytest.raises(Exception, match="frontend 'process' with adapter_dir"):
        spec(frontend="process", adapter_dir=str(tmp_path))
    with pytest.raises(Exception, match="frontend"):
        spec(frontend="thread")


def test_the_factory_chooses_by_frontend() -> None:
    assert isinstance(create_engine(config(frontend="process")), VllmProcessEngine)
    # a plan that chose tensor parallelism for it is refused with the field to change
    with pytest.raises(EngineError, match="set frontend: replica"):
        create_engine(config(frontend="process", tensor_parallel=2))


def test_the_server_listens_on_a_unix_socket() -> None:
    argv = vllm_server_argv(["--model", "m"], uds="/tmp/x/vllm.sock")
    assert argv[-2:] == ["--uds", "/tmp/x/vllm.sock"]
    assert "--port" not in argv
    assert vllm_server_argv(["--model", "m"], host="h", port=9)[-4:] == [
        "--host",
        "h",
        "--port",
        "9",
    ]


def test_signals_are_read_from_the_servers_prometheus_text() -> None:
    found = metrics_values(METRICS)
    assert found[KV_CAPACITY_TOKENS] == 512 * 16
    assert found["vllm:num_requests_waiting"] == 2.0
    signals = MetricsSignals()
    signals.update(METRICS, now=10.0)
    assert signals.values == {
        WAITING: 2.0,
        KV_CACHE_USAGE: 0.25,
        PREFIX_QUERIES: 400.0,
        PREFIX_HITS: 100.0,
        KV_CAPACITY_TOKENS: 8192.0,
    }
    assert signals.running == 5  # running and waiting: what the engine still holds
    signals.update(METRICS.replace("} 1000.0", "} 1500.0"), now=12.0)
    assert signals.values[TOKENS_PER_S] == 250.0


def test_one_engine_per_label_set_is_summed_and_junk_is_skipped() -> None:
    text = METRICS + 'vllm:num_requests_waiting{engine="1",model_name="m"} 4.0\nvllm:bad{'
    text += '\nvllm:num_requests_waiting{engine="2"} notanumber\n'
    assert metrics_values(text)["vllm:num_requests_waiting"] == 6.0


# -- forwarding over the socket ----------------------------------------------------------

#: The stand-in server and the adapter's pool live on the shared fixture's loop (the
#: session's: pyproject's asyncio_default_fixture_loop_scope).
on_session_loop = pytest.mark.asyncio(loop_scope="session")


async def collect(items: AsyncIterator[ResponseHead | bytes]) -> list[ResponseHead | bytes]:
    return [i async for i in items]


@on_session_loop
async def test_a_stream_is_forwarded_head_first_and_a_left_one_is_closed(
    process_stand_in: Any,
) -> None:
    closed = asyncio.Event()
    seen: dict[str, Any] = {}

    async def chat(request: web.Request) -> web.StreamResponse:
        seen["body"] = await request.read()
        seen["headers"] = request.headers.copy()
        seen["query"] = request.query_string
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Id": "7"})
        await response.prepare(request)
        try:
            for i in range(10_000):
                await response.write(f"data: {i}\n\n".encode())
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            closed.set()
        return response

    async def bad(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no", "code": 400}}, status=400)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", bad)
    engine = await process_stand_in.start(app)
    request = EngineRequest(
        "POST",
        "/v1/chat/completions",
        b'{"stream": true}',
        (("content-type", "application/json"), ("host", "x"), ("x-request-id", "r1")),
        "a=1",
    )
    items = engine.handle(request)
    head = await anext(items)
    assert head == ResponseHead(200, (("x-id", "7"),), "text/event-stream")
    assert (await anext(items)).startswith(b"data: 0")
    assert engine.stats().in_flight == 1
    await items.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(closed.wait(), 5)  # the server saw the client leave
    assert seen["body"] == b'{"stream": true}'
    assert seen["headers"].get("x-request-id") == "r1"
    assert seen["headers"].get("host") != "x"  # the hop's own
    assert seen["query"] == "a=1"
    stats = engine.stats()
    assert (stats.in_flight, stats.aborted, stats.completed) == (0, 1, 0)

    out = await collect(engine.handle(EngineRequest("POST", "/v1/completions", b"{}")))
    assert out[0] == ResponseHead(400, (), "application/json; charset=utf-8")
    assert b"".join(o for o in out[1:] if isinstance(o, bytes)).startswith(b'{"error"')
    assert engine.stats().completed == 1


@on_session_loop
async def test_a_dead_server_is_refused_and_unhealthy(
    process_stand_in: Any,
) -> None:
    app = web.Application()
    app.router.add_get("/health", lambda r: web.Response(status=200))
    engine = await process_stand_in.start(app)
    await engine.check_health()
    process_stand_in.proc.kill()
    process_stand_in.proc.wait()
    assert not engine.stats().alive
    with pytest.raises(EngineError, match="its engine stopped; retry later"):
        engine.handle(EngineRequest("POST", "/v1/completions", b"{}"))
    with pytest.raises(EngineError, match="exited"):
        await engine.check_health()


@on_session_loop
async def test_adapters_are_the_servers_models_whose_parent_is_the_base(
    process_stand_in: Any,
) -> None:
    from fleetserve.engine.config import LoraSettings  # noqa: PLC0415

    models = {
        "data": [
            {"id": "m", "parent": None},
            {"id": "sql", "parent": "m"},
            {"id": "legal", "parent": "m"},
            {"id": "other", "parent": "elsewhere"},
        ]
    }
    app = web.Application()
    app.router.add_get("/v1/models", lambda r: web.json_response(models))
    engine = await process_stand_in.start(app)
    engine._config = config(frontend="process", lora=LoraSettings(max_loras=2, max_lora_rank=8))
    assert await engine.adapters() == ("legal", "sql")


@pytest.mark.slow
async def test_a_server_that_exits_while_starting_is_an_error_with_its_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetserve.engine import vllm_process  # noqa: PLC0415

    def failing(options: list[str], **where: Any) -> list[str]:
        script = "import sys; print('ValueError: no such model'); sys.exit(3)"
        return [sys.executable, "-c", script]

    monkeypatch.setattr(vllm_process, "vllm_server_argv", failing)
    engine = VllmProcessEngine(config(frontend="process"))
    with pytest.raises(EngineError, match=r"exited with 3 while starting(.|\n)*no such model"):
        await engine.start()
    await engine.shutdown()
    assert engine.stats().in_flight == 0


def test_the_servers_output_goes_to_the_workers_own_stderr_not_serves_logger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a Serve replica without --verbose, ``sys.stderr`` and ``print`` are Serve's, and
    Serve buffers what they get until an error: vLLM's log (its KV cache size, its
    warnings) must go to the stderr file the worker started with, as the in-replica
    engine's processes write theirs."""
    worker_stderr, serves_logger = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", worker_stderr)
    monkeypatch.setattr(sys, "stderr", serves_logger)
    tail: collections.deque[str] = collections.deque(maxlen=2)
    lines = b"INFO starting\nINFO GPU KV cache size: 1,070,390 tokens\nready\n"
    vllm_process._copy_output(io.BytesIO(lines), tail)
    assert worker_stderr.getvalue() == lines.decode()
    assert serves_logger.getvalue() == ""
    assert list(tail) == ["INFO GPU KV cache size: 1,070,390 tokens", "ready"]
