"""Fixtures shared by the unit tests.

* ``gateways``: the gateway's HTTP app in-process (no Ray) over fake engines made from a
  fleet spec, or over a given model client, and an httpx client that drives it. The gateway,
  limits, quota and gateway-metrics tests share it, so they all build the gateway the one way
  ``fleetserve serve`` does: engines from the spec's models, routes, keys from the spec.
* ``process_stand_in``: ``frontend: process``'s real adapter on an aiohttp app standing in
  for its ``vllm serve`` on a Unix socket (the adapter's tests, the ingress's handoff tests).
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.fake_engine import FakeEngine
from fleetserve.engine.server_hop import open_session
from fleetserve.engine.settings import EngineSettings
from fleetserve.engine.vllm_process import VllmProcessEngine
from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.serve.ingress.gateway import Gateway, ModelRoute, create_api
from fleetserve.serve.ingress.model_client import LocalModelClient, ModelClient
from fleetserve.spec import FleetSpec, parse_spec

#: Small engines: enough for the few tokens a gateway test asks for.
SETTINGS = EngineSettings(
    gpu_memory_utilization=0.1, max_num_seqs=8, max_model_len=64, max_num_batched_tokens=64
)


class Gateways:
    """Gateway test helpers (a conftest module is not importable: tests get this class)."""

    settings = SETTINGS

    @staticmethod
    async def build(
        spec: Mapping[str, Any] | FleetSpec,
        env: Mapping[str, str] | None = None,
        *,
        settings: EngineSettings = SETTINGS,
        token_delay_s: float = 0.0,
        **gateway_kwargs: Any,
    ) -> tuple[Gateway, dict[str, FakeEngine]]:
        """A gateway over one started fake engine per model of ``spec``, and those engines.

        Tenant keys are resolved from ``env`` only (never the test process's environment);
        ``gateway_kwargs`` go to :class:`Gateway` (``limits``, ``metrics_sink``, ...).
        """
        fleet = spec if isinstance(spec, FleetSpec) else parse_spec(spec)
        engines = {}
        for model in fleet.models:
            config = EngineConfig.from_spec(
                model,
                model_path="fake",
                settings=settings,
                kind="fake",
                fake_token_delay_s=token_delay_s,
            )
            engines[model.name] = FakeEngine(config)
            await engines[model.name].start()
        routes = [ModelRoute(m.name, settings.max_model_len) for m in fleet.models]
        keys = ApiKeyTable.from_spec(fleet, env or {})
        return Gateway(routes, keys, LocalModelClient(engines), **gateway_kwargs), engines

    @staticmethod
    def over(
        client: ModelClient, model: str = "alpha", max_model_len: int = 64, **gateway_kwargs: Any
    ) -> Gateway:
        """A gateway serving one keyless ``model`` through ``client`` (a fake Serve failure)."""
        keys = ApiKeyTable(model_tenants={model: None})
        return Gateway([ModelRoute(model, max_model_len)], keys, client, **gateway_kwargs)

    @staticmethod
    def client(
        gateway: Gateway, *, raise_app_exceptions: bool = True, **httpx_kwargs: Any
    ) -> httpx.AsyncClient:
        """An httpx client on the gateway's ASGI app (``http://test`` unless given).

        Its 60 s timeout is only a ceiling against a hung test on a loaded 2-core host;
        the time limits under test are the gateway's own (``RequestLimits``).
        """
        transport = httpx.ASGITransport(
            app=create_api(gateway), raise_app_exceptions=raise_app_exceptions
        )
        options = {"base_url": "http://test", "timeout": 60, **httpx_kwargs}
        return httpx.AsyncClient(transport=transport, **options)

    @staticmethod
    def error(r: httpx.Response, status: int, err_type: str | None = None) -> dict[str, Any]:
        """The body's error in vLLM's shape (asserted), with ``status`` (and ``err_type``)."""
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == status
        if err_type is not None:
            assert error["type"] == err_type
        return error  # type: ignore[no-any-return]

    @staticmethod
    def http_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        """An ASGI scope for a POST to ``path``: for tests that play the server's side."""
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
        }


@pytest.fixture(scope="session")
def gateways() -> type[Gateways]:
    """Gateway helpers: ``await gateways.build(spec)``, ``gateways.client(gateway)``, ..."""
    return Gateways


class ProcessStandIn:
    """``vllm serve`` stood in by an aiohttp app on a Unix socket, and the process-frontend
    adapter (``VllmProcessEngine``) on it, as its ``start`` leaves it. The server's process
    is a live ``sleep`` (:attr:`proc`), which the adapter checks is running: kill it to
    play a server that exited."""

    #: The adapter's engine options (its forwarding reads none of them).
    config = EngineConfig(
        name="m",
        model_path="/models/m",
        settings=EngineSettings(
            gpu_memory_utilization=0.5,
            max_num_seqs=8,
            max_model_len=1024,
            max_num_batched_tokens=1024,
        ),
        frontend="process",
    )

    def __init__(self, tmp_path: Path) -> None:
        self.path = str(tmp_path / "vllm.sock")
        self.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self._runner: web.AppRunner | None = None
        self._engine: VllmProcessEngine | None = None

    async def start(self, app: web.Application) -> VllmProcessEngine:
        """Serve ``app`` on the socket; the adapter on it."""
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.UnixSite(self._runner, self.path).start()
        engine = self._engine = VllmProcessEngine(self.config)
        engine._session, engine._proc, engine._socket = (
            open_session(self.path),
            self.proc,
            self.path,
        )
        return engine

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.shutdown()  # stops the stand-in process too
        if self._runner is not None:
            await self._runner.cleanup()
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
async def process_stand_in(tmp_path: Path) -> AsyncIterator[ProcessStandIn]:
    """``await process_stand_in.start(app)``: the process-frontend adapter on ``app``."""
    stand_in = ProcessStandIn(tmp_path)
    yield stand_in
    await stand_in.close()
