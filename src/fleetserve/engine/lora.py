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

An adapter dropped into ``adapter_dir`` after start skipped spec validation, and vLLM's own
load only refuses some misfits, with a reason-less 400 ("found but could not be loaded"):
one trained on a larger base gets copied into the preallocated LoRA slots at its first
batch and the failed copy kills the engine core (a crashed replica); a smaller one fits the
slots and serves garbage. So :func:`check_before_load` puts fleetserve's checks
(:func:`fleetserve.adapters.load_problem`: the config, the rank, the architecture, every
LoRA tensor's shape against the served weights) in front of vLLM's resolution, on the
replica's own ``OpenAIServingModels``: a misfit is a 400 in vLLM's OpenAI error shape that
says why, and vLLM never sees it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

from fleetserve.adapters import (
    base_config,
    base_weight_shapes,
    find_in,
    load_problem,
    refusal,
)
from fleetserve.engine.config import LoraSettings
from fleetserve.engine.vllm_api import create_error_response

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


def check_before_load(
    serving_models: Any,
    lora: LoraSettings,
    *,
    base: str,
    model_path: str,
    hf_text_config: Mapping[str, Any] | None,
) -> None:
    """Answer 400 for an ``adapter_dir`` adapter that does not fit this replica's model,
    before vLLM's ``OpenAIServingModels.resolve_lora`` loads it (see the module note).

    ``model_path``: the replica's weights (a local directory gives the tensor shapes and
    the config the spec check uses); ``hf_text_config``: vLLM's view of the config, for a
    hub model whose files are not a directory here.
    """
    if lora.adapter_dir is None:
        return
    adapter_dir = Path(lora.adapter_dir).expanduser()
    weights = Path(model_path).expanduser()
    served = base_config(weights) if weights.is_dir() else None
    if served is None and hf_text_config is not None:
        served = dict(hf_text_config)
    shapes = base_weight_shapes(weights) if weights.is_dir() else None
    resolve = serving_models.resolve_lora

    async def resolve_checked(lora_name: str) -> Any:
        if lora_name not in serving_models.lora_requests:
            path = find_in(adapter_dir, lora_name)
            if path is not None:
                problem = await asyncio.to_thread(
                    load_problem,
                    path,
                    max_lora_rank=lora.max_lora_rank,
                    served_config=served,
                    base_shapes=shapes,
                    target_modules=lora.target_modules,
                )
                if problem is not None:
                    return create_error_response(
                        refusal(lora_name, base, problem),
                        err_type="BadRequestError",
                        status_code=HTTPStatus.BAD_REQUEST,
                        param="model",
                    )
        return await resolve(lora_name)

    serving_models.resolve_lora = resolve_checked


async def held_adapters(engine: Any, serving_models: Any) -> tuple[str, ...]:
    """The adapter ids in vLLM's LoRA cache now (``max_cpu_loras`` LRU), sorted.

    vLLM knows its cache by integer ids (``AsyncLLM.list_loras``, one RPC to the engine
    core); ``OpenAIServingModels.lora_requests`` maps the names it resolved to those ids.
    """
    ids = await engine.list_loras()
    requests = serving_models.lora_requests
    return tuple(sorted(name for name, req in requests.items() if req.lora_int_id in ids))
