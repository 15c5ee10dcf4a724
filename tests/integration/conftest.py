"""Session-wide servers for engine tests: ONE fleetserve per frontend, shared.

An engine start costs minutes on a loaded 2-core host, so every test that needs a real
engine on the default fleet shares these:

* ``engine_fleet`` - ``fleetserve serve`` of the default fleet (Gemma 3 270M on vLLM),
  started as users start it, in its own process, exporting Ray's metrics on a port of its
  own (``metrics_port``, for the live-Prometheus test); ``fleetserve_url`` is its base URL
  (no ``/v1``). Its last test, ``retiring_engine_fleet``, is the kill test of the real
  engine: the fleet's end is what it checks, so no second engine starts for it;
* ``process_fleet`` - the same fleet with ``frontend: process``: its replica forwards to
  vLLM's own OpenAI server beside it. That server runs the default model with the engine
  options fleetserve gives it (``default_engine_args``, checked on its command line), so
  it is also the session's `vllm serve`: ``vllm`` is a client of it, on its socket, for
  the parity tests and the default-model checks. Its ``retiring_process_fleet`` tests,
  last, kill its engine and then stop it.

Each is stopped after the last test that uses it (``release_after_last_use`` in
tests/conftest.py; their tests run together, after the rest) with SIGTERM (fleetserve's
drain path), then SIGKILL of its own process group if it does not exit. Logs go to
``<tmp>/<name>.log`` and the tail is shown if a server fails to come up. Fixtures that
start a real engine request ``real_engine``, those that start Ray request ``servers``:
the ``engine`` and ``ray`` markers follow from that (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.cpu_binding import BIND_ENV
from fleetserve.engine.reaper import TITLES as REAPER_TITLES
from fleetserve.errors import ServeError
from fleetserve.host import probe
from fleetserve.modelstore.store import ModelStore
from fleetserve.plan.local import local_deployment
from fleetserve.serve.control import ports
from fleetserve.spec import default_fleet

#: Longest wait for an engine to come up (model preparation + engine load + compile on a
#: loaded 2-CPU machine).
START_TIMEOUT_S = float(os.environ.get("FLEETSERVE_TEST_START_TIMEOUT", "2400"))
STOP_TIMEOUT_S = 90.0


T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout_s: float,
    what: str,
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll ``check`` until it returns something true, and return that; fail the test
    with ``what`` (and ``detail()``, when given) after ``timeout_s``. For what a fleet
    reports some time after the client has its answer (counters, reaped processes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = f"; {detail()}" if detail is not None else ""
            pytest.fail(f"not within {timeout_s:g} s: {what}{shown}")
        time.sleep(0.2)


def free_port() -> int:
    """A port free now, from the band the product draws its own side ports from."""
    try:
        return ports.free_port()
    except ServeError as e:
        pytest.fail(str(e))


class ServerProcess:
    """A server started in its own session (process group), with its log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # Never ENGINE_SPAWN_VAR from here: it marks the processes vLLM's engine spawns.
            # Nor a vLLM CPU binding this process picked up (an in-process test of the
            # engine's claim): the server would read it as the user's and keep vLLM's own
            # binding. A test that wants one passes it in ``env``.
            env={
                k: v
                for k, v in {
                    **{k: v for k, v in os.environ.items() if k != BIND_ENV},
                    **(env or {}),
                }.items()
                if f"{k}=".encode() != ENGINE_SPAWN_VAR
            },
        )

    def tail(self, n: int = 60) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(
        self, url: str, timeout_s: float = START_TIMEOUT_S, log_line: str | None = None
    ) -> None:
        """Until ``url`` answers 200 (and ``log_line`` is in the log, when given)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.close()
                pytest.fail(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; "
                    f"log tail ({self.log}):\n{self.tail()}"
                )
            try:
                if httpx.get(url, timeout=5).status_code == 200 and (
                    log_line is None or log_line in self.log.read_text(errors="replace")
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        pytest.fail(f"{self.name} not ready after {timeout_s:.0f} s; log tail:\n{self.tail()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait, then SIGKILL this server's own process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.close()
        return self.proc.returncode

    def close(self) -> None:
        self._log_file.close()

    def ray_address(self) -> str:
        """The GCS address of the Ray cluster this server started (from its log).

        Never ``address="auto"``: with several clusters on the host (another test's, a
        leftover) Ray picks any of them.
        """
        match = RAY_STARTED.search(self.log.read_text(errors="replace"))
        if match is None:
            pytest.fail(f"{self.name} did not log its Ray address; log tail:\n{self.tail()}")
        return match.group(1)


#: What ``fleetserve serve`` prints once it is up (and handling SIGTERM as a drain).
FLEETSERVE_READY = "fleetserve: ready"
#: What ``fleetserve serve`` prints once it has started its own Ray.
RAY_STARTED = re.compile(r"fleetserve: Ray started at (\S+)")


def fleetserve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetserve.cli", "serve", *args]


#: How long a fleet on the fake engine may take to come up (Ray and Serve only, no weights).
FAKE_START_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class StartedServer:
    """A ``fleetserve serve`` that answered ``/ready``; the caller stops ``server``."""

    server: ServerProcess
    url: str  # base URL, no /v1
    port: int


def start_fleetserve(
    tmp: Path,
    spec: str,
    name: str,
    *,
    fake_token_delay: float | None = None,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> StartedServer:
    """``fleetserve serve`` of the fleet ``spec`` (YAML text, written to ``tmp/fleet.yaml``) on
    a free port, its log in ``tmp/serve.log``; returns once it is ready.

    ``fake_token_delay`` given: the fake engine, streaming a token per that many seconds;
    otherwise the spec's real engines (and the long start timeout they need here).
    ``extra_args``: more ``fleetserve serve`` options (``--metrics-export-port N``).
    """
    path = tmp / "fleet.yaml"
    path.write_text(spec)
    port = free_port()
    args = [str(path), "--port", str(port), *extra_args]
    timeout_s = START_TIMEOUT_S
    if fake_token_delay is not None:
        args += ["--engine", "fake", "--fake-token-delay", f"{fake_token_delay:g}"]
        timeout_s = FAKE_START_TIMEOUT_S
    server = ServerProcess(f"fleetserve ({name})", fleetserve_argv(*args), tmp / "serve.log", env)
    url = f"http://127.0.0.1:{port}"
    server.wait_ready(f"{url}/ready", timeout_s=timeout_s, log_line=FLEETSERVE_READY)
    return StartedServer(server, url, port)


#: A Ray driver joined to one server's cluster, answering one JSON query per stdin line with
#: one ``PROBE_REPLY``-prefixed JSON line (anything else Ray prints is skipped).
PROBE_REPLY = "fleetserve-probe: "
_PROBE_SCRIPT = r"""
import json, os, sys
import ray
from ray import serve
from ray._private.authentication.authentication_token_setup import (
    maybe_enable_token_auth_if_token_available,
)

