"""The serving fast path: Ray Serve's throughput flags reach the Ray that fleetserve starts,
the ingress gets the user's port and Serve's proxy a side port; a joined cluster or
``server.direct_ingress: false`` keeps Serve's defaults."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from ray import serve

from fleetserve.serve import runner
from fleetserve.serve.runner import FleetServer, ServeOptions, fast_path_env
from fleetserve.spec import parse_spec

KEYS = (
    "RAY_SERVE_THROUGHPUT_OPTIMIZED",
    "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT",
    "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S",
    "RAY_SERVE_PORT_QUARANTINE_S",
    "RAY_SERVE_LOG_TO_STDERR",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S",
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

    def init(self, **_: Any) -> None:
        self.env = {k: os.environ[k] for k in KEYS if k in os.environ}

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


def test_free_port_is_bindable() -> None:
    port = runner._free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
