"""The request a workload yields and the protocol every workload follows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, frozen=True)
class BenchRequest:
    """One prompt to send, before it is timed."""

    prompt: str
    """User message (chat) or the prompt after ``system`` (completions)."""
    max_tokens: int
    """Output length asked for (exact when the server honours ``ignore_eos``)."""
    system: str | None = None
    """Shared system prompt (shared-prefix workload)."""
    prompt_tokens: int | None = None
    """Prompt length the workload aimed at, in tokens (``None`` when unknown)."""
    group: int | None = None
    """Shared-prefix group index."""


class Workload(Protocol):
    """A repeatable source of requests."""

    @property
    def name(self) -> str:
        """Short description for reports (``synthetic in=128 out=64``)."""
        ...

    @property
    def size(self) -> int | None:
        """Natural number of requests (lines of a file), ``None`` when unbounded."""
        ...

    @property
    def exact_lengths(self) -> bool:
        """True when prompt lengths were checked with the model's tokenizer."""
        ...

    def requests(self, seed: int) -> Iterator[BenchRequest]:
        """An endless stream (finite sources repeat); the same seed gives the same stream."""
        ...
