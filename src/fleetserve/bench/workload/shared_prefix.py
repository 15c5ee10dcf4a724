"""Shared-prefix workload: N groups, each with its own long system prompt.

Requests of a group share the prefix token for token, so a server with prefix caching and
prefix-aware routing answers them faster than unrelated prompts; comparing this workload
with a synthetic one of the same total length shows what the cache and the router buy.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.tokenizer import Tokenizer
from fleetserve.bench.workload.base import BenchRequest
from fleetserve.bench.workload.text import PromptText


class SharedPrefixWorkload:
    """``groups`` system prompts of ``prefix_len`` tokens, random user suffixes."""

    def __init__(
        self,
        groups: int,
        prefix_len: int,
        suffix_len: LengthDistribution,
        output_len: LengthDistribution,
        tokenizer: Tokenizer | None,
    ) -> None:
        self.groups = groups
        self.prefix_len = prefix_len
        self.suffix_len = suffix_len
        self.output_len = output_len
        self._text = PromptText(tokenizer)

    @property
    def name(self) -> str:
        return (
            f"shared-prefix groups={self.groups} prefix={self.prefix_len} "
            f"suffix={self.suffix_len.describe()} out={self.output_len.describe()}"
        )

    @property
    def size(self) -> int | None:
        return None

    @property
    def exact_lengths(self) -> bool:
        return self._text.exact

    def requests(self, seed: int) -> Iterator[BenchRequest]:
        rng = np.random.default_rng(seed)
        prefixes = [self._text.build(self.prefix_len, rng) for _ in range(self.groups)]
        while True:
            group = int(rng.integers(self.groups))
            prefix, prefix_tokens = prefixes[group]
            n_in = self.suffix_len.sample(rng)
            text, measured = self._text.build(n_in, rng)
            yield BenchRequest(
                prompt=text,
                system=prefix,
                max_tokens=self.output_len.sample(rng),
                prompt_tokens=(prefix_tokens or self.prefix_len) + (measured or n_in),
                group=group,
            )