REPLY = sys.argv[2]


def replica_stats(deployment):
    out = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if actor["namespace"] == "serve" and f"#{deployment}#" in name:
            ref = ray.get_actor(name, namespace="serve").record_routing_stats.remote()
            out[name.rsplit("#", 1)[1]] = ray.get(ref, timeout=60)
    return out


def running(deployment):
    dep = serve.status().applications["fleetserve"].deployments[deployment]
    states = {str(getattr(k, "value", k)): n for k, n in dep.replica_states.items()}
    return int(states.get("RUNNING", 0))


def reply(payload):
    as_json = lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o)
    sys.stdout.write(REPLY + json.dumps(payload, default=as_json) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    # A local ray.init() cluster uses token auth (token in ~/.ray/auth_token), but Ray opts
    # a driver in only when it finds the cluster itself ("auto"); by address we opt in the
    # way Ray does there - setting RAY_AUTH_MODE alone misses Ray's already-loaded config.
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=sys.argv[1], log_to_driver=False)
    reply({"result": "ready"})
    for line in sys.stdin:
        query = json.loads(line)
        try:
            op = {"replica_stats": replica_stats, "running": running}[query["op"]]
            reply({"result": op(query["deployment"])})
        except Exception as e:
            reply({"error": f"{type(e).__name__}: {e}"})
    ray.shutdown()
    os._exit(0)  # past Ray's native teardown: only the answers mattered
