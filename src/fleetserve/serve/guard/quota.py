"""Tenant quotas: the exact arithmetic of admission, reservation and reconciliation.

Design note. A request is checked against every *scope* it belongs to (its tenant, and
its API key when the tenant has ``quota_per_key``) and every limit of each scope, and is
charged to all of them only when all pass - one atomic decision in one place (the
:class:`QuotaLedger`, hosted by one actor shared by every ingress replica). Tokens are
*reserved* at admission with an upper bound of what the request can cost (see
:func:`reserve_tokens`) and the reservation is replaced by the engine's reported usage
when the response ends (:meth:`QuotaLedger.settle`). So the tokens admitted in any
60-second window never pass ``tokens_per_minute``: LiteLLM, which counts only after the
response, let 663 tokens through a 100-TPM limit.

* Minute limits are sliding windows over admission times (no burst at a window edge).
  The token window holds one entry per request, reserved then settled in place.
* The daily budget is a counter of the current UTC day.
* ``concurrent_requests`` counts open reservations; each holds a lease (the server's
  request timeout plus a margin) so a lost ingress replica cannot pin a slot forever.
* A request larger than a limit could ever admit is refused without ``Retry-After``
  (waiting would not help); every other refusal says exactly when it would fit.

Times are wall-clock seconds (``time.time()``) given by the caller, so the core is pure.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import secrets
from collections import deque
from dataclasses import dataclass, field

from fleetserve.spec import QuotaSpec

#: Length of the sliding window of the per-minute limits (seconds).
WINDOW_S = 60.0
#: Seconds in a UTC day (the daily budget's period).
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one scope (None: unlimited); plain data, picklable."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None
    tokens_per_day: int | None = None

    @classmethod
    def from_spec(cls, spec: QuotaSpec) -> Limits:
        return cls(
            requests_per_minute=spec.requests_per_minute,
            tokens_per_minute=spec.tokens_per_minute,
            concurrent_requests=spec.concurrent_requests,
            tokens_per_day=spec.tokens_per_day,
        )


def reserve_tokens(
    *, body_bytes: int, max_tokens: int | None, n: int, max_model_len: int, generates: bool
) -> int:
    """An upper bound of the tokens one request can consume (prompt + completion).

    The prompt is bounded by the UTF-8 bytes of the request body: with byte-level BPE or
    SentencePiece byte fallback every token covers at least one byte, and the body also
    carries the JSON around each message, more bytes than the chat template adds tokens.
    The engine refuses a prompt over ``max_model_len`` and caps each of the ``n`` choices
    at ``max_model_len`` - prompt, which bounds both terms. Without ``max_tokens`` vLLM
    generates up to the context length, so that is what is reserved.
    """
    prompt = min(body_bytes, max_model_len)
    if not generates:
        return prompt
    per_choice = max_model_len if max_tokens is None else min(max_tokens, max_model_len)
    n = max(n, 1)
    return min(prompt + n * per_choice, n * max_model_len)


@dataclass(slots=True)
class _Entry:
    """One admitted request in a token window (its tokens change when it settles)."""

    at: float
    tokens: int


@dataclass(slots=True)
class _Scope:
    limits: Limits
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[_Entry] = field(default_factory=deque)
    window_tokens: int = 0
    day: int = -1
    day_tokens: int = 0
    open: dict[str, float] = field(default_factory=dict)  # reservation id -> lease end

    def expire(self, now: float) -> None:
        edge = now - WINDOW_S
        while self.requests and self.requests[0] <= edge:
            self.requests.popleft()
        while self.tokens and self.tokens[0].at <= edge:
            self.window_tokens -= self.tokens.popleft().tokens
        today = int(now // DAY_S)
        if today != self.day:
            self.day, self.day_tokens = today, 0
        limit = self.limits.concurrent_requests
        if limit is not None and len(self.open) >= limit:
            for rid in [r for r, end in self.open.items() if end <= now]:
                del self.open[rid]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused: the limit, what is used, what was asked."""

    scope: str
    limit_name: str  # "requests per minute", "tokens per minute", ...
    limit: int
    used: int
    requested: int
    retry_after_s: float | None  # None: the request can never fit this limit

    @property
    def message(self) -> str:
        what = self.scope.replace(":", " '", 1) + "'" if ":" in self.scope else self.scope
        text = (
            f"Rate limit reached for {what} on {self.limit_name}: "
            f"Limit {self.limit}, Used {self.used}, Requested {self.requested}."
        )
        if self.retry_after_s is None:
            return text + " The request can never fit this limit; lower max_tokens."
        return text + f" Please try again in {format_duration(self.retry_after_s)}."


