"""How the ingress reaches a model's replicas: a Protocol with a Ray and a local version.

``HandleModelClient`` calls the replicas through Ray Serve ``DeploymentHandle``s (the real
path) and receives their responses over the stream relay (``serve/replica/relay.py``) or, with
``server.stream_relay: serve``, over Serve's own streaming calls;
``LocalModelClient`` calls engines in this process (unit tests of routing, auth and
errors without Ray). Both map transport failures to the errors the ingress turns into
HTTP: :class:`ModelOverloadedError` (503 + Retry-After), :class:`ModelUnavailableError`
(503 + Retry-After) and :class:`ModelRequestTooLargeError` (413). Messages never carry
Ray's internals (actor ids, class names); the cause is logged on the ingress instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Literal, Protocol

import aiohttp

from fleetserve.engine.protocol import Engine, EngineRequest, EngineStats, ResponseHead
from fleetserve.engine.server_hop import forward, open_session
from fleetserve.errors import EngineError, ServeError
from fleetserve.observe.timeline import RECEIVED_NS, TIMELINE
from fleetserve.serve.ingress.probes import ModelHealth, model_health, status_name
from fleetserve.serve.replica.relay import END_OF_STREAM, Handoff, RelayError, RelayReceiver
from fleetserve.serve.routing import registry

logger = logging.getLogger(__name__)

#: Seconds a read of the deployments' statuses is reused. The statuses only decide
#: liveness (an engine that died or cannot start), which orchestrators probe every ~10 s;
#: the replica counts behind fail-fast and readiness are pushed, never cached.
STATUS_REFRESH_S = 5.0

#: How replicas send responses back: one relay connection per replica (``serve/replica/relay.py``)
#: or one Serve streaming call per request.
StreamRelay = Literal["multiplexed", "serve"]


class ModelOverloadedError(ServeError):
    """Every replica of the model is at max_ongoing_requests and the queue is full."""


class ModelUnavailableError(ServeError):
    """No replica of the model can take the request (starting, dead, or shut down)."""


class ModelRequestTooLargeError(ServeError):
    """The request is larger than the transport to the replica accepts."""


class ModelClient(Protocol):
    """Opens streams to a model and reads replica stats."""

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Stream the model's response: a ResponseHead, then bytes."""

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        """One replica's engine stats (ModelUnavailableError when none answers)."""