"""


class RayProbe:
    """Questions to a server's Ray cluster, asked by a driver in a process of its own.

    Why not ``ray.init`` in the pytest process: a driver that joins and leaves clusters
    there leaves Ray's native threads behind, and at interpreter exit one of them jumped
    into freed memory - pytest segfaulted after every test had passed (the kernel logged an
    instruction fetch from the heap on a non-main thread; Ray #31145 is the same family).
    The probe joins by the exact address the server logged, never ``address="auto"``: with
    several clusters on the host (another test's, a leftover) Ray picks any of them.
    """

    START_TIMEOUT_S = 180.0
    QUERY_TIMEOUT_S = 120.0

    def __init__(self, server: ServerProcess) -> None:
        self.log = server.log.with_name(f"{server.log.stem}-ray-probe.log")
        self._log_file = self.log.open("wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE_SCRIPT, server.ray_address(), PROBE_REPLY],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )
        # A reader thread, so a wait for a reply can time out (a pipe read cannot).
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name="ray-probe-reader", daemon=True).start()
        self._reply(self.START_TIMEOUT_S, "joining the cluster")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(PROBE_REPLY):
                self._replies.put(line[len(PROBE_REPLY) :])
        self._replies.put(None)  # the probe exited

    def _reply(self, timeout_s: float, what: str) -> Any:
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self._proc.kill()  # stuck in Ray: no point asking it to leave
            self.close()
            pytest.fail(f"Ray probe: no answer within {timeout_s:.0f} s to {what}")
        if line is None:
            tail = self.log.read_text(errors="replace")[-3000:]
            pytest.fail(f"Ray probe exited while {what}; its log tail:\n{tail}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            pytest.fail(f"Ray probe: {what}: {answer['error']}")
        return answer["result"]

    def _ask(self, op: str, deployment: str) -> Any:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"op": op, "deployment": deployment}) + "\n")
        self._proc.stdin.flush()
        return self._reply(self.QUERY_TIMEOUT_S, f"{op}({deployment})")

    def replica_stats(self, deployment: str) -> dict[str, dict[str, Any]]:
        """Replica id -> that live replica's ``record_routing_stats`` report, from itself."""
        stats: dict[str, dict[str, Any]] = self._ask("replica_stats", deployment)
        return stats

    def served(self, deployment: str) -> dict[str, int]:
        """Replica id -> requests that live replica of ``deployment`` has taken."""
        return {k: int(v["served"]) for k, v in self.replica_stats(deployment).items()}

    def running(self, deployment: str) -> int:
        """Replicas of ``deployment`` Serve reports RUNNING."""
        return int(self._ask("running", deployment))

    def close(self) -> None:
        """Leave the cluster (idempotent)."""
        if self._log_file.closed:
            return
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.close()  # the probe leaves the cluster and exits
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log_file.close()


@contextlib.contextmanager
def ray_probe(server: ServerProcess) -> Iterator[RayProbe]:
    """A :class:`RayProbe` on ``server``'s cluster for the ``with`` block."""
    probe = RayProbe(server)
    try:
        yield probe
    finally:
        probe.close()


#: Environment variable a test sets on a server it starts, with a value of its own: Ray's
#: workers and vLLM's processes inherit the server's environment, so the value finds every
#: process of that server's tree, whatever session or process group Ray put it in.
MARK_VAR = "FLEETSERVE_TEST_TREE"
#: ``MARK_VAR``'s value on the session's shared ``fleetserve_url`` server.
SHARED_MARK = f"shared-{uuid.uuid4().hex[:12]}"


def marked_processes(mark: str) -> dict[int, str]:
    """PID -> command line of every live (not zombie) process whose environment has
    ``MARK_VAR=mark``."""
    out: dict[int, str] = {}
    needle = f"{MARK_VAR}={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


#: In the environment of every process vLLM's engine spawns, and of no process before it:
#: the replica sets it in its own ``os.environ`` just before starting vLLM
#: (``engine/vllm_engine.py``), and ``/proc/<pid>/environ`` shows the environment a process
#: started with - so the replica itself does not show it, its engine processes do.
ENGINE_SPAWN_VAR = b"VLLM_WORKER_MULTIPROC_METHOD="


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _environ_has(pid: int, var: bytes) -> bool:
    """Whether ``pid`` started with ``var`` (``b"NAME="``) set; False for one that ended."""
    try:
        return var.decode().removesuffix("=") in environ(pid)
    except OSError:
        return False


def vllm_roles(processes: dict[int, str]) -> dict[int, str]:
    """PID -> ``EngineCore`` or ``Worker`` for the vLLM processes among ``processes`` (PID ->
    command line, e.g. one server's ``marked_processes``), found by environment and
    parentage, never by title: a CI run read ``spawn_main`` in ``/proc/<pid>/cmdline`` for
    both after the engine had answered a request.

    The engine processes carry ``ENGINE_SPAWN_VAR``; the roots among them (parent without
    it) are what the replica spawned - the engine core, multiprocessing's resource tracker,
    the engine's watchdog. The engine core is the root that spawned engine processes of its
    own: its workers."""
    engine = {pid for pid in processes if _environ_has(pid, ENGINE_SPAWN_VAR)}
    parent = {pid: _ppid(pid) for pid in engine}
    roots = {pid for pid in engine if parent[pid] not in engine}
    roles: dict[int, str] = {}
    for pid in engine:
        if parent[pid] in roots:
            roles[pid] = "Worker"
            roles[parent[pid]] = "EngineCore"  # type: ignore[index]
    return roles


def reapers(processes: dict[int, str], what: str = "engine") -> list[int]:
    """The watchdogs (``engine/reaper.py``) of ``what`` - engines, or ``"ray-agents"`` - among
    ``processes``: by the module and first argument they run (``python -m
    fleetserve.engine.reaper engine ...``) or the title they give themselves - either
    reading of ``/proc/<pid>/cmdline`` counts."""
    return [
        pid
        for pid, cmd in processes.items()
        if f"fleetserve.engine.reaper {what} " in cmd or REAPER_TITLES[what] in cmd
    ]


class BackgroundStream:
    """A streamed POST read on a thread of its own, for a test that breaks its server
    while the stream is in flight: the SSE ``data:`` payloads arrive in ``events``, and
    ``first`` is set with the first of them."""

    def __init__(self, url: str, body: dict[str, Any], timeout_s: float = 120) -> None:
        self.events: list[str] = []
        self.first = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(url, body, timeout_s), name="stream", daemon=True
        )
        self._thread.start()

    def _read(self, url: str, body: dict[str, Any], timeout_s: float) -> None:
        with httpx.stream("POST", url, json=body, timeout=timeout_s) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.first.set()

    def join(self, timeout_s: float) -> bool:
        """Whether the stream ended within ``timeout_s``."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


class Servers:
    """Helpers for tests that start their own server (conftest is not importable)."""

    vllm_roles = staticmethod(vllm_roles)
    ppid = staticmethod(_ppid)
    environ = staticmethod(environ)
    reapers = staticmethod(reapers)

    Process = ServerProcess
    Stream = BackgroundStream
    ready_line = FLEETSERVE_READY
    mark_var = MARK_VAR
    free_port = staticmethod(free_port)
    fleetserve_argv = staticmethod(fleetserve_argv)
    start_fleetserve = staticmethod(start_fleetserve)
    ray_probe = staticmethod(ray_probe)
    marked_processes = staticmethod(marked_processes)


@pytest.fixture(scope="session")
def servers(own_ray: None) -> type[Servers]:
    """Start-a-server helpers: ``servers.Process``, ``servers.free_port()``, ...

    A test that uses them starts a Ray cluster of its own: it is marked ``ray``."""
    return Servers


#: The session's fake-engine fleet (``fake_fleet``): the models of the tests that only send
#: it requests, each test module its own models. test_serve_routing.py: ``chat`` (2
#: replicas, prefix routing), ``elastic`` (autoscaling 1..2), ``sleepy``/``sleepy-fast``
#: (scale to zero); test_serve_adapter_affinity.py: ``lora-chat`` (2 replicas, adapters
#: ``FAKE_ADAPTERS`` in its ``adapter_dir``). CPU shares are Ray's logical reservations
#: (the fake engine uses none of them): together at most 1.8 of this 2-core host's 2.
FAKE_FLEET_SPEC = """
models:
  - name: chat
    source: fake
    max_model_len: 8192
    resources: {{cpu: 0.3}}
    replicas: {{min: 2, max: 2, max_ongoing_requests: 2, target_ongoing_requests: 2}}
    routing: {{policy: prefix, load_factor: 10, stats_period_s: 1}}
  - name: elastic
    source: fake
    max_model_len: 1024
    resources: {{cpu: 0.25}}
    replicas:
      min: 1
      max: 2
      target_ongoing_requests: 2
      max_ongoing_requests: 8
      upscale_delay_s: 0
      downscale_delay_s: 5
      look_back_period_s: 2
  - name: sleepy
    source: fake
    max_model_len: 1024
    resources: {{cpu: 0.25}}
    replicas: {{min: 0, max: 1, downscale_delay_s: 2, look_back_period_s: 2,
               cold_start_timeout_s: 120}}
  - name: sleepy-fast
    source: fake
    max_model_len: 1024
    resources: {{cpu: 0.25}}
    replicas: {{min: 0, max: 1, downscale_delay_s: 2, look_back_period_s: 2,
               cold_start_timeout_s: 0.05}}
  - name: lora-chat
    source: fake
    max_model_len: 8192
    resources: {{cpu: 0.1}}
    adapter_dir: {adapter_dir}
    max_loras: 2
    replicas: {{min: 2, max: 2, max_ongoing_requests: 2, target_ongoing_requests: 2}}
    routing: {{policy: prefix, stats_period_s: 1}}
"""
FAKE_ADAPTERS = ("sql", "legal")
#: Serve pushes autoscaling metrics every 10 s by default; 1 s keeps the tests short.
FAKE_FLEET_ENV = {
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
}
#: Seconds per token of the fake engine in ``fake_fleet``.
FAKE_TOKEN_DELAY_S = 0.05


@dataclasses.dataclass(frozen=True)
class FakeFleet:
    """The session's ``fleetserve serve --engine fake`` of ``FAKE_FLEET_SPEC``."""

    url: str  # base URL, no /v1
    server: ServerProcess
    #: Which replica served what, and how many run: asked of the replicas and Serve.
    ray: RayProbe
    #: ``MARK_VAR``'s value in the environment of every process of the server.
    mark: str


@pytest.fixture(scope="session")
def fake_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    servers: type[Servers],
    release_after_last_use: Any,
    request: pytest.FixtureRequest,
) -> Iterator[FakeFleet]:
    """One fake-engine fleet for every test that does not stop or break it: one Ray start
    instead of one per module. Stopped after its last test."""
    tmp = tmp_path_factory.mktemp("fake-fleet")
    adapters = tmp / "adapters"
    for name in FAKE_ADAPTERS:
        (adapters / name).mkdir(parents=True)
        config = {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}
        (adapters / name / "adapter_config.json").write_text(json.dumps(config))
    mark = f"fake-{uuid.uuid4().hex[:12]}"
    started = start_fleetserve(
        tmp,
        FAKE_FLEET_SPEC.format(adapter_dir=adapters),
        "session fake fleet",
        fake_token_delay=FAKE_TOKEN_DELAY_S,
        env={**FAKE_FLEET_ENV, MARK_VAR: mark},
    )
    try:
        probe = RayProbe(started.server)
    except BaseException:
        started.server.stop()
        raise

    def stop() -> None:
        probe.close()
        started.server.stop()

    release_after_last_use(request, stop)
    try:
        yield FakeFleet(started.url, started.server, probe, mark)
    finally:
        stop()


