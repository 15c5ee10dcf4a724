"""The probes' fleet view: which of Serve's replica states count as serving."""

from __future__ import annotations

import asyncio

from ray.serve._private.common import DeploymentStatus, ReplicaState

from fleetserve.serve.ingress.probes import ModelHealth, ProbeState, model_health


def test_replicas_a_restarted_controller_is_recovering_still_serve() -> None:
    # After a Serve controller restart every live replica is RECOVERING until the new
    # controller re-confirms it; it keeps serving meanwhile (Serve's handles route on).
    health = model_health({ReplicaState.RECOVERING: 1}, DeploymentStatus.HEALTHY)
    assert health == ModelHealth(running=1, status="HEALTHY")


def test_only_replicas_that_serve_are_counted() -> None:
    states = {
        ReplicaState.RUNNING: 2,
        ReplicaState.PENDING_MIGRATION: 1,
        ReplicaState.STARTING: 3,
        ReplicaState.STOPPING: 4,
        ReplicaState.UPDATING: 5,
    }
    assert model_health(states, DeploymentStatus.UPSCALING).running == 3
    # Plain strings (serve.status() over JSON) read the same.
    assert model_health({"STARTING": 1, "STOPPING": 1}, "UNHEALTHY") == ModelHealth(
        running=0, status="UNHEALTHY"
    )


class Views:
    """A health source that answers a scripted sequence of fleet views."""

    def __init__(self, *views: dict[str, ModelHealth]) -> None:
        self.views = list(views)

    async def health(self) -> dict[str, ModelHealth]:
        return self.views.pop(0)


def test_a_controller_restart_does_not_take_a_model_down() -> None:
    down: list[str] = []
    restarting = model_health({"RECOVERING": 1}, "UPDATING")
    state = ProbeState(
        Views({"m": ModelHealth(1)}, {"m": restarting}, {"m": ModelHealth(1)}),
        {"m": 1},
        on_down=down.append,
    )

    async def refresh_three_times() -> None:
        for _ in range(3):
            await state.refresh()
            assert not state.no_replica("m")
            assert state.ready(draining=False)

    asyncio.run(refresh_three_times())
    assert down == []
