"""Adapters from an ``adapter_dir`` load on their first request, through vLLM's own resolver hook.

Design note. vLLM's OpenAI layer, with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set, asks every
registered :class:`~vllm.lora.resolver.LoRAResolver` about a ``model`` it does not serve,
loads what one returns (``engine.add_lora``: the adapter enters vLLM's CPU LRU cache and
its GPU slots like a static one) and answers 404 in OpenAI shape when none knows the name,
400 when the adapter is found but does not load (rank above ``--max-lora-rank``, shapes of
another base). So hot-add needs no watcher and no restart: a directory that appears in
``adapter_dir`` is found on its first request, per replica. vLLM's bundled filesystem
resolver is not used: it demands that the adapter's ``base_model_name_or_path`` equal the
replica's weights path, which a fine-tune made elsewhere never does (the architecture
check lives in spec validation instead, :mod:`fleetserve.adapters`).
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

from fleetserve.adapters import find_in
from fleetserve.engine.config import LoraSettings

#: vLLM's switch for runtime adapter loading (and its resolver hook).
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


class AdapterDirResolver(LoRAResolver):
    """Finds ``<adapter_dir>/<name>`` for vLLM; its parent in ``/v1/models`` is ``base``."""

    def __init__(self, adapter_dir: Path, base: str) -> None:
        self.adapter_dir = adapter_dir
        self.base = base

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        path = find_in(self.adapter_dir, lora_name)
        if path is None:
            return None
        # vLLM replaces the id with its own counter before loading.
        request = LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=str(path))
        request.base_model_name = self.base
        return request


def enable_adapter_dir(lora: LoraSettings, base: str) -> None:
    """Let this process's vLLM app load adapters of ``lora.adapter_dir`` on demand.

    Call before the app state is built (vLLM reads the registry once, at that point).
    """
    if lora.adapter_dir is None:
        return
    os.environ[RUNTIME_LORA_ENV] = "1"
    resolver = AdapterDirResolver(Path(lora.adapter_dir).expanduser(), base)
    LoRAResolverRegistry.register_resolver(f"fleetserve-adapter-dir:{base}", resolver)
