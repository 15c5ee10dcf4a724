"""Where quota counters live: one Serve deployment shared by every ingress replica.

Design note. Counters must hold across several ingress replicas and across the restart
of one, so they cannot be per-process dicts. They live in a :class:`QuotaKeeper`
deployment - one replica (a Ray actor that Serve keeps alive and that the application
owns: it starts and is deleted with the app, unlike a detached actor that a joined
cluster would leak) hosting the :class:`~fleetserve.serve.quota.QuotaLedger`. Its clock
is the only clock of the arithmetic. Each request costs one awaited round-trip
(``admit``) and one that is not waited for (``settle``); nothing blocks the ingress's
event loop.

When the keeper cannot answer within :data:`ADMIT_TIMEOUT_S` (it is being replaced) the
ingress *fails open*: the request is served without a reservation and a warning is
logged - a quota store outage must not become a service outage (Envoy's rate limit
filter makes the same default choice). A restarted keeper starts with empty counters.

``QuotaStore`` is the Protocol the gateway uses; :class:`LocalQuotaStore` is the same
ledger in-process (unit tests, single-process tools).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from ray import serve

from fleetserve.serve.quota import Decision, Limits, QuotaLedger, RateLimitHeaders

#: Longest wait for the keeper's admission answer before failing open.
ADMIT_TIMEOUT_S = 2.0
#: Serve deployment name of the keeper.
KEEPER_DEPLOYMENT = "quota"

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


@serve.deployment(
    num_replicas=1,
    # Each call is a few microseconds of arithmetic; the whole fleet's requests pass here.
    max_ongoing_requests=100_000,
    ray_actor_options={"num_cpus": 0},
    health_check_period_s=10,
)
class QuotaKeeper:
    """The shared counters (one replica: a single, exact decision point)."""

    def __init__(self, limits: dict[str, dict[str, Any]], lease_s: float) -> None:
        self._ledger = QuotaLedger(limits_from_args(limits), lease_s=lease_s)

    def admit(self, scopes: tuple[str, ...], tokens: int) -> Decision:
        return self._ledger.admit(tuple(scopes), int(tokens), time.time())

    def settle(self, reservation: str, used_tokens: int | None, served: bool = True) -> None:
        self._ledger.settle(reservation, used_tokens, time.time(), served=served)

    def open_reservations(self) -> int:
        return self._ledger.open_reservations()


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
    "KEEPER_DEPLOYMENT",
    "HandleQuotaStore",
    "LocalQuotaStore",
    "QuotaKeeper",
    "QuotaStore",
    "limits_from_args",
    "limits_to_args",
]
