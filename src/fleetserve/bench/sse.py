"""Incremental Server-Sent Events parser over raw bytes.

Design: the stream arrives in arbitrary TCP-sized pieces; :meth:`SseParser.feed` appends
them and returns the ``data`` payload of every event completed so far. It works on bytes
(no decode of partial UTF-8, which may split a character) and only splits on the event
separator, which is cheap: the per-chunk cost bounds the client's capacity. What must stay
true (WHATWG EventSource rules that matter for OpenAI streams): events end at a blank line
(``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``), several ``data:`` lines join with ``\\n``,
one optional space after the colon is dropped, comment lines (``:`` first) and other fields
(``event:``, ``id:``, ``retry:``) are ignored, and an event without data yields nothing.
"""

from __future__ import annotations

import re

_SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE_BREAK = re.compile(rb"\r\n|\n|\r")


class SseParser:
    """Feed bytes, get back the ``data`` payloads (bytes) of completed events."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add ``chunk``; return the payloads of the events it completed, in order."""
        buffer = self._buffer + chunk if self._buffer else chunk
        out: list[bytes] = []
        if b"\r" not in buffer:
            # Fast path (OpenAI-style servers): LF only, one ``data: {...}`` line per event.
            # One C-level split instead of a Python loop over find().
            events = buffer.split(b"\n\n")
            self._buffer = events.pop()  # the incomplete tail (often b"")
            for event in events:
                if event.startswith(b"data: ") and b"\n" not in event:
                    out.append(event[6:])
                elif event:
                    payload = _event_data(event)
                    if payload is not None:
                        out.append(payload)
            return out
        # General path for CR / CRLF line endings.
        pos = 0
        while True:
            match = _SEPARATOR.search(buffer, pos)
            if match is None:
                break
            payload = _event_data(buffer[pos : match.start()])
            pos = match.end()
            if payload is not None:
                out.append(payload)
        self._buffer = buffer[pos:]
        return out

    def flush(self) -> list[bytes]:
        """End of stream: an unterminated last event still counts (EventSource drops it,
        but several servers omit the final blank line after ``[DONE]``)."""
        rest, self._buffer = self._buffer, b""
        payload = _event_data(rest.strip(b"\r\n"))
        return [] if payload is None else [payload]


def _event_data(event: bytes) -> bytes | None:
    data: list[bytes] = []
    for line in _LINE_BREAK.split(event):
        if not line or line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if name != b"data":
            continue
        if sep and value.startswith(b" "):
            value = value[1:]
        data.append(value)
    if not data:
        return None
    return b"\n".join(data)