@pytest.fixture(scope="session")
def real_engine(default_model_dir: Path) -> Path:
    """The default model's directory, for a fixture that starts a real vLLM engine on it:
    requesting this marks the fixture's tests ``engine`` (tests/conftest.py)."""
    return default_model_dir


@dataclasses.dataclass
class EngineFleet:
    """The session's ``fleetserve serve`` of the default fleet on vLLM."""

    url: str  # base URL, no /v1
    #: None where the tests use a server that is already running (``FLEETSERVE_TEST_URL``).
    server: ServerProcess | None
    #: Ray's metrics export port (None: an outside server's is unknown).
    metrics_port: int | None
    #: ``MARK_VAR``'s value in the environment of every process of the server.
    mark: str
    #: Set once ``retiring_engine_fleet`` has stopped it; no test may use it after that.
    retired: bool = False

    def processes(self) -> dict[int, str]:
        """PID -> command line of every live process of the server now."""
        return marked_processes(self.mark)


@pytest.fixture(scope="session")
def engine_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    real_engine: Path,
    servers: type[Servers],
    release_after_last_use: Any,
    request: pytest.FixtureRequest,
) -> Iterator[EngineFleet]:
    """A running ``fleetserve serve`` (default fleet, real vLLM engine), shared by every test
    of the default fleet on the real engine.

    ``FLEETSERVE_TEST_URL`` points the tests at a server that is already running instead.
    """
    if os.environ.get("FLEETSERVE_TEST_URL"):
        yield EngineFleet(os.environ["FLEETSERVE_TEST_URL"].rstrip("/"), None, None, "")
        return
    port, metrics_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("fleetserve") / "fleetserve.log"
    argv = fleetserve_argv("--port", str(port), "--metrics-export-port", str(metrics_port))
    server = ServerProcess("fleetserve", argv, log, env={MARK_VAR: SHARED_MARK})
    url = f"http://127.0.0.1:{port}"
    release_after_last_use(request, server.stop)
    server.wait_ready(f"{url}/ready", log_line=FLEETSERVE_READY)
    yield EngineFleet(url, server, metrics_port, SHARED_MARK)
    server.stop()


