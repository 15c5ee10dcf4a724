"""LoRA engine flags vLLM refuses at start-up (rule ``lora-flags``).

Design note. Three mistakes stop a vLLM server (``vllm serve`` container, or a Serve
replica's engine arguments) before it serves anything, each with an error deep in the
engine log: adapters given with ``--lora-modules`` while LoRA is off (loading a static
adapter fails: LoRA is not enabled), ``max_loras`` above ``max_cpu_loras`` (vLLM's
``LoRAConfig``: every adapter on the device is also in the CPU cache), and a
``max_lora_rank`` that is not one of vLLM's preallocation sizes (argparse choices /
``MaxLoRARanks``). An adapter's own rank lives in its files, not in the manifest, so
"adapter rank above max_lora_rank" is checked where the files are: at fleet-spec load.

Rule ``lora-adapter-volume``: fleetserve's own app carries its fleet spec, so its local
adapter paths (``adapter_dir``, an ``adapters[].source`` directory) are known; the worker
pods that can host the model's replica must mount a volume there, or the replica fails on
its static adapters at start and answers 404 for every ``adapter_dir`` adapter.
``fleetserve render`` mounts ``kubernetes.volumes`` everywhere; this catches a manifest
edited (or generated) without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from fleetserve.adapters import LORA_RANKS
from fleetserve.errors import FleetServeError
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import groups, serve_apps
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._devices import server_engines
from fleetserve.k8s.doctor.rules._engines import can_host, engine_replicas
from fleetserve.k8s.render.volumes import adapter_paths
from fleetserve.plan.deployment import deployment_name, is_fleetserve_app
from fleetserve.spec import FleetSpec, parse_spec


def _engines(inv: Inventory) -> Iterator[tuple[str, Manifest, dict[str, Any], dict[str, str], str]]:
    """(who, manifest, engine args, their paths, fallback path) of every vLLM engine."""
    for pod, c, path, engine, paths in server_engines(inv):
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


def _fleetserve_specs(m: Manifest) -> Iterator[tuple[str, str, FleetSpec]]:
    """(app name, app path, fleet spec) of each fleetserve app of a RayService."""
    for app in serve_apps(m):
        if not is_fleetserve_app(app.import_path):
            continue
        args = app.body.get("args")
        if not isinstance(args, dict) or not isinstance(args.get("spec"), dict):
            continue
        try:
            yield app.name, app.path, parse_spec(args["spec"], "serveConfigV2 args.spec")
        except FleetServeError:
            continue  # an invalid spec: the app fails to build, other rules say so


#: What a missing adapter path does (True: an adapter_dir; False: a listed adapter).
_EFFECT = {
    False: "vLLM loads listed adapters at start, so the replica never comes up",
    True: "every adapter of that directory answers 404",
}


def _mounted(container: dict[str, Any], path: str) -> bool:
    mounts = container.get("volumeMounts")
    for mount in mounts if isinstance(mounts, list) else []:
        where = str(mount.get("mountPath", "")).rstrip("/") if isinstance(mount, dict) else ""
        if where and (path == where or path.startswith(where + "/")):
            return True
    return False


@rule("lora-adapter-volume", versions={"vllm": "all"})
def lora_adapter_volume(inv: Inventory) -> Iterator[Finding]:
    """fleetserve adapter paths that the pods hosting the model's replicas do not mount."""
    for m in inv.of_kind("RayService"):
        replicas = {r.name: r for r in engine_replicas(m)}
        for app_name, app_path, spec in _fleetserve_specs(m):
            for i, field, path in adapter_paths(spec):
                model = spec.models[i]
                replica = replicas.get(f"{app_name}/{deployment_name(model.name)}")
                if replica is None:
                    continue
                pod_path = str(PurePosixPath(path))
                for group in groups(m):
                    if not can_host(group, replica) or _mounted(group.container, pod_path):
                        continue
                    yield Finding.at(
                        "lora-adapter-volume",
                        "error",
                        m,
                        f"{group.path}.template.spec.containers[{group.container_index}]",
                        f"Serve replica {replica.name!r} reads LoRA adapters from {pod_path} "
                        f"({app_path}.args.spec.{field}), but pods of worker group "
                        f"{group.name!r} mount no volume there: {_EFFECT[field.endswith('dir')]}.",
                        "Mount the volume holding the adapters at that path in every Ray pod "
                        "(fleetserve render: kubernetes.volumes), or give adapters as HF repo ids.",
                    )
