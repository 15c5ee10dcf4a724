"""The ingress's fleet view: replica counts from its own routers, statuses from the
controller, ``serve.status()`` only until every router has reported."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleetserve.serve.ingress import model_client
from fleetserve.serve.ingress.model_client import HandleModelClient, fleet_health
from fleetserve.serve.ingress.probes import ModelHealth
from fleetserve.serve.routing import registry


class FakeHandle:
    def __init__(self, deployment: str, app: str = "fleetserve") -> None:
        self.deployment_name = deployment
        self.app_name = app

    def options(self, **_: Any) -> FakeHandle:
        return self


def test_fleet_health_joins_router_counts_and_deployment_statuses() -> None:
    health = fleet_health(
        {"a": ("app", "model-a"), "b": ("app", "model-b")},
        {"a": 2, "b": 0},
        {("app", "model-a"): "HEALTHY", ("app", "model-b"): "UNHEALTHY"},
    )
    assert health == {
        "a": ModelHealth(running=2, status="HEALTHY"),
        "b": ModelHealth(running=0, status="UNHEALTHY"),
    }
    assert not health["b"].alive


def test_fleet_health_refuses_a_view_without_the_deployment() -> None:
    # A restarting controller lists no application: say nothing rather than "0 replicas".
    with pytest.raises(RuntimeError, match="model 'a'"):
        fleet_health({"a": ("app", "model-a")}, {"a": 1}, {})


def test_health_reads_routers_and_statuses_not_serve_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[set[str]] = []

    def statuses(apps: set[str]) -> dict[tuple[str, str], str]:
        calls.append(apps)
        return {("fleetserve", "model-h1"): "HEALTHY"}

    async def forbidden(self: HandleModelClient) -> dict[str, ModelHealth]:
        raise AssertionError("serve.status() read although every router reported")

    monkeypatch.setattr(model_client, "_deployment_statuses", statuses)
    monkeypatch.setattr(HandleModelClient, "_health_from_serve_status", forbidden)
    registry.publish("model-h1", 3)
    client = HandleModelClient({"m": FakeHandle("model-h1")})
    assert asyncio.run(client.health()) == {"m": ModelHealth(running=3, status="HEALTHY")}
    assert calls == [{"fleetserve"}]


def test_health_falls_back_to_serve_status_until_a_router_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def full(self: HandleModelClient) -> dict[str, ModelHealth]:
        return {"m": ModelHealth(running=1, status="UPSCALING")}

    def statuses(apps: set[str]) -> dict[tuple[str, str], str]:
        raise AssertionError("partial view used before every router reported")

    monkeypatch.setattr(HandleModelClient, "_health_from_serve_status", full)
    monkeypatch.setattr(model_client, "_deployment_statuses", statuses)
    client = HandleModelClient({"m": FakeHandle("model-never-routed")})
    assert registry.replicas("model-never-routed") is None
    assert asyncio.run(client.health()) == {"m": ModelHealth(running=1, status="UPSCALING")}


def test_statuses_are_reused_counts_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def statuses(apps: set[str]) -> dict[tuple[str, str], str]:
        reads.append(1)
        return {("fleetserve", "model-h2"): "HEALTHY"}

    monkeypatch.setattr(model_client, "_deployment_statuses", statuses)
    client = HandleModelClient({"m": FakeHandle("model-h2")})
    registry.publish("model-h2", 2)
    assert asyncio.run(client.health())["m"].running == 2
    registry.publish("model-h2", 0)  # a replica died: seen at once, no status read
    assert asyncio.run(client.health())["m"].running == 0
    assert len(reads) == 1


def test_an_incomplete_status_read_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [{}, {("fleetserve", "model-h3"): "HEALTHY"}]
    monkeypatch.setattr(model_client, "_deployment_statuses", lambda apps: answers.pop(0))
    client = HandleModelClient({"m": FakeHandle("model-h3")})
    registry.publish("model-h3", 1)
    with pytest.raises(RuntimeError):
        asyncio.run(client.health())
    assert asyncio.run(client.health())["m"] == ModelHealth(running=1, status="HEALTHY")
