"""Rules: vLLM engine arguments that make the engine refuse to start, whatever the cluster.

Each rule reads every vLLM engine the input runs - Serve replicas of a RayService and plain
``vllm serve`` containers - through :mod:`._engines`, so the value judged is the value every
other rule sees (or, for a value outside vLLM's bounds, the one they were kept from).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._devices import pods
from fleetserve.k8s.doctor.rules._engines import (
    container_engine,
    engine_replicas,
    out_of_bounds,
    split_rejected,
)

#: What each bounded argument means, for the fix.
_MEANING = {
    "tensor_parallel_size": "the number of GPUs one replica shards each layer over (1 for one GPU)",
    "pipeline_parallel_size": "the number of pipeline stages (1 unless the model is split by "
    "layers across GPUs)",
    "gpu_memory_utilization": "a fraction of the card's memory vLLM may take, e.g. 0.9 (not a "
    "percentage or a count of GiB)",
}


@dataclass(frozen=True)
class _Engine:
    """One vLLM engine as written: who runs it, and its arguments with their field paths."""

    manifest: Manifest
    #: ``Serve replica 'app/model' of RayService/ns/name`` or ``vLLM container 'c' of ...``.
    who: str
    #: Every argument as written, within vLLM's bounds or not.
    engine: dict[str, Any]
    paths: dict[str, str]
    #: Field path of the engine when an argument's own path is unknown.
    path: str


def _engines(inv: Inventory) -> Iterator[_Engine]:
    for m in inv.of_kind("RayService"):
        for r in engine_replicas(m):
            written = {**r.engine, **r.rejected}
            who = f"Serve replica {r.name!r} of {m.ref}"
            yield _Engine(m, who, written, r.engine_paths, r.path)
    for pod in pods(inv):
        if pod.group is not None:
            continue  # Ray pods run their engines through Serve (above)
        for c, path in pod.containers():
            engine, paths = container_engine(c, path, raw=True)
            if engine:
                who = f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref}"
                yield _Engine(pod.manifest, who, engine, paths, path)


@rule("engine-arg-invalid", versions={"vllm": "all"})
def engine_arg_invalid(inv: Inventory) -> Iterator[Finding]:
    """tensor/pipeline_parallel_size below 1, gpu_memory_utilization outside (0, 1]."""
    for e in _engines(inv):
        for key, value in sorted(split_rejected(e.engine)[1].items()):
            bound = out_of_bounds(key, value)
            yield Finding.at(
                "engine-arg-invalid",
                "error",
                e.manifest,
                e.paths.get(key, e.path),
                f"{e.who} sets {key} {value:g}, outside vLLM's bound ({key} {bound}): vLLM's "
                "config validation refuses it and the engine never starts.",
                f"Set {key} to {_MEANING[key]}.",
            )
