"""Quota arithmetic (pure): reservations, sliding windows, settlement, headers, refusals."""

from __future__ import annotations

import random

import pytest

from fleetserve.serve.guard.quota import (
    DAY_S,
    WINDOW_S,
    Limits,
    QuotaLedger,
    format_duration,
    reserve_tokens,
)

T0 = 1_000_000 * DAY_S + 3600.0  # an hour into some UTC day
A = ("tenant:a",)


def ledger(**limits: int) -> QuotaLedger:
    return QuotaLedger({"tenant:a": Limits(**limits)}, lease_s=100.0)


def test_reservation_bounds_prompt_and_completion() -> None:
    # body bytes bound the prompt; n choices of max_tokens; capped by the context.
    assert (
        reserve_tokens(body_bytes=50, max_tokens=10, n=1, max_model_len=4096, generates=True) == 60
    )
    assert (
        reserve_tokens(body_bytes=50, max_tokens=10, n=3, max_model_len=4096, generates=True) == 80
    )
    # No max_tokens: vLLM may generate up to the context length.
    assert (
        reserve_tokens(body_bytes=50, max_tokens=None, n=1, max_model_len=512, generates=True)
        == 512
    )
    # A body larger than the context is capped (the engine refuses a longer prompt).
    assert (
        reserve_tokens(body_bytes=10_000, max_tokens=5, n=1, max_model_len=512, generates=True)
        == 512
    )
    assert (
        reserve_tokens(body_bytes=70, max_tokens=None, n=1, max_model_len=512, generates=False)
        == 70
    )


def test_tokens_per_minute_is_never_exceeded_by_reservations() -> None:
    q = ledger(tokens_per_minute=100)
    admitted = 0
    for i in range(50):
        d = q.admit(A, 30, T0 + i * 0.1)
        admitted += d.tokens if d.admitted else 0
    assert admitted == 90  # three of 30; the fourth would make 120 > 100
    refused = q.admit(A, 30, T0 + 5)
    assert refused.refusal is not None
    r = refused.refusal
    assert (r.limit_name, r.limit, r.used, r.requested) == ("tokens per minute", 100, 90, 30)
    # The first admission (at T0) must leave the window to free 20 tokens.
    assert r.retry_after_s == pytest.approx(WINDOW_S - 5)
    assert "Limit 100, Used 90, Requested 30" in r.message


def test_settling_replaces_the_reservation_with_real_usage() -> None:
    q = ledger(tokens_per_minute=100)
    d1 = q.admit(A, 60, T0)
    assert d1.reservation is not None
    assert not q.admit(A, 60, T0 + 1).admitted
    q.settle(d1.reservation, 12, T0 + 2)  # it used 12 of its 60
    d2 = q.admit(A, 60, T0 + 3)
    assert d2.admitted
    assert d2.headers.remaining_tokens == 100 - 12 - 60
    # Usage above the reservation is charged too (the ledger never counts less).
    assert d2.reservation is not None
    q.settle(d2.reservation, 80, T0 + 4)
    assert q.headers(A, T0 + 4).remaining_tokens == 100 - 12 - 80
    # Unknown or repeated ids are ignored.
    q.settle(d2.reservation, 0, T0 + 5)
    q.settle("nope-1", 0, T0 + 5)
    assert q.headers(A, T0 + 5).remaining_tokens == 100 - 12 - 80


def test_window_slides() -> None:
    q = ledger(requests_per_minute=2)
    assert q.admit(A, 0, T0).admitted
    assert q.admit(A, 0, T0 + 30).admitted
    refused = q.admit(A, 0, T0 + 59)
    assert refused.refusal is not None
    assert refused.refusal.retry_after_s == pytest.approx(1.0)
    assert q.admit(A, 0, T0 + 60.001).admitted  # the first one left the window
    assert not q.admit(A, 0, T0 + 61).admitted


def test_a_request_larger_than_the_limit_is_refused_without_retry_after() -> None:
    q = ledger(tokens_per_minute=100, tokens_per_day=1000)
    d = q.admit(A, 150, T0)
    assert d.refusal is not None
    assert d.refusal.retry_after_s is None
    assert "never fit" in d.refusal.message


