"""LoRA engine flags vLLM refuses at start-up (rule ``lora-flags``).

Design note. Three mistakes stop a vLLM server (``vllm serve`` container, or a Serve
replica's engine arguments) before it serves anything, each with an error deep in the
engine log: adapters given with ``--lora-modules`` while LoRA is off (loading a static
adapter fails: LoRA is not enabled), ``max_loras`` above ``max_cpu_loras`` (vLLM's
``LoRAConfig``: every adapter on the device is also in the CPU cache), and a
``max_lora_rank`` that is not one of vLLM's preallocation sizes (argparse choices /
``MaxLoRARanks``). An adapter's own rank lives in its files, not in the manifest, so
"adapter rank above max_lora_rank" is checked where the files are: at fleet-spec load.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleetserve.adapters import LORA_RANKS
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._devices import pods
from fleetserve.k8s.doctor.rules._engines import container_engine, engine_replicas


def _engines(inv: Inventory) -> Iterator[tuple[str, Manifest, dict[str, Any], dict[str, str], str]]:
    """(who, manifest, engine args, their paths, fallback path) of every vLLM engine."""
    for pod in pods(inv):
        if pod.group is not None:
            continue
        for c, path in pod.containers():
            engine, paths = container_engine(c, path)
            if engine:
                who = f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref}"
                yield who, pod.manifest, engine, paths, path
    for m in inv.of_kind("RayService"):
        for r in engine_replicas(m):
            if r.engine:
                yield f"Serve replica {r.name!r}", r.manifest, r.engine, r.engine_paths, r.path


@rule("lora-flags", versions={"vllm": "all"})
def lora_flags(inv: Inventory) -> Iterator[Finding]:
    """LoRA flags vLLM refuses: adapters without --enable-lora, max_loras > max_cpu_loras,
    a max_lora_rank vLLM does not preallocate."""
    for who, m, engine, paths, base in _engines(inv):
        modules = engine.get("lora_modules")
        if modules and not engine.get("enable_lora"):
            yield Finding.at(
                "lora-flags",
                "error",
                m,
                paths.get("lora_modules", base),
                f"{who}: --lora-modules names {len(modules)} adapter(s) but LoRA is off: "
                "vLLM fails to load them at start-up and the server never comes up.",
                "Add --enable-lora (with --max-lora-rank at least the adapters' rank).",
            )
        loras, cpu = engine.get("max_loras"), engine.get("max_cpu_loras")
        if isinstance(loras, int) and isinstance(cpu, int) and loras > cpu:
            yield Finding.at(
                "lora-flags",
                "error",
                m,
                paths.get("max_cpu_loras", base),
                f"{who}: max_loras {loras} > max_cpu_loras {cpu}: every adapter on the "
                "device is also held in the CPU cache, so vLLM refuses this at start-up.",
                f"Raise max_cpu_loras to >= {loras} (or leave it unset: it defaults to max_loras).",
            )
        rank = engine.get("max_lora_rank")
        if isinstance(rank, int) and rank not in LORA_RANKS:
            fit = min((r for r in LORA_RANKS if r >= rank), default=LORA_RANKS[-1])
            yield Finding.at(
                "lora-flags",
                "error",
                m,
                paths.get("max_lora_rank", base),
                f"{who}: max_lora_rank {rank} is not a size vLLM preallocates "
                f"({', '.join(map(str, LORA_RANKS))}): the server refuses to start.",
                f"Set max_lora_rank to {fit} (the next size at or above your adapters' rank).",
            )