@pytest.fixture(scope="session")
def fleetserve_url(engine_fleet: EngineFleet) -> str:
    """Base URL (no ``/v1``) of the session's ``engine_fleet``."""
    assert not engine_fleet.retired, "a test ran after retiring_engine_fleet (tests/conftest.py)"
    return engine_fleet.url


@pytest.fixture
def fleetserve_processes(engine_fleet: EngineFleet) -> dict[int, str]:
    """PID -> command line of every live process of the ``engine_fleet`` server now, the
    ``fleetserve serve`` driver included; skips where that server is not ours to inspect
    (``FLEETSERVE_TEST_URL``)."""
    if engine_fleet.server is None:
        pytest.skip("FLEETSERVE_TEST_URL: the server's processes are not this session's")
    return engine_fleet.processes()


@pytest.fixture
def retiring_engine_fleet(engine_fleet: EngineFleet) -> Iterator[EngineFleet]:
    """The session's ``engine_fleet`` for a test that ends it (its tests run after every
    other user: tests/conftest.py SHARED_ORDER); skips on an outside server."""
    if engine_fleet.server is None:
        pytest.skip("FLEETSERVE_TEST_URL: the server is not this session's to stop")
    assert not engine_fleet.retired, "the session's engine fleet was already retired"
    try:
        yield engine_fleet
    finally:
        engine_fleet.retired = True


