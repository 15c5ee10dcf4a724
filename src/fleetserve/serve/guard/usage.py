"""Token usage of a response, read from what the engine already sent (pure).

Design note. The gateway relays engine bytes untouched, so usage is found without
re-parsing every chunk: a JSON body is parsed once at its end (it was buffered anyway), and a
stream is scanned with a substring test per chunk; only the chunk that carries ``"usage"``
(vLLM's last one, when the client asked for ``stream_options.include_usage``) is parsed.
With ``continuous_usage_stats`` every chunk carries the running total; the last one wins.

What must stay true: one parse per response at most (plus one per usage-bearing chunk);
anything that does not look like OpenAI usage gives ``None``, never an exception - usage is
accounting, it must not break a response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pydantic_core

_USAGE_KEY = b'"usage"'
_DATA = b"data:"


@dataclass(frozen=True)
class Usage:
    """Tokens of one response (OpenAI ``usage``)."""

    prompt_tokens: int
    completion_tokens: int


def _usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int) or prompt < 0:
        return None
    return Usage(prompt_tokens=prompt, completion_tokens=max(completion or 0, 0))


def usage_from_body(body: bytes) -> Usage | None:
    """The ``usage`` of a JSON response body (chat, completions, embeddings)."""
    if _USAGE_KEY not in body:
        return None
    try:
        return _usage(pydantic_core.from_json(body))
    except ValueError:
        return None


class UsageScanner:
    """Feed it the bytes of an SSE stream; ``usage`` is the last usage seen."""

    def __init__(self) -> None:
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        if _USAGE_KEY not in chunk:
            return
        for line in chunk.split(b"\n"):
            if not line.startswith(_DATA) or _USAGE_KEY not in line:
                continue
            try:
                found = _usage(pydantic_core.from_json(line[len(_DATA) :].strip()))
            except ValueError:
                continue
            if found is not None:
                self.usage = found


async def scan_stream(chunks: AsyncIterator[Any], scanner: UsageScanner) -> AsyncIterator[Any]:
    """Pass ``chunks`` through unchanged, feeding the byte chunks to ``scanner``."""
    async for chunk in chunks:
        if isinstance(chunk, bytes):
            scanner.feed(chunk)
        yield chunk