def test_daily_budget_resets_at_utc_midnight() -> None:
    q = ledger(tokens_per_day=100)
    assert q.admit(A, 100, T0).admitted
    d = q.admit(A, 1, T0 + 10)
    assert d.refusal is not None
    assert d.refusal.limit_name == "tokens per day"
    midnight = (T0 // DAY_S + 1) * DAY_S
    assert d.refusal.retry_after_s == pytest.approx(midnight - (T0 + 10))
    assert q.admit(A, 100, midnight + 1).admitted


def test_concurrency_slots_free_on_settle_or_lease_end() -> None:
    q = ledger(concurrent_requests=2)
    d1, d2 = q.admit(A, 0, T0), q.admit(A, 0, T0)
    refused = q.admit(A, 0, T0)
    assert refused.refusal is not None
    assert refused.refusal.limit_name == "concurrent requests"
    assert d1.reservation is not None
    q.settle(d1.reservation, 0, T0 + 1)
    assert q.admit(A, 0, T0 + 1).admitted
    assert not q.admit(A, 0, T0 + 2).admitted
    # A lost ingress never settles d2: its lease (100 s) ends and the slot comes back.
    assert d2.reservation is not None
    assert q.admit(A, 0, T0 + 101).admitted


def test_all_scopes_pass_or_none_is_charged() -> None:
    q = QuotaLedger(
        {"tenant:a": Limits(tokens_per_minute=100), "key:a/*": Limits(tokens_per_minute=40)}
    )
    k1, k2 = ("tenant:a", "key:a/k1"), ("tenant:a", "key:a/k2")
    assert q.admit(k1, 40, T0).admitted
    refused = q.admit(k1, 1, T0)  # the key is full, the tenant is not
    assert refused.refusal is not None
    assert refused.refusal.scope == "key:a/k1"
    assert q.admit(k2, 40, T0).admitted  # another key of the same tenant
    assert q.headers(("tenant:a",), T0).remaining_tokens == 20  # the refusal charged nothing
    d = q.admit(k2, 30, T0)  # key k2 has 0 left
    assert d.refusal is not None
    # Headers report the scope that binds next (least remaining).
    assert d.headers.limit_tokens == 40
    assert d.headers.remaining_tokens == 0


def test_unserved_requests_are_given_back() -> None:
    q = ledger(requests_per_minute=1, tokens_per_minute=50)
    d = q.admit(A, 50, T0)
    assert d.reservation is not None
    q.settle(d.reservation, None, T0, served=False)  # the server was overloaded (503)
    assert q.admit(A, 50, T0 + 1).admitted


def test_headers_follow_openai_names_and_formats() -> None:
    q = ledger(requests_per_minute=10, tokens_per_minute=1000)
    q.admit(A, 100, T0)
    h = dict(q.admit(A, 200, T0 + 30).headers.items())
    assert h == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "8",
        "x-ratelimit-reset-requests": "1m0s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "700",
        "x-ratelimit-reset-tokens": "1m0s",
    }
    assert format_duration(0.02) == "20ms"
    assert format_duration(1.25) == "1.3s"
    assert format_duration(3723) == "1h2m3s"


def test_random_interleavings_never_pass_the_limit() -> None:
    """Whatever the order of admissions and settlements, no 60 s window holds more
    admitted tokens (reservations, then real usage) than the limit."""
    rng = random.Random(7)
    limit = 500
    q = ledger(tokens_per_minute=limit)
    now = T0
    open_ids: list[tuple[str, int]] = []
    charged: list[tuple[float, list[int]]] = []  # admission time, [tokens]
    by_id: dict[str, list[int]] = {}
    for _ in range(3000):
        now += rng.expovariate(5.0)
        if open_ids and rng.random() < 0.5:
            rid, reserved = open_ids.pop(rng.randrange(len(open_ids)))
            used = rng.randint(0, reserved)
            q.settle(rid, used, now)
            by_id[rid][0] = used
            continue
        want = rng.randint(1, 120)
        d = q.admit(A, want, now)
        if d.admitted:
            assert d.reservation is not None
            cell = [want]
            by_id[d.reservation] = cell
            charged.append((now, cell))
            open_ids.append((d.reservation, want))
        window = sum(c[0] for t, c in charged if t > now - WINDOW_S)
        assert window <= limit
