"""Synthetic workload: random prompts of sampled input length, sampled output length."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.tokenizer import Tokenizer
from fleetserve.bench.workload.base import BenchRequest
from fleetserve.bench.workload.text import PromptText


class SyntheticWorkload:
    """Prompts built from random tokens (or words), lengths drawn from distributions."""

    def __init__(
        self,
        input_len: LengthDistribution,
        output_len: LengthDistribution,
        tokenizer: Tokenizer | None,
    ) -> None:
        self.input_len = input_len
        self.output_len = output_len
        self._text = PromptText(tokenizer)

    @property
    def name(self) -> str:
        return f"synthetic in={self.input_len.describe()} out={self.output_len.describe()}"

    @property
    def size(self) -> int | None:
        return None

    @property
    def exact_lengths(self) -> bool:
        return self._text.exact

    def requests(self, seed: int) -> Iterator[BenchRequest]:
        rng = np.random.default_rng(seed)
        while True:
            n_in = self.input_len.sample(rng)
            n_out = self.output_len.sample(rng)
            text, measured = self._text.build(n_in, rng)
            yield BenchRequest(prompt=text, max_tokens=n_out, prompt_tokens=measured or n_in)
