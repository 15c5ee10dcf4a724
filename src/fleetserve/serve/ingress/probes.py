"""Liveness and readiness of the fleet, kept off the model request queues.

Design note. A probe must answer at once under any load and must never take a slot a
paying request needs, so probes read a cached view of the fleet that one background task
refreshes (:data:`REFRESH_S`) from the replicas' state as Ray Serve sees it (each model
deployment's status from the controller, its running replicas from the ingress's own
routers, see ``HandleModelClient.health``), never from the model replicas themselves.
The same view makes the gateway fail fast: a model with no running replica gets 503 +
Retry-After at once, and requests already waiting for such a model are ended
(:meth:`ProbeState.refresh` calls ``on_down``).

* ``/health`` (liveness, like vLLM's ``/health``): 503 once a model's engine has died and
  Serve marks its deployment UNHEALTHY or DEPLOY_FAILED; 200 while replicas start or restart.
* ``/ready`` (readiness): 200 when not draining and every model with ``replicas.min >= 1``
  has a running replica.

Model names appear in probe bodies only for callers that may see them (a valid key, or a
server without keys, where ``/v1/models`` is public anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)

#: Seconds between refreshes of the fleet view (also the fail-fast detection delay).
REFRESH_S = 1.0
#: Deployment states that mean an engine died (or cannot start): liveness fails.
DEAD_STATES = frozenset({"UNHEALTHY", "DEPLOY_FAILED"})
#: Replica states (Serve's ``ReplicaState``) of a replica that serves requests. A
#: restarted Serve controller lists every replica it found alive as RECOVERING until it
#: has re-confirmed it, while the replica itself keeps serving through the handles'
#: cached routing tables; counting only RUNNING made fail-fast refuse (503) every model
#: and cut its waiting requests for the whole controller restart. PENDING_MIGRATION: a
#: running replica on a draining node.
SERVING_STATES = frozenset({"RUNNING", "RECOVERING", "PENDING_MIGRATION"})


@dataclass(frozen=True)
class ModelHealth:
    """One model's replicas as Serve's controller sees them."""

    running: int
    status: str = "HEALTHY"

    @property
    def alive(self) -> bool:
        return self.status not in DEAD_STATES


def model_health(replica_states: Mapping[Any, int], status: object) -> ModelHealth:
    """One model's :class:`ModelHealth` from its deployment's entry in ``serve.status()``
    (``replica_states``: replica state -> count; states and status as enums or strings)."""
    running = sum(n for state, n in replica_states.items() if status_name(state) in SERVING_STATES)
    return ModelHealth(running=int(running), status=status_name(status))


def status_name(value: object) -> str:
    """A Serve state or status (an enum or its string) as its name."""
    return str(getattr(value, "value", value))


class HealthSource(Protocol):
    async def health(self) -> dict[str, ModelHealth]:
        """Every model's :class:`ModelHealth` (raises when the control plane is unreachable)."""


class ProbeState:
    """The cached fleet view, refreshed in the background."""

    def __init__(
        self,
        source: HealthSource,
        min_replicas: Mapping[str, int],
        *,
        on_down: Callable[[str], object] | None = None,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._source = source
        self._min = dict(min_replicas)
        self._on_down = on_down
        self._refresh_s = refresh_s
        self.models: dict[str, ModelHealth] = {}
        self.updated: float | None = None
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def running(self, model: str) -> int | None:
        """Running replicas of ``model`` in this view (None: not known yet)."""
        health = self.models.get(model)
        return None if health is None else health.running

    def ensure_started(self) -> None:
        """Start the refresher on the running loop (idempotent; restarts a dead one)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._refresh_s)

    async def refresh(self) -> None:
        try:
            models = await self._source.health()
        except Exception as e:  # the control plane restarting: keep the last view
            self.error = f"{type(e).__name__}"
            logger.warning("fleet health refresh failed: %s", e)
            return
        self.error = None
        before, self.models, self.updated = self.models, models, time.monotonic()
        if self._on_down is not None:
            for name, health in models.items():
                old = before.get(name)
                if (
                    health.running == 0
                    and (old is None or old.running > 0)
                    and self._min.get(name, 1) > 0
                ):
                    self._on_down(name)

    def no_replica(self, model: str) -> bool:
        """True when ``model`` should have a replica (min >= 1) and the view shows none.

        Models at ``replicas.min: 0`` are left to the cold-start wait instead.
        """
        health = self.models.get(model)
        return health is not None and health.running == 0 and self._min.get(model, 1) > 0

    def live(self) -> bool:
        return all(h.alive for h in self.models.values())

    def ready(self, draining: bool) -> bool:
        if draining or self.updated is None:
            return False
        for name, minimum in self._min.items():
            if minimum > 0 and self.models.get(name, ModelHealth(0)).running == 0:
                return False
        return True

    def describe(self, visible: Callable[[str], bool]) -> dict[str, dict[str, object]]:
        """Per-model detail for a caller (only the models ``visible`` allows).

        A model at ``replicas.min: 0`` without replicas is ready (scaled to zero: a
        request starts one).
        """
        out: dict[str, dict[str, object]] = {}
        for name, h in sorted(self.models.items()):
            if not visible(name):
                continue
            zero = h.running == 0 and self._min.get(name, 1) == 0
            detail: dict[str, object] = {
                "ready": h.running > 0 or zero,
                "running_replicas": h.running,
                "status": h.status,
            }
            if zero:
                detail["scaled_to_zero"] = True
            out[name] = detail
        return out
