"""A request's prompt as a chain of block hashes, read from the raw request body.

Design note. vLLM's prefix cache reuses KV blocks whose *whole token prefix* matches: block
``i`` is keyed by the hash of block ``i`` chained with the hash of block ``i-1``. We mirror
that on text, because the router must not tokenize (it runs in the ingress, on the hot
path): the conversation is rendered to one canonical string (every message's role and
content in order - a request that extends a conversation extends this string), cut into
``block_chars`` pieces, and each piece hashed together with the previous hash. Two requests
share their first ``k`` hashes exactly when their first ``k x block_chars`` characters are
equal, which is when vLLM's chat template gives them (nearly) the same token prefix.

The chain starts from the request's ``model`` id: vLLM keys a LoRA request's blocks by the
adapter too (a base model's cached prefix is no hit for an adapter's request, nor one
adapter's for another's), and requests for the base model all carry the base's id.

What must stay true: hashes are deterministic across processes (replicas report them to
routers), so they use BLAKE2b, never Python's salted ``hash``; only whole blocks are hashed
(a partial tail can never be a cache hit in vLLM either).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pydantic_core

#: Separates messages in the canonical text (cannot appear in JSON-decoded text unescaped
#: by accident often enough to matter; collisions only cost a wrong routing guess).
_SEP = "\x1e"


def conversation_text(payload: Any) -> str | None:
    """The canonical prompt text of an OpenAI request body (``None``: nothing to match)."""
    if not isinstance(payload, dict):
        return None
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                return None
            parts.append(f"{message.get('role', '')}:{_content_text(message.get('content'))}")
        return _SEP.join(parts) + _SEP if parts else None
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return ",".join(map(str, prompt))  # token ids: their text is as good a key
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones carry the prefix
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return "" if content is None else str(content)


def block_hashes(text: str, block_chars: int, model: str | None = None) -> list[int]:
    """Chained 64-bit hashes of the whole ``block_chars`` blocks of ``text`` (for ``model``)."""
    data = text.encode("utf-8", "surrogatepass")
    out: list[int] = []
    prev = model.encode("utf-8", "surrogatepass") if model else b""
    # Cut the encoded bytes, not the str: equal text prefixes give equal byte prefixes.
    for start in range(0, len(data) - block_chars + 1, block_chars):
        digest = hashlib.blake2b(prev + data[start : start + block_chars], digest_size=8)
        prev = digest.digest()
        out.append(int.from_bytes(prev, "big", signed=True))
    return out


@dataclass(frozen=True, slots=True)
class RequestKey:
    """What routing reads from one request: its prompt blocks and the model id it names."""

    blocks: list[int]
    model: str | None


def request_key(body: bytes, block_chars: int) -> RequestKey:
    """Block hashes and ``model`` of a raw OpenAI request body (one JSON parse)."""
    try:
        payload = pydantic_core.from_json(body) if body else None
    except ValueError:
        return RequestKey([], None)
    model = payload.get("model") if isinstance(payload, dict) else None
    model = model if isinstance(model, str) and model else None
    text = conversation_text(payload)
    return RequestKey(block_hashes(text, block_chars, model) if text else [], model)


def request_blocks(body: bytes, block_chars: int) -> list[int]:
    """Block hashes of a raw OpenAI request body (empty when it has no prompt to match)."""
    return request_key(body, block_chars).blocks
