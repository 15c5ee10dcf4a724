"""Per-request timelines: off by default, and on, every point of a relayed stream lands in
the process's file (fleetserve.observe.timeline, benchmarks/gpu/timeline.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetserve.engine.protocol import ResponseHead
from fleetserve.observe import timeline
from fleetserve.observe.timeline import Timeline
from fleetserve.serve.replica import relay
from fleetserve.serve.replica.relay import END_OF_STREAM, RelayReceiver, RelaySender, relay_stream


def _read(directory: Path) -> list[tuple[int, str, int]]:
    rows = []
    for path in directory.glob("timeline-*.tsv"):
        for line in path.read_text().splitlines():
            stream, point, ns = line.split("\t")
            rows.append((int(stream), point, int(ns)))
    return rows


def test_off_it_writes_nothing_and_starts_no_thread(tmp_path: Path) -> None:
    t = Timeline(None)
    t.point(1, "i_recv")
    t.flush()
    assert not t.enabled
    assert t._writer is None
    assert not t._lines


def test_on_points_reach_the_file_in_order_with_a_given_time(tmp_path: Path) -> None:
    t = Timeline(str(tmp_path / "tl"))
    t.point(7, "i_recv", 123)
    t.point(7, "i_call")
    t.flush()
    rows = _read(tmp_path / "tl")
    assert [(s, p) for s, p, _ in rows] == [(7, "i_recv"), (7, "i_call")]
    assert rows[0][2] == 123
    assert rows[1][2] > 123


def test_a_directory_that_cannot_be_written_turns_it_off(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    t = Timeline(str(blocker / "tl"))  # under a file: mkdir fails
    t.point(1, "i_recv")
    t.flush()  # no exception reaches the serving path
    assert not t.enabled


async def test_a_relayed_stream_passes_every_replica_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on = Timeline(str(tmp_path))
    monkeypatch.setattr(relay, "TIMELINE", on)
    receiver = await RelayReceiver.start(node_id="node-a", tcp_host=None)
    sender = RelaySender("node-a")

    async def items() -> AsyncIterator[ResponseHead | bytes]:
        yield ResponseHead(status=200, headers=(), media_type="text/event-stream")
        for i in range(3):
            await asyncio.sleep(0)
            yield b"data: %d\n\n" % i

    try:
        ticket, inbox = receiver.open_stream()
        await relay_stream(sender, ticket, items())
        while (await inbox.get()) is not END_OF_STREAM:
            pass
    finally:
        sender.close()
        receiver.close()
    on.flush()
    rows = _read(tmp_path)
    assert [p for s, p, _ in rows if s == ticket.stream] == ["r_recv", "r_head", "r_data", "r_end"]
    times = [ns for _, _, ns in rows]
    assert times == sorted(times)


def test_the_process_timeline_follows_the_environment() -> None:
    # How users run: the variable unset, so every point returns at once.
    assert timeline.ENV == "FLEETSERVE_TIMELINE_DIR"
    assert not timeline.TIMELINE.enabled
