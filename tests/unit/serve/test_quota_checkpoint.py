"""The quota keeper's counters survive the keeper: checkpoint, restart, restore."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetserve.serve.guard.quota import Limits, QuotaLedger
from fleetserve.serve.guard.quota_store import QuotaKeeper, limits_to_args

LIMITS = {"tenant:a": Limits(requests_per_minute=3, tokens_per_day=1000)}
SCOPES = ("tenant:a",)


class MemoryCheckpoint:
    """Ray's internal KV as the keeper uses it: bytes under one key."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.saves = 0

    def load(self) -> bytes | None:
        return self.data

    def save(self, data: bytes) -> None:
        self.data = data
        self.saves += 1


def keeper(checkpoint: MemoryCheckpoint) -> Any:
    cls: Any = QuotaKeeper.func_or_class  # the class behind Serve's deployment
    return cls(limits_to_args(LIMITS), 3600.0, checkpoint)


def test_a_restarted_keeper_continues_from_the_checkpoint() -> None:
    store = MemoryCheckpoint()

    async def before_the_crash() -> str:
        first = keeper(store)
        decisions = [await first.admit(SCOPES, 100) for _ in range(2)]
        await first.flush()
        assert decisions[1].reservation is not None
        return decisions[1].reservation

    open_reservation = asyncio.run(before_the_crash())
    assert store.saves >= 1

    async def after_the_restart() -> None:
        second = keeper(store)
        assert await second.open_reservations() == 2
        # The minute window still holds the two requests: one more fits, then 429.
        assert (await second.admit(SCOPES, 100)).admitted
        refused = await second.admit(SCOPES, 100)
        assert refused.refusal is not None
        assert refused.refusal.used == 3
        # A reservation from before the restart still settles (to its real usage).
        await second.settle(open_reservation, 10)
        assert await second.open_reservations() == 2

    asyncio.run(after_the_restart())


def test_without_a_checkpoint_the_keeper_starts_empty() -> None:
    async def fresh() -> None:
        k = keeper(MemoryCheckpoint())
        assert await k.open_reservations() == 0
        for _ in range(3):
            assert (await k.admit(SCOPES, 1)).admitted

    asyncio.run(fresh())


def test_restored_ledger_keeps_tokens_and_issues_new_ids() -> None:
    old = QuotaLedger(LIMITS)
    a = old.admit(SCOPES, 300, 1000.0)
    b = old.admit(SCOPES, 300, 1001.0)
    assert a.reservation is not None
    assert b.reservation is not None
    old.settle(a.reservation, 50, 1002.0)
    new = QuotaLedger(LIMITS)
    new.restore(old.snapshot())
    # Day tokens: 50 (settled) + 300 (open) used; 650 left of 1000.
    assert new.headers(SCOPES, 1003.0).remaining_tokens == 650
    c = new.admit(SCOPES, 0, 1004.0)
    assert c.reservation not in {a.reservation, b.reservation}
    new.settle(b.reservation, 20, 1005.0)  # an old id, settled after the restart
    assert new.headers(SCOPES, 1006.0).remaining_tokens == 1000 - 50 - 20


def test_scopes_without_limits_any_more_are_dropped() -> None:
    old = QuotaLedger({**LIMITS, "tenant:gone": Limits(requests_per_minute=1)})
    gone = old.admit(("tenant:gone",), 5, 1000.0)
    new = QuotaLedger(LIMITS)
    new.restore(old.snapshot())
    assert new.open_reservations() == 0
    assert gone.reservation is not None
    new.settle(gone.reservation, 1, 1001.0)  # unknown now: ignored
