"""Engines that share a GPU start one at a time.

Design note. vLLM sizes its KV cache at start-up from a memory profile of its own process
(vllm/v1/worker/gpu_worker.py, ``determine_available_memory``): the free memory of the
whole card before and after a dummy forward pass, less what torch allocated, is counted as
this engine's "non-torch" memory. Another engine loading weights or capturing CUDA graphs
on the same card in that window is counted too, so co-located engines that start together
(Ray Serve starts every deployment's replicas at once) get KV caches smaller than their
``gpu_memory_utilization`` allows, or fail the profiler's assertion when one frees memory
meanwhile. So a replica holds an exclusive ``flock`` per card it uses - the cards Ray gave
it in ``CUDA_VISIBLE_DEVICES`` - from creating its engine until the engine is ready, taken
in card order (no deadlock between multi-card replicas). The lock lives in the host's temp
directory, shared by every replica on the host; the kernel drops it if the process dies.
Under HAMi each pod sees its own card slice and its own /tmp: nothing to serialise there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

#: Lock files: ``<tmp>/fleetserve-card-<device>.lock``.
LOCK_PREFIX = "fleetserve-card-"


def visible_cards(env: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """The cards this process may use (``CUDA_VISIBLE_DEVICES``: indices or UUIDs), sorted;
    empty where it is unset or empty (no GPU, or every card visible to a plain process)."""
    value = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    return sorted({c.strip() for c in value.split(",") if c.strip()})


def lock_path(card: str, directory: Path | None = None) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in card)
    return (directory or Path(tempfile.gettempdir())) / f"{LOCK_PREFIX}{safe}.lock"


@contextlib.contextmanager
def card_turn(cards: list[str], *, name: str, directory: Path | None = None) -> Iterator[float]:
    """Hold every card of ``cards`` exclusively (in order); yields the seconds waited."""
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        for card in cards:
            path = lock_path(card, directory)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            stack.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info(
                    "model %r: waiting for card %s (another engine is starting)", name, card
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
            stack.callback(fcntl.flock, fd, fcntl.LOCK_UN)
        yield time.monotonic() - start
