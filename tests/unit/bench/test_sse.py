"""SseParser: events split anywhere across network reads come out whole and in order."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from fleetserve.bench.sse import SseParser

STREAM = (
    b'data: {"a": 1}\n\n'
    b": keep-alive comment\n\n"
    b"event: message\nid: 7\ndata: first line\ndata: second line\n\n"
    b"data:no-space\n\n"
    b"retry: 100\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [b'{"a": 1}', b"first line\nsecond line", b"no-space", b"[DONE]"]


def feed_all(parser: SseParser, pieces: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for piece in pieces:
        out.extend(parser.feed(piece))
    return out + parser.flush()


def test_whole_stream_in_one_read() -> None:
    assert feed_all(SseParser(), [STREAM]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all(SseParser(), pieces) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=10))
def test_crlf_line_endings(cuts: list[int]) -> None:
    stream = STREAM.replace(b"\n", b"\r\n")
    bounds = [0, *sorted(c for c in cuts if c <= len(stream)), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all(SseParser(), pieces) == EXPECTED


def test_unterminated_last_event_is_flushed() -> None:
    parser = SseParser()
    assert parser.feed(b"data: 1\n\ndata: [DONE]") == [b"1"]
    assert parser.flush() == [b"[DONE]"]
    assert parser.flush() == []


def test_utf8_split_inside_a_character() -> None:
    payload = "데이터".encode()
    parser = SseParser()
    first = parser.feed(b"data: " + payload[:2])
    rest = parser.feed(payload[2:] + b"\n\n")
    assert first == []
    assert rest[0].decode() == "데이터"
