"""Where quota counters live: one Serve deployment shared by every ingress replica.

Design note. Counters must hold across several ingress replicas and across the restart
of one, so they cannot be per-process dicts. They live in a :class:`QuotaKeeper`
deployment - one replica (a Ray actor that Serve keeps alive and that the application
owns: it starts and is deleted with the app, unlike a detached actor that a joined
cluster would leak) hosting the :class:`~fleetserve.serve.guard.quota.QuotaLedger`. Its clock
is the only clock of the arithmetic. Each request costs one awaited round-trip
(``admit``) and one that is not waited for (``settle``); nothing blocks the ingress's
event loop.

When the keeper cannot answer within :data:`ADMIT_TIMEOUT_S` (it is being replaced) the
ingress *fails open*: the request is served without a reservation and a warning is
logged - a quota store outage must not become a service outage (Envoy's rate limit
filter makes the same default choice).

The keeper's replica can die too, so it checkpoints its ledger into Ray's internal KV
(the GCS) at most every :data:`CHECKPOINT_S` seconds when it changed - off the request
path: a background task pickles the ledger on the replica's loop and writes it from a
thread - and a new keeper starts from the checkpoint. What it can lose is the last
second's admissions. Every counter is time-based (sliding minutes, the UTC day, leases),
so a checkpoint older than that restores nothing stale. Its methods are ``async`` with
no ``await`` inside: each decision runs whole on the replica's event loop (Serve would
run plain methods in a thread pool, where two admissions could interleave).

``QuotaStore`` is the Protocol the gateway uses; :class:`LocalQuotaStore` is the same
ledger in-process (unit tests, single-process tools).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from ray import serve

from fleetserve.serve.guard.quota import Decision, Limits, QuotaLedger, RateLimitHeaders

#: Longest wait for the keeper's admission answer before failing open.
ADMIT_TIMEOUT_S = 2.0
#: Serve deployment name of the keeper.
KEEPER_DEPLOYMENT = "quota"
#: Most seconds between a change of the counters and its checkpoint.
CHECKPOINT_S = 1.0
#: The checkpoint's namespace in Ray's internal KV (its key is the application's name).
CHECKPOINT_NAMESPACE = "fleetserve-quota"

_log = logging.getLogger(__name__)


class QuotaStore(Protocol):
    """Admission and settlement against the shared counters."""

    async def admit(self, scopes: tuple[str, ...], tokens: int) -> Decision:
        """Reserve ``tokens`` in every scope, or refuse (see QuotaLedger.admit)."""

    async def settle(self, reservation: str, used_tokens: int | None, served: bool = True) -> None:
        """Replace a reservation by the real usage and free its concurrency slot."""


class LocalQuotaStore:
    """The ledger in this process."""

    def __init__(
        self,
        limits: dict[str, Limits],
        *,
        lease_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = QuotaLedger(limits, lease_s=lease_s)
        self._clock = clock

    async def admit(self, scopes: tuple[str, ...], tokens: int) -> Decision:
        return self.ledger.admit(scopes, tokens, self._clock())

    async def settle(self, reservation: str, used_tokens: int | None, served: bool = True) -> None:
        self.ledger.settle(reservation, used_tokens, self._clock(), served=served)


def limits_to_args(limits: dict[str, Limits]) -> dict[str, dict[str, int | None]]:
    """Plain-data form of scope limits (Serve deployment arguments)."""
    return {
        scope: {
            "requests_per_minute": lim.requests_per_minute,
            "tokens_per_minute": lim.tokens_per_minute,
            "concurrent_requests": lim.concurrent_requests,
            "tokens_per_day": lim.tokens_per_day,
        }
        for scope, lim in limits.items()
    }


def limits_from_args(data: dict[str, dict[str, Any]]) -> dict[str, Limits]:
    return {scope: Limits(**values) for scope, values in data.items()}


class Checkpoint(Protocol):
    """Where the keeper's ledger survives the keeper."""

    def load(self) -> bytes | None:
        """The last saved ledger (None: none)."""

    def save(self, data: bytes) -> None:
        """Replace the saved ledger (blocking; called from a thread)."""


