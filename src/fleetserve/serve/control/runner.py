"""``fleetserve serve``'s lifecycle: check, prepare, start, wait, drain, stop.

Design note. Everything that can be refused is refused before anything starts: the spec
(by the CLI), the API-key variables, the arithmetic of logical resources against the
cluster (against this host's CPUs before a local Ray is even started; against
``ray.cluster_resources()`` when joining one). Then models are prepared (progress from
the model store), Ray and Serve are started, the application is deployed without
blocking, and its deployments' states are printed until it runs or fails - a failed
replica's message is shown, never a hang.

Fast path (``server.direct_ingress``, only for a Ray this process starts). Every token
of a stream crosses the Serve hops, and on a small host their CPU is taken from the
engine. Ray Serve's throughput mode removes most of it: the ingress replica runs the HTTP
server itself (no proxy hop), the ingress reaches model replicas over gRPC instead of
Ray object references, and user code runs on the replica's own event loop. These are
environment flags that Ray's workers read when they start, and Ray workers inherit the
environment of the process that starts Ray - so they are set here, before ``ray.init``
(values already in the environment win). The ingress's port range is pinned to
``server.port``; Serve's own proxy, which still starts, is moved to a free side port.
Measured in docs/benchmarks.md (serving overhead).

Shutdown (SIGTERM, or Ctrl-C once): the ingress stops accepting model requests (503 +
Retry-After), in-flight ones - whole streams - get up to ``server.drain_timeout_s`` to
finish, then Serve is shut down, and Ray too when this process started it. When joined to
an existing cluster only this application is deleted. A second Ctrl-C skips the drain.
A Ray this process started is watched while serving: if one of its processes dies (a
SIGKILLed raylet, or a signal to the whole process group), the server stops with an error
instead of serving nothing - and reaps the dead process, which is what lets Ray's workers
notice (they keep running while their raylet is an unreaped zombie). Shutdown then skips
the drain and Serve's shutdown, which would wait on the dead Ray (engine/reaper.py). Ray's
node agents, which outlive a SIGKILLed server by a minute, have a watchdog of their own
(engine/reaper.py), so a server restarted at once finds its ports free.
A signal to the whole process group (systemd's default stop, ``kill -TERM -PGID``) reaches
the GCS and the raylet with this process: they are stopping, not dead, and a Serve call
that writes to the GCS then waits for ever (``serve.get_deployment_handle`` did, until a
SIGKILL 60 s later). So a stop first looks whether the GCS still answers; one that no
longer does is Ray going away - no drain, no Serve shutdown - and what Ray has left of
this process's processes is killed when ``ray.shutdown`` cannot end them in time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rich.console import Console

from fleetserve.engine.config import EngineKind
from fleetserve.engine.cpu_binding import (
    BIND_ENV,
    HOST_CPUS_ENV,
    cores_wanted,
    format_cores,
    serving_cores,
    spawned_on,
)
from fleetserve.engine.reaper import children, ident, reap, start_watchdog
from fleetserve.errors import ServeError
from fleetserve.host import HostFacts, probe
from fleetserve.plan.deployment import (
    APP_NAME,
    INGRESS_DEPLOYMENT,
    FleetDeployment,
    serve_request_timeout_s,
)
from fleetserve.plan.local import joined_deployment, local_deployment
from fleetserve.serve.control.app import build_application, resolve_model_paths
from fleetserve.serve.control.ports import free_port
from fleetserve.serve.control.resources import ClusterCapacity, fit_resources
from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.serve.ingress.limits import RequestLimits, transport_env
from fleetserve.spec import FleetSpec

#: Seconds between deployment status polls while starting.
_POLL_S = 1.0
#: Tries of serve.start + deploy when a Serve actor is replaced under us.
_DEPLOY_ATTEMPTS = 3
#: After the drain timeout: how long the ingress gets to send the requests' error events.
_CUT_GRACE_S = 3.0
#: Seconds of unchanged start-up status before a "still starting" line.
_HEARTBEAT_S = 20.0
#: Ray's process kinds (ray_constants.PROCESS_TYPE_*) without which nothing is served.
_VITAL_RAY_PROCESSES = frozenset({"raylet", "gcs_server"})
#: How long a stop watches the GCS for the signal that stopped this process (a signal to
#: the process group reaches it at the same instant; it closes its port a moment later).
_RAY_SETTLE_S = 1.0
#: Longest wait for ``ray.shutdown`` before this process kills what Ray left of its own.
_RAY_SHUTDOWN_S = 30.0
#: Longest wait for the application to run (engine load is ~1 min on a laptop CPU;
#: large models on GPUs download and compile for much longer).
START_TIMEOUT_S = 3600.0


def fast_path_env(port: int, *, verbose: bool) -> dict[str, str]:
    """Ray Serve's environment flags for the fast path with the ingress on ``port``."""
    return {
        # Direct ingress, gRPC between deployments, user code and router on the
        # replica's loop, buffered request logs (ray/serve/_private/constants.py).
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        # The single ingress replica gets exactly the user's port.
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
        # Our drain (begin_drain, then wait for in-flight) already covers shutdown; Ray's
        # default waits 30 s for external load balancers there are none of here.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0.5",
        # A restarted ingress replica must get the same port back at once.
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        # Throughput mode silences replica logs on stderr; --verbose promises them.
        "RAY_SERVE_LOG_TO_STDERR": "1" if verbose else "0",
    }


