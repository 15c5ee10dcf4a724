"""ShareGPT-format workload: the first user turn as prompt, the first reply's length as
output length (or ``--output-len`` when given), conversations shuffled by the seed.

Accepted shapes per entry: ``{"conversations": [{"from": "human", "value": ...}, ...]}``
(ShareGPT) or ``{"messages": [{"role": "user", "content": ...}, ...]}`` (OpenAI style).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.tokenizer import Tokenizer
from fleetserve.bench.workload.base import BenchRequest
from fleetserve.errors import InputFileError

_USER = {"human", "user"}
_ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "bing"}


class ShareGptWorkload:
    """Conversations from a ShareGPT JSON file."""

    def __init__(
        self,
        path: Path,
        tokenizer: Tokenizer | None,
        output_len: LengthDistribution | None,
        max_output: int = 4096,
    ) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise InputFileError(f"--sharegpt {path}: cannot read: {e.strerror or e}") from e
        except UnicodeDecodeError as e:
            raise InputFileError(f"--sharegpt {path}: not UTF-8 text") from e
        except json.JSONDecodeError as e:
            raise InputFileError(f"--sharegpt {path}:{e.lineno}:{e.colno}: {e.msg}") from e
        if not isinstance(data, list):
            raise InputFileError(f"--sharegpt {path}: expected a JSON list of conversations")
        self.path = path
        self.output_len = output_len
        self._tokenizer = tokenizer
        self.pairs: list[tuple[str, int]] = []
        for entry in data:
            pair = _first_exchange(entry)
            if pair is None:
                continue
            prompt, reply = pair
            n_out = (
                len(tokenizer.encode(reply))
                if tokenizer
                else max(1, round(len(reply.split()) * 1.3))
            )
            self.pairs.append((prompt, min(max(n_out, 1), max_output)))
        if not self.pairs:
            raise InputFileError(
                f"--sharegpt {path}: no usable conversation (need a user turn then a reply)"
            )

    @property
    def name(self) -> str:
        out = self.output_len.describe() if self.output_len else "from replies"
        return f"sharegpt {self.path.name} ({len(self.pairs)}) out={out}"

    @property
    def size(self) -> int | None:
        return len(self.pairs)

    @property
    def exact_lengths(self) -> bool:
        return False

    def requests(self, seed: int) -> Iterator[BenchRequest]:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(self.pairs))
        for i in itertools.cycle(order.tolist()):
            prompt, n_out = self.pairs[i]
            if self.output_len is not None:
                n_out = self.output_len.sample(rng)
            yield BenchRequest(prompt=prompt, max_tokens=n_out)


def _first_exchange(entry: Any) -> tuple[str, str] | None:
    if not isinstance(entry, dict):
        return None
    turns = entry.get("conversations", entry.get("messages"))
    if not isinstance(turns, list):
        return None
    prompt: str | None = None
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        who = str(turn.get("from", turn.get("role", ""))).lower()
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str) or not text.strip():
            continue
        if prompt is None and who in _USER:
            prompt = text
        elif prompt is not None and who in _ASSISTANT:
            return prompt, text
    return None
