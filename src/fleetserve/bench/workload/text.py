"""Synthetic prompt text of a target token length.

With the model's tokenizer: decode random ordinary token ids, re-encode, and trim or extend
until the re-encoded length is the target (decode/encode is not a bijection: neighbouring
pieces merge), so the server counts the length that was asked. Without one: random words
from a fixed list, about one token each for common English words; lengths are then
approximate and the report says so.
"""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np

from fleetserve.bench.tokenizer import Tokenizer

_MAX_ROUNDS = 10


class PromptText:
    """Builds prompt text of ``n`` tokens."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        raw = files("fleetserve.bench").joinpath("data/words.json").read_text(encoding="utf-8")
        self._words = np.asarray(json.loads(raw)["words"])

    @property
    def exact(self) -> bool:
        return self._tokenizer is not None

    def build(self, n: int, rng: np.random.Generator) -> tuple[str, int | None]:
        """Text of about ``n`` tokens and its measured length (``None`` without tokenizer)."""
        tok = self._tokenizer
        if tok is None:
            return " ".join(rng.choice(self._words, size=n).tolist()), None
        text = tok.decode(tok.sample_ids(n, rng))
        ids = tok.encode(text)
        for _ in range(_MAX_ROUNDS):
            if len(ids) == n:
                break
            if len(ids) > n:
                text = tok.decode(ids[:n])
            else:
                text = tok.decode(ids + tok.sample_ids(n - len(ids), rng))
            ids = tok.encode(text)
        return text, len(ids)