@pytest.fixture(scope="session")
def default_engine_args() -> list[str]:
    """The engine options fleetserve gives the default model, as `vllm serve` options."""
    spec = default_fleet()
    model = spec.models[0]
    settings = local_deployment(spec, probe()).models[model.name].engine
    assert model.source is not None  # the default fleet names its model's weights
    path = ModelStore().resolve(model.source)
    return EngineConfig.from_spec(model, model_path=path, settings=settings).vllm_cli_args()


def process_fleet_spec() -> str:
    """The default fleet with ``frontend: process`` - nothing else changed, so its server's
    engine options are the default fleet's (``default_engine_args``)."""
    model = default_fleet().models[0]
    entry = model.model_dump(mode="json", exclude_defaults=True) | {"frontend": "process"}
    return yaml.safe_dump({"models": [entry]})


@dataclasses.dataclass
class ProcessFleet:
    """The session's ``fleetserve serve`` of the default fleet with ``frontend: process``:
    its replica forwards to vLLM's own OpenAI server beside it, on a Unix socket."""

    url: str  # base URL, no /v1
    server: ServerProcess
    #: ``MARK_VAR``'s value in the environment of every process of the server.
    mark: str
    #: Ray's metrics export of this fleet's node.
    metrics_url: str
    #: Set once a ``retiring_process_fleet`` test has broken or stopped it.
    retired: bool = False
    #: Every server socket ``engine_sockets`` has found (a replaced replica's included).
    seen_sockets: set[str] = dataclasses.field(default_factory=set)

    def processes(self) -> dict[int, str]:
        return marked_processes(self.mark)

    def engine_servers(self) -> dict[int, str]:
        """PID -> command line of this fleet's vLLM servers (one per replica)."""
        return {
            pid: cmd
            for pid, cmd in self.processes().items()
            if "vllm.entrypoints.openai.api_server" in cmd and "--uds" in cmd.split()
        }

    def engine_sockets(self) -> list[str]:
        """The Unix sockets of this fleet's vLLM servers (their command lines say where)."""
        out = []
        for cmd in self.engine_servers().values():
            parts = cmd.split()
            out.append(parts[parts.index("--uds") + 1])
        self.seen_sockets.update(out)
        return sorted(set(out))