class LocalModelClient:
    """Engines in this process, by model name (for tests and single-process tools)."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self._engines = dict(engines)

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        try:
            return self._engines[model].handle(request)
        except EngineError as e:
            # an engine that refuses the request: what a replica call failing is through
            # Serve (HandleModelClient), a 503 + Retry-After
            raise ModelUnavailableError(f"model '{model}' failed to answer; retry later") from e

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        return self._engines[model].stats()

    async def health(self) -> dict[str, ModelHealth]:
        out = {}
        for name, engine in self._engines.items():
            try:
                await engine.check_health()
            except EngineError:
                out[name] = ModelHealth(running=0, status="UNHEALTHY")
            else:
                out[name] = ModelHealth(running=1)
        return out


class HandleModelClient:
    """Ray Serve deployment handles, by model name."""

    def __init__(
        self,
        handles: Mapping[str, Any],
        relay: StreamRelay = "multiplexed",
        *,
        handoff: bool = True,
    ) -> None:
        # Streaming handles are made once: ``.options()`` per request costs a copy.
        self._streams = {
            name: h.options(stream=True, _by_reference=False) for name, h in handles.items()
        }
        self._handles = dict(handles)
        self._relay_mode = relay
        self._handoff = handoff
        #: Connection pools to the engines' own servers on this node, by socket path
        #: (streams handed off by their replicas: serve/replica/relay.py, HANDOFF).
        self._servers: dict[str, aiohttp.ClientSession] = {}
        self._relay: asyncio.Task[RelayReceiver] | None = None
        # The relayed calls' outcome tasks: held here, since the loop keeps only weak
        # references to tasks and nobody awaits these (their done callback does the work).
        self._outcomes: set[asyncio.Future[Any]] = set()
        # (when read, (application, deployment) -> status) of the last status read.
        self._statuses: tuple[float, dict[tuple[str, str], str]] | None = None

    def open(self, model: str, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        if self._relay_mode == "serve":
            return self._open_streaming(model, request)
        return self._open_relayed(model, request)

    async def _receiver(self) -> RelayReceiver:
        """This process's relay receiver, started on first use on the loop that serves."""
        if self._relay is None or (self._relay.done() and not _succeeded(self._relay)):
            self._relay = asyncio.ensure_future(_start_receiver())
        return await asyncio.shield(self._relay)

    async def _open_relayed(
        self, model: str, request: EngineRequest
    ) -> AsyncIterator[ResponseHead | bytes]:
        try:
            receiver = await self._receiver()
        except Exception as e:
            logger.error("the stream relay cannot start: %r", e)
            raise ModelUnavailableError(f"model '{model}' cannot be reached; retry later") from e
        ticket, inbox = receiver.open_stream(handoff=self._handoff)
        timeline = TIMELINE if TIMELINE.enabled else None
        if timeline is not None:
            timeline.point(inbox.stream, "i_recv", RECEIVED_NS.get(None))
        try:
            # A streaming call with one item, the relay connection's id, at its end (see
            # ModelServer.handle_relayed for why not a unary call).
            response = self._streams[model].handle_relayed.remote(request, ticket)
        except Exception as e:
            receiver.close_stream(inbox)
            raise _translate(model, e) from e
        if timeline is not None:
            timeline.point(inbox.stream, "i_call")
        call = asyncio.ensure_future(_outcome(response))
        self._outcomes.add(call)
        call.add_done_callback(self._outcomes.discard)
        call.add_done_callback(functools.partial(receiver.call_done, inbox))
        finished = False
        started = False
        data_seen = False
        handed: Handoff | None = None
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, Handoff):
                    handed = item
                    if timeline is not None:
                        timeline.point(inbox.stream, "i_handoff")
                    # closed at once when the client leaves: that closes the connection
                    # to the server, which aborts the request in vLLM
                    reading = self._read_server(model, request, item.socket_path)
                    async with contextlib.aclosing(reading) as parts:
                        async for part in parts:
                            if timeline is not None and not data_seen:
                                data_seen = isinstance(part, bytes)
                                timeline.point(inbox.stream, "i_data" if data_seen else "i_head")
                            yield part
                    if timeline is not None:
                        timeline.point(inbox.stream, "i_end")
                    break
                if item is END_OF_STREAM:
                    if timeline is not None:
                        timeline.point(inbox.stream, "i_end")
                    if not started:
                        raise ModelUnavailableError(f"model '{model}' returned no response")
                    break
                if isinstance(item, RelayError):
                    logger.warning("model %r: %s", model, item)
                    raise ModelUnavailableError(
                        f"model '{model}': the connection to its replica was lost; retry later"
                    ) from item
                if isinstance(item, Exception):
                    raise _translate(model, item) from item
                assert isinstance(item, ResponseHead | bytes)
                if timeline is not None and (not started or not data_seen):
                    data_seen = isinstance(item, bytes)
                    timeline.point(inbox.stream, "i_data" if data_seen else "i_head")
                started = True
                yield item
            finished = True
        finally:
            receiver.close_stream(inbox)
            if handed is not None:
                # The replica holds the request until told (the engine's server already
                # aborts a stream whose connection closed before its end).
                inbox.release(finished)
            elif not finished:
                # Client gone or error: make sure the replica stops generating.
                response.cancel()

    async def _read_server(
        self, model: str, request: EngineRequest, socket_path: str
    ) -> AsyncGenerator[ResponseHead | bytes, None]:
        """A handed-off stream, read from the engine's server on ``socket_path``."""
        session = self._servers.get(socket_path)
        if session is None or session.closed:
            session = self._servers[socket_path] = open_session(socket_path)
        try:
            async with contextlib.aclosing(forward(session, request)) as parts:
                async for part in parts:
                    yield part
        except (aiohttp.ClientError, OSError) as e:
            # The server exits when its engine dies, and with its replica: its pool is
            # of no more use (a new replica's server has a socket of its own).
            if self._servers.get(socket_path) is session:
                del self._servers[socket_path]
            await session.close()
            logger.warning("model %r: its engine's server failed: %r", model, e)
            raise ModelUnavailableError(f"model '{model}' failed to answer; retry later") from e

    async def _open_streaming(
        self, model: str, request: EngineRequest
    ) -> AsyncIterator[ResponseHead | bytes]:
        gen = self._streams[model].handle.remote(request)
        finished = False
        try:
            try:
                first = await gen.__anext__()
            except StopAsyncIteration as e:
                raise ModelUnavailableError(f"model '{model}' returned no response") from e
            except Exception as e:
                raise _translate(model, e) from e
            yield first
            try:
                async for item in gen:
                    yield item
            except Exception as e:
                raise _translate(model, e) from e
            finished = True
        finally:
            if not finished:
                # Client gone or error: make sure the replica stops generating.
                gen.cancel()

    def close(self) -> None:
        """Stop the relay's listeners (the ingress replica is shutting down). The pools to
        engines' servers go with the process (:meth:`aclose` closes them too)."""
        if self._relay is not None and self._relay.done() and _succeeded(self._relay):
            self._relay.result().close()

    async def aclose(self) -> None:
        """:meth:`close`, and the pools to engines' servers, on the loop that serves."""
        self.close()
        servers, self._servers = self._servers, {}
        for session in servers.values():
            await session.close()

    async def stats(self, model: str, timeout_s: float) -> EngineStats:
        try:
            data = await asyncio.wait_for(self._handles[model].stats.remote(), timeout_s)
        except Exception as e:
            logger.warning("stats of model %r failed: %r", model, e)
            raise ModelUnavailableError(f"model '{model}': no replica answered") from e
        return EngineStats(**data)

    async def health(self) -> dict[str, ModelHealth]:
        """Every model's replicas and deployment status, cheaply enough to ask every second.

        Replica counts come from this process's routers (``routing.registry``: Serve's
        long poll pushes every change of a deployment's running replicas to them, no
        remote call); the deployment statuses from the controller's per-application
        status (one small protobuf, reused for :data:`STATUS_REFRESH_S`).
        ``serve.status()`` - the controller's whole instance description, parsed into
        pydantic models here - is read only while a router has not reported yet
        (start-up). Measured: ``serve.status()`` once a second was the
        largest share of an idle ingress's CPU and part of the controller's
        (``benchmarks/serve_path.py``, idle CPU).
        """
        counts = {
            model: registry.replicas(handle.deployment_name)
            for model, handle in self._handles.items()
        }
        if any(n is None for n in counts.values()):
            return await self._health_from_serve_status()
        now = time.monotonic()
        if self._statuses is None or now - self._statuses[0] >= STATUS_REFRESH_S:
            apps = {handle.app_name for handle in self._handles.values()}
            self._statuses = (now, await asyncio.to_thread(_deployment_statuses, apps))
        try:
            return fleet_health(
                {m: (h.app_name, h.deployment_name) for m, h in self._handles.items()},
                {m: n or 0 for m, n in counts.items()},  # none is None here (checked above)
                self._statuses[1],
            )
        except RuntimeError:
            self._statuses = None  # an incomplete read (controller restarting): ask again
            raise

    async def _health_from_serve_status(self) -> dict[str, ModelHealth]:
        from ray import serve  # noqa: PLC0415 - Ray only where Ray runs

        # serve.status() is a blocking controller call: keep it off the event loop.
        status = await asyncio.to_thread(serve.status)
        out: dict[str, ModelHealth] = {}
        for model, handle in self._handles.items():
            app = status.applications.get(handle.app_name)
            dep = app.deployments.get(handle.deployment_name) if app is not None else None
            if dep is None:
                # The controller restarting answers with no applications: that says
                # nothing about the replicas, so keep the last view (the caller does).
                raise RuntimeError(f"serve.status() has no deployment for model '{model}'")
            out[model] = model_health(dep.replica_states, dep.status)
        return out