#: Settings for a Ray this process starts, whatever the path.
#:
#: * The Serve controller's reconcile loop runs every 0.1 s by default; each pass also
#:   talks to the GCS. Idle, that loop was the largest CPU user of a local server
#:   (controller 4.7 % + GCS 2.3 % of a core of 16 % in all; at 0.5 s: 2.0 % + 0.9 %,
#:   benchmarks/serve_path.py idle CPU), and on a small host that CPU comes out of the
#:   engine's share. Serve's autoscaling delays are in seconds, not loop passes, so 0.5 s
#:   only adds up to 0.4 s to reacting to a change (a replica start takes tens of seconds).
#: * Ray starts every worker at niceness 15, and the engine runs in a worker: inside the
#:   server's scheduling group (one session, one autogroup) Ray's own daemons at niceness 0
#:   then win every contest for a core against the engine's scheduler process. At 0 the
#:   engine is on ``vllm serve``'s footing; with the serving layer kept off the engine's
#:   cores (``_serving_cores``) that is what makes the split pay on a loaded host
#:   (docs/benchmarks-log.md, overhead: +7 % at concurrency 8 with two busy processes, where
#:   the split alone at niceness 15 lost 10 %). The raylet reads it when it starts.
#: * Two daemons poll for work fleetserve does not use. Ray's log monitor re-lists the
#:   session's log directory every 0.1 s while it holds under 1,000 files, and the
#:   dashboard agent checks its raylet every 0.4 s and walks every Ray process with psutil
#:   every 5 s for node metrics nothing here reads (the dashboard is off). Idle (fake
#:   engine, 40 s, two starts each, docs/benchmarks-log.md) the two read 0.40-0.45 and
#:   0.35-0.47 % of a core; with these values 0.17-0.20 and 0.30-0.32 %, and the whole
#:   server 4.0-4.3 % instead of 4.5 %. New log files are then found within
#:   5 s (only ``--verbose`` shows them), and Ray's node metrics come every 15 s, a
#:   Prometheus scrape interval. tests/unit/serve/test_runner_fast_path.py checks that
#:   Ray still reads each name.
#: Tries of ``ray.init`` when Ray's node misses its startup wait (``FleetServer._init_ray``).
RAY_START_TRIES = 2
#: What Ray's exception says when its raylet did not register in time.
RAY_NODE_TIMEOUT = "timed out during startup"

LOCAL_RAY_ENV = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_worker_niceness": "0",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "5",
    "RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S": "2",
    "REPORTER_UPDATE_INTERVAL_MS": "15000",
}


@dataclass(frozen=True)
class ServeOptions:
    """What ``fleetserve serve`` was asked to do."""

    spec: FleetSpec
    host: str
    port: int
    address: str | None = None
    engine: EngineKind = "vllm"
    fake_token_delay_s: float = 0.0
    metrics_export_port: int | None = None
    verbose: bool = False