@pytest.fixture(scope="session")
def process_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    real_engine: Path,
    servers: type[Servers],
    release_after_last_use: Any,
    request: pytest.FixtureRequest,
) -> Iterator[ProcessFleet]:
    """``fleetserve serve`` of the default fleet with ``frontend: process``: the tests of
    that frontend, and - its vLLM server being vLLM's own OpenAI server with the default
    model's engine options - the session's `vllm serve` (``vllm``)."""
    mark = f"frontend-{uuid.uuid4().hex[:12]}"
    metrics_port = free_port()
    started = start_fleetserve(
        tmp_path_factory.mktemp("frontend-process"),
        process_fleet_spec(),
        "frontend: process",
        env={MARK_VAR: mark},
        extra_args=("--metrics-export-port", str(metrics_port)),
    )
    release_after_last_use(request, started.server.stop)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    yield ProcessFleet(started.url, started.server, mark, metrics_url)
    started.server.stop()


@pytest.fixture
def retiring_process_fleet(process_fleet: ProcessFleet) -> Iterator[ProcessFleet]:
    """The session's ``process_fleet`` for a test that breaks or stops it: after its other
    users (the retiring tests themselves run in file order)."""
    try:
        yield process_fleet
    finally:
        process_fleet.retired = True


@pytest.fixture(scope="session")
def vllm(process_fleet: ProcessFleet, default_engine_args: list[str]) -> Iterator[httpx.Client]:
    """A client of vLLM's own OpenAI server on the default model with the engine options
    fleetserve gives it: ``process_fleet``'s server, asked on its socket (no engine start
    of its own). Its command line must carry exactly ``default_engine_args``."""
    assert not process_fleet.retired, "a test used vllm after retiring_process_fleet"
    (cmd,) = process_fleet.engine_servers().values()
    assert f" {' '.join(default_engine_args)} " in f" {cmd} ", (default_engine_args, cmd)
    (socket,) = process_fleet.engine_sockets()
    transport = httpx.HTTPTransport(uds=socket)
    with httpx.Client(base_url="http://engine", transport=transport, timeout=300) as client:
        yield client