def _succeeded(task: asyncio.Future[Any]) -> bool:
    """A done task that returned (neither cancelled nor raised)."""
    return not task.cancelled() and task.exception() is None


async def _outcome(response: Any) -> Any:
    """The last item of a Serve streaming call (a coroutine, so it can run as a task)."""
    last = None
    async for item in response:
        last = item
    return last


async def _start_receiver() -> RelayReceiver:
    import ray  # noqa: PLC0415 - Ray only where Ray runs

    return await RelayReceiver.start(
        node_id=ray.get_runtime_context().get_node_id(),
        tcp_host=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
    )


def fleet_health(
    deployments: Mapping[str, tuple[str, str]],
    counts: Mapping[str, int],
    statuses: Mapping[tuple[str, str], str],
) -> dict[str, ModelHealth]:
    """Each model's :class:`ModelHealth` from its routers' replica count and its
    deployment's status (``deployments``: model -> (application, deployment);
    ``statuses``: (application, deployment) -> status name).

    Raises when a deployment has no status: a restarting controller answers with no
    applications, which says nothing about the replicas (the caller keeps its last view).
    """
    out: dict[str, ModelHealth] = {}
    for model, key in deployments.items():
        status = statuses.get(key)
        if status is None:
            raise RuntimeError(f"the Serve controller lists no deployment for model '{model}'")
        out[model] = ModelHealth(running=counts[model], status=status)
    return out


