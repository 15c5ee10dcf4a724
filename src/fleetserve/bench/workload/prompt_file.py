"""Prompt-file workload: one prompt per line (seed 002's ``prompts.txt``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.workload.base import BenchRequest
from fleetserve.errors import InputFileError


class PromptFileWorkload:
    """Prompts in file order (repeated when the run needs more); blank lines skipped."""

    def __init__(self, path: Path, output_len: LengthDistribution) -> None:
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise InputFileError(f"--prompts {path}: cannot read: {e.strerror or e}") from e
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise InputFileError(f"--prompts {path}:{line}: not UTF-8 text") from e
        self.prompts = [line.strip() for line in text.splitlines() if line.strip()]
        if not self.prompts:
            raise InputFileError(f"--prompts {path}: no prompts (the file has no non-blank line)")
        self.path = path
        self.output_len = output_len

    @property
    def name(self) -> str:
        return f"prompts {self.path.name} ({len(self.prompts)}) out={self.output_len.describe()}"

    @property
    def size(self) -> int | None:
        return len(self.prompts)

    @property
    def exact_lengths(self) -> bool:
        return False

    def requests(self, seed: int) -> Iterator[BenchRequest]:
        rng = np.random.default_rng(seed)
        for prompt in itertools.cycle(self.prompts):
            yield BenchRequest(prompt=prompt, max_tokens=self.output_len.sample(rng))
