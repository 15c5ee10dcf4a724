"""The engine contract the serving layer relies on.

An engine answers HTTP-shaped requests (``POST /v1/chat/completions`` with a JSON body)
with a response head followed by body chunks. Keeping the contract at the HTTP level is
deliberate: the real engine runs vLLM's own OpenAI server app, so request validation, chat
templating, sampling parameters, tool parsing and error objects are vLLM's, byte for byte,
and the serving layer never re-implements them.

What must stay true for every implementation:

* ``handle`` yields exactly one :class:`ResponseHead` first, then zero or more non-empty
  ``bytes`` chunks (an SSE stream or a JSON body).
* Closing the iterator early (client disconnect) aborts the engine request: after that,
  :meth:`Engine.stats` no longer counts it as running and ``aborted`` has grown by one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One HTTP request for a model, already routed and authorised by the ingress."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    query_string: str = ""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """Status and headers of a response; always the first item ``handle`` yields."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    media_type: str = "application/json"


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A replica's engine load, for readiness, drain and tests.

    ``running`` counts requests the engine itself still holds (vLLM's unfinished
    requests), ``in_flight`` the HTTP exchanges open in the bridge, ``aborted`` the
    exchanges ended by a client disconnect since start.
    """

    running: int = 0
    in_flight: int = 0
    aborted: int = 0
    completed: int = 0
    #: Of those exchanges, the ones whose stream the ingress read from the engine's own
    #: server (:class:`HandoffEngine`), not through the replica.
    handed_off: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    alive: bool = True
    """False once the engine died under a replica that still runs (vLLM's engine core
    gone): the routers stop choosing the replica until Serve replaces it."""


@runtime_checkable
class Engine(Protocol):
    """An inference engine serving one model inside one replica."""

    async def start(self) -> None:
        """Load the model and get ready; raise :class:`~fleetserve.errors.EngineError`."""

    def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        """Answer one request: a :class:`ResponseHead`, then body chunks."""

    async def check_health(self) -> None:
        """Raise :class:`~fleetserve.errors.EngineError` if the engine is dead."""

    def stats(self) -> EngineStats:
        """Current load (cheap; called per readiness probe)."""

    async def adapters(self) -> tuple[str, ...]:
        """LoRA adapter ids this replica holds loaded now (sorted; () without LoRA): a
        request for one of them starts without loading it (routing by adapter)."""

    async def shutdown(self) -> None:
        """Release the engine (idempotent)."""


@runtime_checkable
class HandoffEngine(Protocol):
    """An engine whose requests an HTTP server of its own answers on a Unix socket
    (``frontend: process``): the ingress on the replica's node may send a request there
    and read its stream itself, one hop less for every token. The replica still admits
    the request (Serve's slot, routing, the cache ledger) and holds it until the ingress
    hands it back.

    What must stay true: :meth:`handoff` refuses (EngineError) whenever :meth:`Engine.handle`
    would; every successful :meth:`handoff` is followed by exactly one :meth:`handed_back`,
    and the request counts in ``in_flight`` between the two."""

    def handoff(self) -> str:
        """The server's socket path for one request (EngineError when it is gone)."""

    def handed_back(self, finished: bool) -> None:
        """The ingress ended the request: read to its end (True) or left (False)."""