def local_capacity(host: HostFacts) -> ClusterCapacity:
    """This host, as the Ray cluster started here sees it (:meth:`FleetServer._start_ray`
    gives Ray exactly ``host.cpus``: the CPUs the local plan was made for)."""
    cpus = float(host.cpus)
    gpus = float(len(host.gpu_memory_mb))
    return ClusterCapacity(
        cpus=cpus, gpus=gpus, node_cpus=cpus, node_gpus=gpus, description="this host"
    )


class FleetServer:
    """One run of ``fleetserve serve``."""

    def __init__(self, options: ServeOptions, console: Console | None = None) -> None:
        self.options = options
        self.console = console or Console(highlight=False)
        self._started_ray = False
        #: The watchdog of the started Ray's agents (engine/reaper.py); it ends by itself
        #: once they have, and is waited for after Ray's shutdown.
        self._agent_reaper: subprocess.Popen[bytes] | None = None
        self._deployed = False
        self._stop = threading.Event()
        self._interrupts = 0
        self._handle_signals = False
        self._host: HostFacts | None = None
        self._plan: FleetDeployment | None = None
        # The ingress's handle, taken while Ray is sound: getting it records a usage tag
        # in the GCS, which blocks for ever on a GCS that is stopping.
        self._ingress: Any = None

    # ------------------------------------------------------------------ start

    def check(self) -> tuple[ApiKeyTable, FleetDeployment]:
        """Everything refusable before start (keys, the plan, its fit on this host)."""
        spec = self.options.spec
        keys = ApiKeyTable.from_spec(spec)
        # Measured once: the local plan, the capacity check and Ray all use these figures.
        self._host = host = probe()
        capacity = local_capacity(host)
        if self.options.address is not None:
            capacity = self._connect_ray()
        # The local planner sizes real engines on this machine; a joined cluster or the
        # fake engine (no model config to size) is planned from the spec alone.
        if self.options.address is not None:
            deployment = joined_deployment(spec, gpu=capacity.gpus > 0)
        else:
            deployment = local_deployment(spec, host, sized=self.options.engine == "vllm")
        for warning in fit_resources(spec, deployment, capacity):
            self.console.print(f"[yellow]warning:[/] {warning}")
        self._plan = deployment
        return keys, deployment

    def start(self) -> str:
        """Check, prepare models, start Ray/Serve, deploy; returns the base URL."""
        o = self.options
        spec = o.spec
        keys, deployment = self.check()
        n = len(spec.models)

        def beside(model: str) -> str:
            frontend = deployment.models[model].frontend
            return ", its vLLM server beside the replica" if frontend == "process" else ""

        self.console.print(
            f"fleetserve: serving {n} model{'s' if n != 1 else ''}: "
            + ", ".join(f"{m.name} ({m.source}{beside(m.name)})" for m in spec.models)
        )
        paths = resolve_model_paths(spec, o.engine)
        if not self._ray_initialized():
            self._start_ray()
        app = build_application(
            spec,
            deployment=deployment,
            model_paths=paths,
            keys=keys,
            engine=o.engine,
            fake_token_delay_s=o.fake_token_delay_s,
        )
        self._deploy(app)
        url = f"http://{_display_host(o.host)}:{o.port}"
        self._announce(url, keys.enabled)
        return url

    @staticmethod
    def _ray_initialized() -> bool:
        import ray  # noqa: PLC0415 - importing Ray costs seconds; not before checks pass

        return bool(ray.is_initialized())

    def _connect_ray(self) -> ClusterCapacity:
        import ray  # noqa: PLC0415

        address = self.options.address
        self.console.print(f"fleetserve: joining the Ray cluster at {address}")
        try:
            ray.init(address=address, log_to_driver=self.options.verbose)
        except Exception as e:
            hint = None
            if "RAY_AUTH_MODE" not in os.environ:
                # Ray enables token auth only for clusters it finds itself ("auto").
                hint = (
                    "if the cluster uses token authentication, set RAY_AUTH_MODE=token "
                    "(token from RAY_AUTH_TOKEN or ~/.ray/auth_token)"
                )
            raise ServeError(f"cannot join the Ray cluster at {address}: {e}", hint=hint) from e
        self._restore_signal_handlers()
        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        return ClusterCapacity.from_ray(total, nodes)

    def _init_ray(self, kwargs: dict[str, Any]) -> None:
        """``ray.init``, tried again once when Ray's node missed its fixed startup wait.

        Ray gives its raylet a hard-coded 30 s to register with the GCS
        (``ray/_private/node.py``), which a loaded host can miss (seen on this 2-core test
        host while an engine started beside it). That failure leaves the try's daemons
        running as our children: they are stopped before the next try, so nothing is left
        either way."""
        import ray  # noqa: PLC0415

        for attempt in range(1, RAY_START_TRIES + 1):
            before = children(os.getpid())
            try:
                ray.init(**kwargs)
                return
            except Exception as e:
                left = [p for p in map(ident, children(os.getpid()) - before) if p is not None]
                with contextlib.suppress(Exception):
                    ray.shutdown()
                reap(left)
                if RAY_NODE_TIMEOUT not in str(e) or attempt == RAY_START_TRIES:
                    raise ServeError(f"cannot start Ray: {e}") from e
                self.console.print(
                    "fleetserve: Ray's node did not register within Ray's startup wait "
                    f"(a busy host?); its daemons are stopped, starting Ray again ({attempt + 1} "
                    f"of {RAY_START_TRIES})"
                )

    def _start_ray(self) -> None:
        import ray  # noqa: PLC0415

        cpus = (self._host or probe()).cpus  # what check() planned and fitted for
        self.console.print(f"fleetserve: starting Ray ({cpus} CPUs)")
        kwargs: dict[str, Any] = {
            "num_cpus": cpus,
            "include_dashboard": False,
            "log_to_driver": self.options.verbose,
            "configure_logging": self.options.verbose,
        }
        if self.options.metrics_export_port is not None:
            kwargs["_metrics_export_port"] = self.options.metrics_export_port
        o = self.options
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
        if o.spec.server.direct_ingress:
            for key, value in fast_path_env(o.port, verbose=o.verbose).items():
                os.environ.setdefault(key, value)
        # A body within server.max_body_mb must cross the ingress -> replica gRPC hop.
        for key, value in transport_env(RequestLimits.from_spec(o.spec.server)).items():
            os.environ.setdefault(key, value)
        serving = self._serving_cores()
        if serving is not None:
            # Engines claim from the host's cores, not the serving cores they inherit, and
            # an engine that claims none spawns its processes there (cpu_binding).
            host = format_cores(sorted(os.sched_getaffinity(0)))
            os.environ.setdefault(HOST_CPUS_ENV, host)
            self.console.print(
                f"fleetserve: Ray and the serving layer on CPU cores {format_cores(serving)}, "
                f"the rest of {host} left to the engines"
            )
        # Ray's daemons start from this thread and its workers from the raylet, so they
        # all inherit the serving cores; this process keeps its own.
        with spawned_on(serving) if serving else contextlib.nullcontext():
            self._init_ray(kwargs)
            self._started_ray = True
            # Ray's agents outlive a SIGKILLed server by a minute (engine/reaper.py): a
            # watchdog, which ends by itself once they have, ends them with it - on the
            # serving cores, as Ray's daemons, off the engines'.
            self._agent_reaper = start_watchdog(_ray_agents(), "ray-agents")
        self._restore_signal_handlers()
        # The exact address, for `ray status --address ...` and for tools that join this
        # cluster: address="auto" picks any live cluster on the host when there are several.
        self.console.print(
            f"fleetserve: Ray started at {ray.get_runtime_context().gcs_address}", soft_wrap=True
        )

    def _serving_cores(self) -> list[int] | None:
        """The cores for everything but the CPU engines (``cpu_binding.serving_cores``), or
        ``None`` where no engine claims cores: the fake engine, GPUs, a binding the user
        set, engines over several processes (vLLM binds those itself) - the same cases
        in which ``vllm_engine`` claims none."""
        o, plan, host = self.options, self._plan, self._host
        if (
            o.engine != "vllm"
            or plan is None
            or host is None
            or host.gpu_memory_mb
            or BIND_ENV in os.environ
            or any(m.gpus_per_replica > 1 for m in o.spec.models)
        ):
            return None
        cores = sorted(os.sched_getaffinity(0))
        claimed = sum(
            m.replicas.max * cores_wanted(plan.models[m.name].ray.num_cpus) for m in o.spec.models
        )
        serving = serving_cores(cores, claimed)
        return serving if serving != cores else None

    @property
    def _direct_ingress(self) -> bool:
        # The fast-path flags only reach a Ray this process started (see _start_ray).
        return self._started_ray and self.options.spec.server.direct_ingress

    def _deploy(self, app: Any) -> None:
        from ray import serve  # noqa: PLC0415
        from ray.exceptions import RayActorError  # noqa: PLC0415

        o = self.options
        # With direct ingress the ingress replica owns o.port; Serve's proxy moves aside.
        proxy_port = free_port(o.host, avoid={o.port}) if self._direct_ingress else o.port
        for attempt in range(1, _DEPLOY_ATTEMPTS + 1):
            try:
                serve.start(
                    http_options={
                        "host": o.host,
                        "port": proxy_port,
                        # A backstop: the ingress's own deadline ends requests first,
                        # in the OpenAI error shape (serve/ingress/limits.py).
                        "request_timeout_s": serve_request_timeout_s(
                            o.spec.server.request_timeout_s
                        ),
                    }
                )
                self._submit(app)
                break
            except RayActorError as e:
                # On a starved machine the proxy can miss its first health checks; Serve
                # then replaces it and the call that waited on the old one fails. The
                # controller recovers by itself: ask again.
                if attempt == _DEPLOY_ATTEMPTS:
                    raise ServeError(f"cannot deploy the application: {e}") from e
                self.console.print(
                    f"fleetserve: a Serve actor restarted while deploying; retrying "
                    f"({attempt}/{_DEPLOY_ATTEMPTS - 1})"
                )
                time.sleep(2.0 * attempt)
            except Exception as e:
                raise ServeError(f"cannot deploy the application: {e}") from e
        self._deployed = True
        self._wait_running()

    def _submit(self, app: Any) -> None:
        from ray import serve  # noqa: PLC0415

        # Private but stable since Ray 2.7: deploy without waiting, so we can report progress
        # (serve.run would block silently until every replica is up). It calls serve.start
        # again and logs that our http_options "will not be applied" - they were, by the
        # caller; keep that misleading line off the console.
        serve_logger = logging.getLogger("ray.serve")
        level = serve_logger.level
        if not self.options.verbose:
            serve_logger.setLevel(logging.WARNING)
        try:
            serve._run(app, _blocking=False, name=APP_NAME, route_prefix="/")
        finally:
            serve_logger.setLevel(level)

    def _wait_running(self) -> None:
        from ray import serve  # noqa: PLC0415
        from ray.serve.schema import ApplicationStatus  # noqa: PLC0415

        deadline = time.monotonic() + START_TIMEOUT_S
        last: dict[str, str] = {}
        started = quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if self._stop.is_set():
                raise KeyboardInterrupt
            status = serve.status().applications.get(APP_NAME)
            if status is not None:
                now = time.monotonic()
                changed = False
                for name, dep in sorted(status.deployments.items()):
                    line = _deployment_line(dep)
                    if last.get(name) != line:
                        last[name] = line
                        changed = True
                        self.console.print(f"fleetserve: [{now - started:5.1f}s] {name}: {line}")
                if changed:
                    quiet_since = now
                elif now - quiet_since >= _HEARTBEAT_S:
                    # Engine load and compilation are silent for minutes on a small CPU.
                    quiet_since = now
                    waiting = [n for n, line in last.items() if not line.startswith("HEALTHY")]
                    self.console.print(
                        f"fleetserve: [{now - started:5.1f}s] still starting: "
                        f"{', '.join(waiting)} (engine load, compilation)",
                        soft_wrap=True,
                    )
                if status.status == ApplicationStatus.RUNNING:
                    self._ingress = serve.get_deployment_handle(
                        INGRESS_DEPLOYMENT, app_name=APP_NAME
                    )
                    return
                if status.status in (
                    ApplicationStatus.DEPLOY_FAILED,
                    ApplicationStatus.UNHEALTHY,
                ):
                    raise ServeError(
                        f"the application failed to start: {_failure(status)}",
                        hint="rerun with --verbose to see the replicas' logs",
                    )
            time.sleep(_POLL_S)
        raise ServeError(f"the application did not start within {START_TIMEOUT_S:.0f} s")

    def _announce(self, url: str, auth: bool) -> None:
        model = self.options.spec.models[0].name
        auth_header = ' -H "Authorization: Bearer $API_KEY"' if auth else ""
        self.console.print(
            f"fleetserve: ready - OpenAI API at {url}/v1 (Ctrl-C or SIGTERM drains and stops)",
            soft_wrap=True,
        )
        self.console.print(
            f"  try: curl {url}/v1/chat/completions -H 'Content-Type: application/json'"
            f'{auth_header} -d \'{{"model": "{model}", "messages": '
            '[{"role": "user", "content": "Hello!"}]}\'',
            soft_wrap=True,
        )

    # ------------------------------------------------------------------ run / stop

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT request a drain; a second SIGINT skips it."""

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            self._interrupts += 1
            if self._interrupts > 1 and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self._handle_signals = True

    def _restore_signal_handlers(self) -> None:
        # ray.init replaces the SIGTERM handler with sys.exit (ray/_private/worker.py),
        # which would skip the drain: put ours back.
        if self._handle_signals:
            self.install_signal_handlers()

    def wait(self) -> None:
        """Block until a stop is requested or the Ray this process started loses a process."""
        while not self._stop.wait(1.0):
            dead = self._dead_ray_processes()
            if dead:
                raise ServeError(
                    f"Ray's {', '.join(dead)} exited unexpectedly; stopping",
                    hint="see Ray's logs under /tmp/ray/session_latest/logs",
                )

    def _dead_ray_processes(self) -> list[str]:
        """Which of the Ray processes this process started that Serve cannot run without
        (raylet, GCS) have exited; polling them reaps them."""
        node = _ray_node() if self._started_ray else None
        if node is None:
            return []
        dead = {str(kind) for kind, _ in node.dead_processes()}
        return sorted(dead & _VITAL_RAY_PROCESSES)

    def _ray_going_away(self, settle_s: float = 0.0) -> list[str]:
        """What of the Ray this process started is gone or stopping: its dead vital
        processes, or a GCS that no longer takes connections - watched for ``settle_s``
        (a signal to the process group reaches the GCS as it reaches this process)."""
        if not self._started_ray:
            return []
        deadline = time.monotonic() + settle_s
        while True:
            dead = self._dead_ray_processes()
            if dead:
                return dead
            if not self._gcs_listening():
                return ["gcs_server (stopping)"]
            if time.monotonic() >= deadline:
                return []
            time.sleep(0.1)

    def _gcs_listening(self) -> bool:
        address = getattr(_ray_node(), "gcs_address", None)
        if not address:
            return True  # nothing to ask: the other checks decide
        host, _, port = str(address).rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except (OSError, ValueError):
            return False

    def stop(self, *, drain: bool = True) -> None:
        """Drain (bounded) and stop what this process started."""
        gone = self._ray_going_away(_RAY_SETTLE_S) if self._deployed else []
        if gone:
            self.console.print(
                f"fleetserve: Ray's {', '.join(gone)} went away with this server; "
                "stopping without a drain"
            )
        try:
            # Before the application first ran nothing was served, so nothing is drained
            # (and an ingress still starting would not answer the drain call for seconds).
            if self._deployed and drain and not gone and self._ingress is not None:
                self._drain()
        finally:
            self._shutdown()

    def _drain(self) -> None:
        timeout = self.options.spec.server.drain_timeout_s
        ingress = self._ingress  # taken when the application first ran (stop drains only then)
        try:
            left = int(ingress.begin_drain.remote().result(timeout_s=10))
        except Exception as e:
            self.console.print(f"fleetserve: cannot drain ({e}); stopping now")
            return
        if left <= 0:
            return
        self.console.print(
            f"fleetserve: draining {left} in-flight request{'s' if left != 1 else ''} "
            f"(up to {timeout:g} s)"
        )
        deadline = time.monotonic() + timeout
        while left > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                left = int(ingress.in_flight.remote().result(timeout_s=10))
            except Exception:
                break
        if left > 0:
            self.console.print(f"fleetserve: drain timeout; cutting {left} request(s)")
            # End them with an error (an SSE error event for streams), not a silent cut.
            try:
                ingress.end_requests.remote().result(timeout_s=10)
                deadline = time.monotonic() + _CUT_GRACE_S
                while left > 0 and time.monotonic() < deadline:
                    time.sleep(0.1)
                    left = int(ingress.in_flight.remote().result(timeout_s=10))
            except Exception as e:
                self.console.print(f"fleetserve: cannot end requests cleanly ({e})")

    def _shutdown(self) -> None:
        import ray  # noqa: PLC0415
        from ray import serve  # noqa: PLC0415

        if not ray.is_initialized():
            return
        self.console.print("fleetserve: stopping")
        try:
            if self._started_ray:
                # With a raylet or GCS gone or stopping, serve.shutdown() waits on them
                # forever. Before the application first ran (stopped while an engine
                # loads), it waits 30 s for replicas still in their constructors, which
                # cannot shut down gracefully: Ray's own stop ends them, and fleetserve's
                # engine reapers their engines, as when the server is killed.
                if not self._ray_going_away() and self._ingress is not None:
                    serve.shutdown()  # type: ignore[no-untyped-call]
            elif self._deployed:
                serve.delete(APP_NAME)
        finally:
            if self._started_ray:
                self._shutdown_ray()
                if self._agent_reaper is not None:
                    # the agents end with Ray's shutdown, the watchdog then (not a zombie
                    # of this process); one still running guards agents Ray left behind
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._agent_reaper.wait(2)
        self.console.print("fleetserve: stopped")

    def _shutdown_ray(self) -> None:
        """``ray.shutdown()``, bounded: on a GCS stuck while stopping it can wait for ever,
        and then this process kills the Ray processes it started itself."""
        import ray  # noqa: PLC0415

        node = _ray_node()
        done = threading.Event()

        def shutdown() -> None:
            try:
                ray.shutdown()
            finally:
                done.set()

        threading.Thread(target=shutdown, name="ray-shutdown", daemon=True).start()
        if not done.wait(_RAY_SHUTDOWN_S) and node is not None:
            self.console.print("fleetserve: Ray did not stop in time; killing its processes")
            with contextlib.suppress(Exception):
                node.kill_all_processes(check_alive=False, allow_graceful=False)


def _ray_node() -> Any:
    """The Ray node this process started or joined (None before ``ray.init``): it holds
    the Popen objects of the processes it started and the GCS's address."""
    from ray._private import worker  # noqa: PLC0415 - Ray only where Ray runs

    return getattr(worker, "_global_node", None)


def _ray_agents() -> set[int]:
    """PIDs of what the raylet of the node this process started runs besides its workers
    when Ray is up: its dashboard and runtime-env agents (and any worker it prestarted,
    which ends with the raylet anyway)."""
    node = _ray_node()
    raylets = getattr(node, "all_processes", {}).get("raylet", []) if node else []
    return {pid for info in raylets for pid in children(info.process.pid)}


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _deployment_line(dep: Any) -> str:
    counts = dict(getattr(dep, "replica_states", {}) or {})
    parts = ", ".join(f"{n} {str(s).lower()}" for s, n in sorted(counts.items(), key=str))
    status = str(getattr(dep.status, "value", dep.status))
    return f"{status}" + (f" ({parts})" if parts else "")


def _failure(status: Any) -> str:
    messages = [status.message] if status.message else []
    for name, dep in status.deployments.items():
        if dep.message and str(getattr(dep.status, "value", dep.status)) != "HEALTHY":
            messages.append(f"{name}: {dep.message}")
    return "; ".join(messages) or str(status.status)
