"""One request's measurements: the unit every report is built from.

A plain slotted dataclass (not a pydantic model) because one is created per request inside
the event loop, where construction cost is timing error; pydantic's TypeAdapter serialises it
for the JSON report. Times are seconds; ``start`` is relative to the run's origin (the
monotonic clock reading stored in the report), all other times are durations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from fleetserve.bench.workload.base import BenchRequest

#: Error types a record may carry (``error_type``); the summary counts them.
ERROR_TYPES = (
    "connection_refused",  # nothing listening / DNS failure
    "connect_timeout",
    "timeout",  # the request exceeded --timeout
    "server_disconnected",  # connection closed mid-response
    "http_error",  # non-200 status (see ``status``)
    "stream_error",  # an SSE ``error`` event inside a 200 stream
    "invalid_response",  # a 200 response that is not a parseable SSE stream
    "empty_response",  # a 200 stream that ended without any generated token
    "client_error",  # anything else raised while sending (message in ``error``)
    "interrupted",  # still in flight when the run was interrupted (Ctrl-C)
)


@dataclass(slots=True)
class RequestRecord:
    """Timings, token counts and outcome of one benchmark request."""

    id: int
    """Sequence number over the whole run (all load points)."""
    point: str
    """Label of the load point this request belongs to (``c=16``, ``rate=5``...)."""
    warmup: bool = False
    """Warm-up requests are kept in the JSON but excluded from every statistic."""
    group: int | None = None
    """Shared-prefix group (shared-prefix workload) or ``None``."""
    scheduled: float = 0.0
    """When the load shape wanted the request sent (s since the run origin)."""
    start: float = 0.0
    """When the request was actually sent (s since the run origin)."""
    ttft: float | None = None
    """Time to first generated token (s), ``None`` when none arrived."""
    itl: list[float] = field(default_factory=list)
    """Gaps between consecutive streamed content chunks after the first (s)."""
    e2e: float | None = None
    """Time from sending to the end of the response or the failure (s)."""
    tokens_in: int | None = None
    """Prompt tokens (counted as the report's ``tokens_source`` says)."""
    tokens_out: int | None = None
    """Generated tokens (counted as the report's ``tokens_source`` says)."""
    usage_in: int | None = None
    """``usage.prompt_tokens`` reported by the server, if it reported usage."""
    usage_out: int | None = None
    """``usage.completion_tokens`` reported by the server, if it reported usage."""
    chunks: int = 0
    """Streamed events that carried generated content."""
    status: int | None = None
    """HTTP status, ``None`` when no response arrived (connection errors)."""
    ok: bool = False
    """True when the stream completed with at least one generated token."""
    error_type: str | None = None
    """One of :data:`ERROR_TYPES` when ``ok`` is False."""
    error: str | None = None
    """Human-readable error (server message or exception text), truncated."""
    finish_reason: str | None = None
    """The last ``finish_reason`` the server sent (``length``, ``stop``...)."""
    text: str | None = None
    """Generated text; kept in memory for token counting and ``--results``, not in JSON."""
    request: BenchRequest | None = None
    """The request sent; kept in memory for token counting and ``--results``, not in JSON."""

    @property
    def end(self) -> float:
        """When the response ended or failed (s since the run origin)."""
        return self.start + (self.e2e or 0.0)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: ``(e2e - ttft) / (tokens_out - 1)``."""
        if self.ttft is None or self.e2e is None or not self.tokens_out or self.tokens_out < 2:
            return None
        return (self.e2e - self.ttft) / (self.tokens_out - 1)


#: Fields written to the JSON report (``text`` and ``request`` stay in memory).
JSON_FIELDS = tuple(f.name for f in fields(RequestRecord) if f.name not in ("text", "request"))


def record_to_json(record: RequestRecord) -> dict[str, Any]:
    """The record as the JSON report stores it."""
    return {name: getattr(record, name) for name in JSON_FIELDS}