class RayKVCheckpoint:
    """The ledger in Ray's internal KV (the GCS): outlives every replica of the app."""

    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def load(self) -> bytes | None:
        from ray.experimental import internal_kv  # noqa: PLC0415 - Ray only where Ray runs

        data: bytes | None = internal_kv._internal_kv_get(self._key, namespace=CHECKPOINT_NAMESPACE)
        return data

    def save(self, data: bytes) -> None:
        from ray.experimental import internal_kv  # noqa: PLC0415

        internal_kv._internal_kv_put(
            self._key, data, overwrite=True, namespace=CHECKPOINT_NAMESPACE
        )


@serve.deployment(
    num_replicas=1,
    # Each call is a few microseconds of arithmetic; the whole fleet's requests pass here.
    max_ongoing_requests=100_000,
    ray_actor_options={"num_cpus": 0},
    health_check_period_s=10,
)
class QuotaKeeper:
    """The shared counters (one replica: a single, exact decision point)."""

    def __init__(
        self,
        limits: dict[str, dict[str, Any]],
        lease_s: float,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self._ledger = QuotaLedger(limits_from_args(limits), lease_s=lease_s)
        self._checkpoint = checkpoint or RayKVCheckpoint(serve.get_replica_context().app_name)
        try:
            data = self._checkpoint.load()
            if data is not None:
                self._ledger.restore(data)
                _log.info("quota keeper: counters restored from the checkpoint")
        except Exception as e:  # a lost checkpoint costs counters, not the service
            _log.warning("quota keeper: checkpoint not restored (%s); empty counters", e)
        self._changes = 0
        self._saver: asyncio.Task[None] | None = None

    async def admit(self, scopes: tuple[str, ...], tokens: int) -> Decision:
        decision = self._ledger.admit(tuple(scopes), int(tokens), time.time())
        self._changed()
        return decision

    async def settle(self, reservation: str, used_tokens: int | None, served: bool = True) -> None:
        self._ledger.settle(reservation, used_tokens, time.time(), served=served)
        self._changed()

    async def open_reservations(self) -> int:
        return self._ledger.open_reservations()

    def _changed(self) -> None:
        self._changes += 1
        if self._saver is None or self._saver.done():
            self._saver = asyncio.get_running_loop().create_task(self._save_changes())

    async def _save_changes(self) -> None:
        """Checkpoint once a second while the counters change; end when they do not."""
        saved = -1
        while saved != self._changes:
            await asyncio.sleep(CHECKPOINT_S)
            changes, data = self._changes, self._ledger.snapshot()
            try:
                await asyncio.to_thread(self._checkpoint.save, data)
            except Exception as e:
                _log.warning("quota keeper: checkpoint failed (%s)", e)
            saved = changes

    async def flush(self) -> None:
        """Wait for the checkpoint of every change so far (tests, shutdown)."""
        while self._saver is not None and not self._saver.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._saver)


class HandleQuotaStore:
    """The keeper through a Serve deployment handle (the real path)."""

    def __init__(self, handle: Any, *, timeout_s: float = ADMIT_TIMEOUT_S) -> None:
        self._handle = handle
        self._timeout_s = timeout_s

    async def admit(self, scopes: tuple[str, ...], tokens: int) -> Decision:
        try:
            decision: Decision = await asyncio.wait_for(
                self._handle.admit.remote(scopes, tokens), self._timeout_s
            )
        except Exception as e:
            # Fail open (see the module note): no reservation, no headers.
            _log.warning("quota keeper unavailable (%s); serving without a reservation", e)
            return Decision(None, tokens, RateLimitHeaders())
        return decision

    async def settle(self, reservation: str, used_tokens: int | None, served: bool = True) -> None:
        try:
            await asyncio.wait_for(
                self._handle.settle.remote(reservation, used_tokens, served), self._timeout_s * 5
            )
        except Exception as e:
            _log.warning("quota keeper: settling %s failed (%s)", reservation, e)


__all__ = [
    "ADMIT_TIMEOUT_S",
    "CHECKPOINT_S",
    "KEEPER_DEPLOYMENT",
    "Checkpoint",
    "HandleQuotaStore",
    "LocalQuotaStore",
    "QuotaKeeper",
    "QuotaStore",
    "RayKVCheckpoint",
    "limits_from_args",
    "limits_to_args",
]
