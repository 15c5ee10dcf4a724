"""Engines sharing a card take turns to start (vLLM's memory profile must see no neighbour
starting); the turn is a flock per card, dropped by the kernel when its holder dies."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from fleetserve.engine.card_turns import card_turn, lock_path, visible_cards


def test_visible_cards_reads_cuda_visible_devices() -> None:
    assert visible_cards({"CUDA_VISIBLE_DEVICES": "3,1"}) == ["1", "3"]
    assert visible_cards({"CUDA_VISIBLE_DEVICES": " GPU-ab12 "}) == ["GPU-ab12"]
    assert visible_cards({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_cards({}) == []


def test_lock_names_are_safe_file_names(tmp_path: Path) -> None:
    assert lock_path("GPU-1/2", tmp_path).name == "fleetserve-card-GPU-1_2.lock"


def test_a_second_engine_on_the_card_waits_for_the_first(tmp_path: Path) -> None:
    order: list[str] = []
    held = threading.Event()

    def first() -> None:
        with card_turn(["0"], name="a", directory=tmp_path):
            order.append("a in")
            held.set()
            time.sleep(0.5)
            order.append("a out")

    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    with card_turn(["0"], name="b", directory=tmp_path) as waited:
        order.append("b in")
    t.join()
    assert order == ["a in", "a out", "b in"]
    assert waited >= 0.3


def test_engines_on_other_cards_do_not_wait(tmp_path: Path) -> None:
    with (
        card_turn(["0"], name="a", directory=tmp_path),
        card_turn(["1"], name="b", directory=tmp_path) as waited,
    ):
        assert waited < 0.2


def test_a_holder_that_dies_releases_its_turn(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from fleetserve.engine.card_turns import card_turn\n"
            f"with card_turn(['0'], name='x', directory=Path({str(tmp_path)!r})):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with card_turn(["0"], name="y", directory=tmp_path) as waited:
        assert waited < 5
