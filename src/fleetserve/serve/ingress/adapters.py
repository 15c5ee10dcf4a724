"""Which base model serves a LoRA adapter id, for the ingress.

Design note. An adapter is an OpenAI model id served by its base model's deployment
(vLLM's LoRA layer in every replica of it). The ingress maps the request's ``model`` to
that deployment: ``adapter`` (an adapter of the spec, else a directory of some model's
``adapter_dir``, in spec order) or ``base:adapter`` (the adapter must belong to ``base``).
vLLM knows the adapter by its bare id, so a ``base:adapter`` body is rewritten - by
splicing the one JSON string token in the raw bytes, never by re-serialising the body
(which would cost a parse+dump per request and could change number formatting); only when
the token is not unique (the same string also appears under a nested ``"model"`` key) is
the body re-encoded. Tenancy: an adapter of the spec has its own entry in the key table
(its tenant, or its base's); a directory adapter belongs to its base model's tenant, so
its visibility is the base's. Pure data and functions; no Ray.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetserve.adapters import discover, find_in

#: A top-level-looking ``"model": "<json string>"`` pair; group 1 is the raw string token.
_MODEL_TOKEN = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')


@dataclass(frozen=True)
class AdapterRoute:
    """One adapter id and the base model whose deployment serves it."""

    name: str
    base: str
    #: The id whose owner decides who may use it (the key table's entry): the adapter's
    #: own for spec adapters, the base model's for adapter_dir ones.
    tenancy_id: str


class AdapterTable:
    """Adapter ids of the fleet: the spec's, and those present in adapter directories."""

    def __init__(self, listed: Mapping[str, str], dirs: Mapping[str, str]) -> None:
        self._listed = dict(listed)  # adapter -> base
        self._dirs = {base: Path(d) for base, d in dirs.items()}  # base -> adapter_dir

    @classmethod
    def of(cls, routes: Iterable[Any]) -> AdapterTable:
        """From the gateway's model routes (``name``, ``adapters``, ``adapter_dir``)."""
        listed: dict[str, str] = {}
        dirs: dict[str, str] = {}
        for r in routes:
            listed.update(dict.fromkeys(r.adapters, r.name))
            if r.adapter_dir is not None:
                dirs[r.name] = r.adapter_dir
        return cls(listed, dirs)

    def __bool__(self) -> bool:
        return bool(self._listed) or bool(self._dirs)

    def find(self, model: str) -> AdapterRoute | None:
        """The adapter a request's ``model`` names (``adapter`` or ``base:adapter``)."""
        found = self._find_bare(model)
        if found is not None:
            return found
        base, sep, name = model.rpartition(":")
        if not sep:
            return None
        found = self._find_bare(name)
        return found if found is not None and found.base == base else None

    def _find_bare(self, name: str) -> AdapterRoute | None:
        base = self._listed.get(name)
        if base is not None:
            return AdapterRoute(name, base, tenancy_id=name)
        for base, directory in self._dirs.items():
            if find_in(directory, name) is not None:
                return AdapterRoute(name, base, tenancy_id=base)
        return None

    def listing(self) -> list[AdapterRoute]:
        """Every adapter servable now: the spec's, then each adapter_dir's (sorted)."""
        out = [AdapterRoute(n, b, tenancy_id=n) for n, b in self._listed.items()]
        seen = set(self._listed)
        for base, directory in self._dirs.items():
            for name in discover(directory):
                if name not in seen:
                    seen.add(name)
                    out.append(AdapterRoute(name, base, tenancy_id=base))
        return out


def splice_model(body: bytes, payload: Mapping[str, Any], new: str) -> bytes:
    """``body`` with its top-level ``model`` replaced by ``new``, touching only that token."""
    old = payload["model"]
    hits = [m for m in _MODEL_TOKEN.finditer(body) if _decodes_to(m.group(1), old)]
    if len(hits) == 1:
        start, end = hits[0].span(1)
        return body[:start] + json.dumps(new).encode() + body[end:]
    return json.dumps({**payload, "model": new}).encode()


def _decodes_to(token: bytes, value: str) -> bool:
    try:
        return bool(json.loads(token) == value)
    except ValueError:
        return False
