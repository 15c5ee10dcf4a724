"""Token counting: the model's own tokenizer when it is on local disk.

Adapter behind the :class:`Tokenizer` protocol; :class:`HfTokenizer` wraps a transformers
tokenizer loaded from a local directory only (``local_files_only``: a benchmark never reaches
a model hub). Without one, callers fall back to the server's ``usage`` and say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fleetserve.errors import InputFileError

#: Files whose presence marks a directory as holding a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class Tokenizer(Protocol):
    """What the bench needs from a tokenizer."""

    @property
    def name(self) -> str:
        """Where it came from (shown in the report)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens skipped)."""
        ...

    def sample_ids(self, n: int, rng: np.random.Generator) -> list[int]:
        """``n`` random ordinary (non-special) token ids."""
        ...

    def count_prompt(self, system: str | None, prompt: str, *, chat: bool) -> int:
        """Prompt tokens as the server will count them (chat template applied for chat)."""
        ...


class HfTokenizer:
    """A Hugging Face tokenizer from a local directory."""

    def __init__(self, path: Path) -> None:
        if not is_tokenizer_dir(path):
            raise InputFileError(
                f"--tokenizer {path}: no tokenizer files there",
                hint=f"expected one of {', '.join(_TOKENIZER_FILES)}",
            )
        try:
            # Heavy import (seconds): only when a tokenizer is asked for.
            from transformers import AutoTokenizer  # noqa: PLC0415

            self._tok: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # transformers raises OSError/ValueError/others
            raise InputFileError(f"--tokenizer {path}: cannot load: {e}") from e
        self._name = str(path)
        # Sample only tokens that decode alone to clean printable text: byte-fallback and
        # partial-UTF-8 tokens decode to U+FFFD, which re-encodes to other tokens, so a
        # prompt made of them never reaches its target length.
        special = set(self._tok.all_special_ids)
        ids = [i for i in range(len(self._tok)) if i not in special]
        pieces = self._tok.batch_decode([[i] for i in ids], skip_special_tokens=True)
        vocab = [i for i, p in zip(ids, pieces, strict=True) if _clean(p)]
        self._ordinary = np.asarray(vocab or ids, dtype=np.int64)
        self._has_template = bool(getattr(self._tok, "chat_template", None))

    @property
    def name(self) -> str:
        return self._name

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def sample_ids(self, n: int, rng: np.random.Generator) -> list[int]:
        return [int(i) for i in rng.choice(self._ordinary, size=n)]

    def count_prompt(self, system: str | None, prompt: str, *, chat: bool) -> int:
        if chat and self._has_template:
            messages = [{"role": "user", "content": prompt}]
            if system:
                messages.insert(0, {"role": "system", "content": system})
            try:
                ids = self._tok.apply_chat_template(
                    messages, tokenize=True, add_generation_prompt=True
                )
                if hasattr(ids, "keys"):  # a BatchEncoding (mapping) in newer transformers
                    ids = ids["input_ids"]
                return len(ids)
            except Exception:  # a template that rejects system roles etc.: plain count
                pass
        text = f"{system}{prompt}" if system else prompt
        return len(self._tok.encode(text, add_special_tokens=True))


def is_tokenizer_dir(path: Path) -> bool:
    """True when ``path`` is a directory holding tokenizer files."""
    return path.is_dir() and any((path / f).exists() for f in _TOKENIZER_FILES)


def _clean(piece: str) -> bool:
    return bool(piece.strip()) and "\ufffd" not in piece and piece.isprintable()
