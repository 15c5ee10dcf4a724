"""The serving fast path: Ray Serve's throughput flags reach the Ray that fleetserve starts,
the ingress gets the user's port and Serve's proxy a side port; a joined cluster or
``server.direct_ingress: false`` keeps Serve's defaults. A Ray started for CPU engines runs
on the cores its engines will not claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from ray import serve

from fleetserve.engine.cpu_binding import BIND_ENV, HOST_CPUS_ENV, format_cores
from fleetserve.host import HostFacts
from fleetserve.plan.local import joined_deployment
from fleetserve.serve.control import runner
from fleetserve.serve.control.runner import FleetServer, ServeOptions, fast_path_env
from fleetserve.spec import parse_spec

KEYS = (
    "RAY_SERVE_THROUGHPUT_OPTIMIZED",
    "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT",
    "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S",
    "RAY_SERVE_PORT_QUARANTINE_S",
    "RAY_SERVE_LOG_TO_STDERR",
    *runner.LOCAL_RAY_ENV,
    HOST_CPUS_ENV,
)


@pytest.fixture(autouse=True)
def clean_env() -> Iterator[None]:
    # The runner sets these in os.environ (for the Ray it starts): none may leak out.
    saved = {k: os.environ.pop(k) for k in KEYS if k in os.environ}
    yield
    for key in KEYS:
        os.environ.pop(key, None)
    os.environ.update(saved)


def test_env_pins_the_ingress_to_exactly_the_port() -> None:
    env = fast_path_env(8123, verbose=False)
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    # Ray's range is [min, max): one port, the user's.
    assert (
        env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"],
        env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"],
    ) == ("8123", "8124")
    assert env["RAY_SERVE_PORT_QUARANTINE_S"] == "0"
    assert fast_path_env(8123, verbose=True)["RAY_SERVE_LOG_TO_STDERR"] == "1"


def _server(server: dict[str, Any] | None = None) -> FleetServer:
    spec = parse_spec({"models": [{"name": "m", "source": "fake"}], "server": server or {}})
    return FleetServer(ServeOptions(spec=spec, host="127.0.0.1", port=8123, engine="fake"))


class Recorder:
    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.http: dict[str, Any] = {}
        self.affinity: set[int] = set()

    def init(self, **_: Any) -> None:
        self.env = {k: os.environ[k] for k in KEYS if k in os.environ}
        # What Ray's daemons, started from this thread, would inherit.
        self.affinity = os.sched_getaffinity(0)

    @staticmethod
    def runtime_context() -> Any:
        # What the started Ray answers about itself (its GCS address).
        return SimpleNamespace(gcs_address="192.0.2.7:6379")

    def start(self, http_options: dict[str, Any]) -> None:
        self.http = http_options


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(ray, "init", rec.init)
    monkeypatch.setattr(ray, "get_runtime_context", rec.runtime_context)
    monkeypatch.setattr(serve, "start", rec.start)
    monkeypatch.setattr(FleetServer, "_submit", lambda self, app: None)
    monkeypatch.setattr(FleetServer, "_wait_running", lambda self: None)
    return rec


def test_started_ray_gets_the_fast_path_and_the_proxy_moves_aside(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    server = _server()
    server._start_ray()
    # The exact address, so tools join this cluster and not another one on the host.
    assert "fleetserve: Ray started at 192.0.2.7:6379" in capsys.readouterr().out
    server._deploy(object())
    assert recorder.env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert recorder.env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == "8123"
    assert recorder.env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.5"
    # Ray's workers (the engine's included) at vLLM's footing, not Ray's niceness 15.
    assert recorder.env["RAY_worker_niceness"] == "0"
    assert recorder.http["host"] == "127.0.0.1"
    assert recorder.http["port"] != 8123  # the ingress replica owns 8123


def test_values_already_in_the_environment_win(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_SERVE_PORT_QUARANTINE_S", "5")
    _server()._start_ray()
    assert recorder.env["RAY_SERVE_PORT_QUARANTINE_S"] == "5"


def test_direct_ingress_off_keeps_serves_proxy_on_the_port(recorder: Recorder) -> None:
    server = _server({"direct_ingress": False})
    server._start_ray()
    server._deploy(object())
    # Only the settings of every Ray fleetserve starts (Serve's slower control loop).
    assert recorder.env == runner.LOCAL_RAY_ENV
    assert recorder.http["port"] == 8123


CORES = sorted(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two CPU cores")


def _engine_server(
    engine: str = "vllm", gpus: list[int] | None = None, tp: int = 1, replicas: int = 1
) -> FleetServer:
    model = {"name": "m", "source": "fake", "tensor_parallel": tp}
    model["replicas"] = {"min": 1, "max": replicas}
    spec = parse_spec({"models": [model]})
    server = FleetServer(ServeOptions(spec=spec, host="127.0.0.1", port=8123, engine=engine))  # type: ignore[arg-type]
    # What check() measured and planned: one CPU per replica, as Ray assigns it.
    server._host = HostFacts(cpus=len(CORES), memory_mb=8192, gpu_memory_mb=gpus or [])
    server._plan = joined_deployment(spec, gpu=bool(gpus))
    return server


@two_cores
def test_ray_for_cpu_engines_starts_on_the_cores_they_do_not_claim(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BIND_ENV, raising=False)
    _engine_server()._start_ray()
    # The engine claims the lowest core; Ray, Serve and the ingress get the others ...
    assert recorder.affinity == set(CORES[1:])
    # ... and its replica learns the host's cores, to spawn the engine on them.
    assert recorder.env[HOST_CPUS_ENV] == format_cores(CORES)
    assert os.sched_getaffinity(0) == set(CORES)  # the driver keeps its own


@two_cores
@pytest.mark.parametrize(
    ("engine", "gpus", "tp", "bind"),
    [
        ("fake", None, 1, None),  # the fake engine claims no core
        ("vllm", [81920], 1, None),  # GPU engines are not pinned to cores
        ("vllm", None, 2, None),  # vLLM binds an engine over several processes itself
        ("vllm", None, 1, "0"),  # the user's binding is left alone
    ],
)
def test_ray_keeps_every_core_where_no_engine_claims_one(
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    gpus: list[int] | None,
    tp: int,
    bind: str | None,
) -> None:
    if bind is None:
        monkeypatch.delenv(BIND_ENV, raising=False)
    else:
        monkeypatch.setenv(BIND_ENV, bind)
    _engine_server(engine, gpus, tp)._start_ray()
    assert recorder.affinity == set(CORES)
    assert HOST_CPUS_ENV not in recorder.env


def test_every_local_ray_setting_is_one_ray_reads() -> None:
    # A name Ray stopped reading would be a silent no-op: the daemons start with the
    # runner's environment, so read each setting back the way Ray's own modules do.
    probe = (
        "import json\n"
        "from ray._private import log_monitor\n"
        "from ray.dashboard import consts\n"
        "from ray.dashboard.modules.reporter import reporter_consts\n"
        "from ray.serve._private import constants as serve\n"
        "print(json.dumps({\n"
        "  'RAY_SERVE_CONTROL_LOOP_INTERVAL_S': serve.CONTROL_LOOP_INTERVAL_S,\n"
        "  'RAY_LOG_MONITOR_MANY_FILES_THRESHOLD':\n"
        "      log_monitor.RAY_LOG_MONITOR_MANY_FILES_THRESHOLD,\n"
        "  'LOG_NAME_UPDATE_INTERVAL_S': log_monitor.LOG_NAME_UPDATE_INTERVAL_S,\n"
        "  'RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S':\n"
        "      consts.DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S,\n"
        "  'REPORTER_UPDATE_INTERVAL_MS': reporter_consts.REPORTER_UPDATE_INTERVAL_MS,\n"
        "}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in runner.LOCAL_RAY_ENV}
    read = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe],
            env={**env, **runner.LOCAL_RAY_ENV},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    for name, value in read.items():
        assert float(value) == float(runner.LOCAL_RAY_ENV[name]), name
    # The worker niceness is the raylet's (C++): tests/integration/test_serve_chaos.py
    # reads it back from a running server's processes.
    assert set(read) | {"RAY_worker_niceness"} == set(runner.LOCAL_RAY_ENV)


def test_a_ray_node_that_misses_rays_startup_wait_is_started_again_and_nothing_is_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray gives its raylet a fixed 30 s to register; a loaded host can miss it, and the
    failed try leaves its daemons as our children. They go, and Ray starts once more."""
    rec = Recorder()
    daemons: list[subprocess.Popen[bytes]] = []

    def init(**kwargs: Any) -> None:
        if not daemons:  # the first try: a daemon started, then Ray's own timeout
            daemons.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
            raise Exception(
                "The current node timed out during startup. This could happen because some "
                "of the raylet failed to startup or the GCS has become overloaded."
            )
        rec.init(**kwargs)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "get_runtime_context", rec.runtime_context)
    _server()._start_ray()
    assert daemons[0].wait(timeout=10) is not None  # the first try's daemon was stopped
    out = capsys.readouterr().out
    assert "starting Ray again (2 of 2)" in out
    assert "Ray started at" in out
    assert rec.env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.5"


def test_another_ray_failure_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def init(**_: Any) -> None:
        calls.append(1)
        raise RuntimeError("Permission denied: /tmp/ray")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(runner.ServeError, match="cannot start Ray: Permission denied"):
        _server()._start_ray()
    assert calls == [1]