def _deployment_statuses(apps: set[str]) -> dict[tuple[str, str], str]:
    """(application, deployment) -> status name, from the controller's per-app status."""
    from ray.serve.context import _get_global_client  # noqa: PLC0415 - Ray only where Ray runs

    client = _get_global_client()
    if client is None:
        raise RuntimeError("Ray Serve's controller is not reachable")
    out: dict[tuple[str, str], str] = {}
    for app in apps:
        overview = client.get_serve_status(app)
        for dep in overview.deployment_statuses:
            out[app, dep.name] = status_name(dep.status)
    return out


def _translate(model: str, error: Exception) -> Exception:
    """A transport or replica failure as one of our errors, without Ray's internals."""
    from ray.serve.exceptions import (  # noqa: PLC0415 - Ray only where Ray runs
        BackPressureError,
        DeploymentUnavailableError,
    )

    if isinstance(error, ModelUnavailableError | ModelOverloadedError | ModelRequestTooLargeError):
        return error
    if isinstance(error, BackPressureError):
        return ModelOverloadedError(
            f"model '{model}' is overloaded: every replica is busy and its queue is full; "
            "retry later"
        )
    if isinstance(error, DeploymentUnavailableError):
        return ModelUnavailableError(f"model '{model}' is not deployed; retry later")
    if _is_too_large(error):
        return ModelRequestTooLargeError(
            f"the request is larger than the transport to model '{model}' accepts "
            "(RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH on this cluster); send a smaller body"
        )
    logger.warning("model %r: replica call failed: %r", model, error)
    if _is_replica_gone(error):
        return ModelUnavailableError(f"model '{model}': its replica stopped; retry later")
    return ModelUnavailableError(f"model '{model}' failed to answer; retry later")


def _is_too_large(error: BaseException) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "larger than max" in text


def _is_replica_gone(error: BaseException) -> bool:
    name = type(error).__name__
    return name in {
        "ActorDiedError",
        "ActorUnavailableError",
        "RayActorError",
        "AioRpcError",
        "RayTaskError",
    }