@dataclass(frozen=True, slots=True)
class RateLimitHeaders:
    """OpenAI's ``x-ratelimit-*`` values for one response (None: not limited)."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None

    def items(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.limit_requests is not None:
            out += [
                ("x-ratelimit-limit-requests", str(self.limit_requests)),
                ("x-ratelimit-remaining-requests", str(max(0, self.remaining_requests or 0))),
                ("x-ratelimit-reset-requests", format_duration(self.reset_requests_s or 0.0)),
            ]
        if self.limit_tokens is not None:
            out += [
                ("x-ratelimit-limit-tokens", str(self.limit_tokens)),
                ("x-ratelimit-remaining-tokens", str(max(0, self.remaining_tokens or 0))),
                ("x-ratelimit-reset-tokens", format_duration(self.reset_tokens_s or 0.0)),
            ]
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """The ledger's answer: admitted with a reservation id, or refused."""

    reservation: str | None
    tokens: int
    headers: RateLimitHeaders
    refusal: Refusal | None = None

    @property
    def admitted(self) -> bool:
        return self.refusal is None


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


class QuotaLedger:
    """Every scope's counters; ``admit`` / ``settle`` are the only mutations."""

    def __init__(self, limits: dict[str, Limits], *, lease_s: float = 3600.0) -> None:
        self._limits = dict(limits)
        self._scopes: dict[str, _Scope] = {}
        self._lease_s = lease_s
        # reservation id -> (scopes, tokens reserved, token-window entries, UTC day)
        self._open: dict[str, tuple[tuple[str, ...], int, list[_Entry | None], int]] = {}
        self._next_id = 0
        self._epoch = secrets.token_hex(4)  # ids of an earlier ledger never match

    def _scope(self, name: str) -> _Scope | None:
        scope = self._scopes.get(name)
        if scope is None:
            # "key:<tenant>/*" gives each key of the tenant the same limits.
            limits = self._limits.get(name) or self._limits.get(name.rsplit("/", 1)[0] + "/*")
            if limits is None:
                return None
            scope = self._scopes[name] = _Scope(limits)
        return scope

    def admit(self, scopes: tuple[str, ...], tokens: int, now: float) -> Decision:
        """Check ``tokens`` (a reservation) against every limit of ``scopes``; charge all
        of them, or none."""
        live = [(name, s) for name in scopes if (s := self._scope(name)) is not None]
        for _, s in live:
            s.expire(now)
        for name, s in live:
            refusal = _check(name, s, tokens, now)
            if refusal is not None:
                return Decision(None, tokens, _headers(live, now), refusal)
        rid = f"{self._epoch}-{self._next_id}"
        self._next_id += 1
        entries: list[_Entry | None] = []
        for _, s in live:
            s.requests.append(now)
            entry = _Entry(now, tokens)
            s.tokens.append(entry)
            s.window_tokens += tokens
            s.day_tokens += tokens
            entries.append(entry)
            s.open[rid] = now + self._lease_s
        self._open[rid] = (tuple(n for n, _ in live), tokens, entries, int(now // DAY_S))
        return Decision(rid, tokens, _headers(live, now))

    def settle(
        self, reservation: str, used_tokens: int | None, now: float, *, served: bool = True
    ) -> None:
        """Replace a reservation by the real usage (None: keep the reservation) and free
        its concurrency slot. ``served=False`` (the server refused it after admission)
        also gives the request back. Unknown ids (an earlier ledger's, settled) are
        ignored."""
        record = self._open.pop(reservation, None)
        if record is None:
            return
        names, reserved, entries, day = record
        if not served:
            used_tokens = 0
        delta = 0 if used_tokens is None else used_tokens - reserved
        for name, entry in zip(names, entries, strict=True):
            s = self._scopes[name]
            s.open.pop(reservation, None)
            if not served and entry is not None:
                with contextlib.suppress(ValueError):
                    s.requests.remove(entry.at)
            if delta == 0 or entry is None:
                continue
            if s.tokens and s.tokens[0].at <= entry.at:  # still inside the window
                entry.tokens += delta
                s.window_tokens += delta
            if s.day == day:
                s.day_tokens += delta

    def headers(self, scopes: tuple[str, ...], now: float) -> RateLimitHeaders:
        """The current ``x-ratelimit-*`` values of ``scopes`` (no charge)."""
        live = [(name, s) for name in scopes if (s := self._scope(name)) is not None]
        for _, s in live:
            s.expire(now)
        return _headers(live, now)

    def open_reservations(self) -> int:
        return len(self._open)

    def snapshot(self) -> bytes:
        """Every scope's counters and the open reservations, as bytes (a checkpoint).

        Limits are not part of it: a ledger restored from it keeps its own."""
        scopes = {
            name: (s.requests, s.tokens, s.window_tokens, s.day, s.day_tokens, s.open)
            for name, s in self._scopes.items()
        }
        # One pickle keeps the token-window entries shared between scopes and reservations.
        return pickle.dumps((scopes, self._open), protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, data: bytes) -> None:
        """Continue from ``snapshot()`` bytes (of this cluster's own keeper: trusted).

        Scopes without limits now are dropped. Reservation ids of the snapshot stay
        valid (their late settlements still reconcile); new ids get this ledger's own
        epoch, so none can collide with one issued after the snapshot was taken."""
        scopes, open_ = pickle.loads(data)
        for name, (requests, tokens, window, day, day_tokens, leases) in scopes.items():
            scope = self._scope(name)
            if scope is None:
                continue
            scope.requests, scope.tokens, scope.window_tokens = requests, tokens, window
            scope.day, scope.day_tokens, scope.open = day, day_tokens, leases
        self._open = {
            rid: record
            for rid, record in open_.items()
            if all(name in self._scopes for name in record[0])
        }


def _check(name: str, s: _Scope, tokens: int, now: float) -> Refusal | None:
    lim = s.limits
    rpm = lim.requests_per_minute
    if rpm is not None and len(s.requests) + 1 > rpm:
        # The (used - rpm)-th oldest admission must leave the window first.
        wait = s.requests[len(s.requests) - rpm] + WINDOW_S - now
        return Refusal(name, "requests per minute", rpm, len(s.requests), 1, wait)
    tpm = lim.tokens_per_minute
    if tpm is not None and s.window_tokens + tokens > tpm:
        return Refusal(
            name,
            "tokens per minute",
            tpm,
            s.window_tokens,
            tokens,
            _token_wait(s, tokens, tpm, now) if tokens <= tpm else None,
        )
    tpd = lim.tokens_per_day
    if tpd is not None and s.day_tokens + tokens > tpd:
        day_wait = (s.day + 1) * DAY_S - now if tokens <= tpd else None
        return Refusal(name, "tokens per day", tpd, s.day_tokens, tokens, day_wait)
    conc = lim.concurrent_requests
    if conc is not None and len(s.open) + 1 > conc:
        return Refusal(name, "concurrent requests", conc, len(s.open), 1, 1.0)
    return None


def _token_wait(s: _Scope, tokens: int, limit: int, now: float) -> float:
    """Seconds until enough of the window expires for ``tokens`` more."""
    excess = s.window_tokens + tokens - limit
    freed = 0
    for entry in s.tokens:
        freed += entry.tokens
        if freed >= excess:
            return max(0.0, entry.at + WINDOW_S - now)
    return WINDOW_S


def _headers(live: list[tuple[str, _Scope]], now: float) -> RateLimitHeaders:
    """Per dimension, the scope with the least remaining (what binds the caller next)."""
    req: tuple[int, int, float] | None = None
    tok: tuple[int, int, float] | None = None
    for _, s in live:
        lim = s.limits
        if lim.requests_per_minute is not None:
            left = lim.requests_per_minute - len(s.requests)
            reset = s.requests[-1] + WINDOW_S - now if s.requests else 0.0
            if req is None or left < req[1]:
                req = (lim.requests_per_minute, left, reset)
        # Tokens: the per-minute limit; a tenant with only a daily budget reports that.
        if lim.tokens_per_minute is not None:
            left = lim.tokens_per_minute - s.window_tokens
            reset = s.tokens[-1].at + WINDOW_S - now if s.tokens else 0.0
            cand = (lim.tokens_per_minute, left, reset)
        elif lim.tokens_per_day is not None:
            cand = (
                lim.tokens_per_day,
                lim.tokens_per_day - s.day_tokens,
                (s.day + 1) * DAY_S - now,
            )
        else:
            continue
        if tok is None or cand[1] < tok[1]:
            tok = cand
    return RateLimitHeaders(
        limit_requests=req[0] if req else None,
        remaining_requests=req[1] if req else None,
        reset_requests_s=req[2] if req else None,
        limit_tokens=tok[0] if tok else None,
        remaining_tokens=tok[1] if tok else None,
        reset_tokens_s=tok[2] if tok else None,
    )


__all__ = [
    "DAY_S",
    "WINDOW_S",
    "Decision",
    "Limits",
    "QuotaLedger",
    "RateLimitHeaders",
    "Refusal",
    "format_duration",
    "reserve_tokens",
]
