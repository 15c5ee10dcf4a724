"""Token accounting after a run: the model's tokenizer when there is one, else the server's
``usage``, else the number of streamed chunks (approximate). Runs after the load, never in
the event loop, so tokenizing costs no timing accuracy. The report states the method.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from fleetserve.bench.record import RequestRecord
from fleetserve.bench.tokenizer import Tokenizer

#: ``tokens_source`` values in the report.
SOURCE_TOKENIZER = "tokenizer"
SOURCE_USAGE = "server usage"
SOURCE_CHUNKS = "stream chunks (approximate)"


def account_tokens(
    records: Sequence[RequestRecord], tokenizer: Tokenizer | None, *, chat: bool
) -> dict[str, int]:
    """Fill ``tokens_in`` / ``tokens_out`` on every record; return requests per method."""
    methods: Counter[str] = Counter()
    prompt_cache: dict[tuple[str | None, str], int] = {}
    for r in records:
        req = r.request
        if tokenizer is not None:
            if req is not None:
                key = (req.system, req.prompt)
                if key not in prompt_cache:
                    prompt_cache[key] = tokenizer.count_prompt(req.system, req.prompt, chat=chat)
                r.tokens_in = prompt_cache[key]
            r.tokens_out = len(tokenizer.encode(r.text)) if r.text else 0
            methods[SOURCE_TOKENIZER] += 1
        elif r.usage_out is not None:
            r.tokens_in = r.usage_in
            r.tokens_out = r.usage_out
            methods[SOURCE_USAGE] += 1
        else:
            if r.usage_in is not None:
                r.tokens_in = r.usage_in
            elif req is not None:
                r.tokens_in = req.prompt_tokens
            r.tokens_out = r.chunks
            if r.chunks:
                methods[SOURCE_CHUNKS] += 1
    return dict(methods.most_common())


def describe_sources(methods: dict[str, int], tokenizer: Tokenizer | None) -> str:
    """One line for the report: which method counted the tokens."""
    if tokenizer is not None:
        return f"{SOURCE_TOKENIZER} ({tokenizer.name})"
    if not methods:
        return "none (no request produced tokens)"
    if len(methods) == 1:
        return next(iter(methods))
    return "mixed: " + ", ".join(f"{k} for {v} requests" for k, v in methods.items())
