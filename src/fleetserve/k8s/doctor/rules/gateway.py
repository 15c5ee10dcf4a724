"""Rules: the Gateway API Inference Extension in front of vLLM (llm-d, production-stack).

An ``InferencePool`` (``inference.networking.k8s.io/v1``, or the older
``inference.networking.x-k8s.io/v1alpha2``) selects the model-server pods by label and names
the port the gateway sends requests to. The pods are read through :mod:`._devices` and their
vLLM command lines through :mod:`._engines`, as every other vLLM rule reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._devices import PodView, pods
from fleetserve.k8s.doctor.rules._engines import VLLM_DEFAULT_PORT, container_engine

_POOL_GROUPS = ("inference.networking.k8s.io/", "inference.networking.x-k8s.io/")


def _pool_selector(pool: Manifest) -> dict[str, str] | None:
    """v1: ``spec.selector.matchLabels``; v1alpha2: ``spec.selector`` is the label map."""
    sel = pool.get("spec.selector")
    if not isinstance(sel, dict):
        return None
    match = sel.get("matchLabels")
    labels: dict[Any, Any] = match if isinstance(match, dict) else sel
    return {str(k): str(v) for k, v in labels.items() if not isinstance(v, dict | list)}


def _pool_ports(pool: Manifest) -> tuple[list[int], str]:
    """(target ports, their field path): v1 ``spec.targetPorts[].number``, v1alpha2
    ``spec.targetPortNumber``."""
    ports = pool.get("spec.targetPorts")
    if isinstance(ports, list):
        found = [p.get("number") for p in ports if isinstance(p, dict)]
        return [p for p in found if isinstance(p, int)], "spec.targetPorts"
    single = pool.get("spec.targetPortNumber")
    return ([single] if isinstance(single, int) else []), "spec.targetPortNumber"


def _vllm_ports(pod: PodView) -> list[tuple[int, str]]:
    """(port vLLM listens on, container name) of each vLLM server in ``pod``."""
    out: list[tuple[int, str]] = []
    for c, path in pod.containers():
        engine, _ = container_engine(c, path)
        if engine:
            port: Any = engine.get("port", VLLM_DEFAULT_PORT)
            out.append((int(port), str(c.get("name", "?"))))
    return out


@rule("inference-pool-port", versions="all")
def inference_pool_port(inv: Inventory) -> Iterator[Finding]:
    """An InferencePool's target port must be the port vLLM listens on in the pods it selects."""
    for pool in inv.manifests:
        if pool.kind != "InferencePool" or not pool.api_version.startswith(_POOL_GROUPS):
            continue
        selector = _pool_selector(pool)
        ports, ports_path = _pool_ports(pool)
        if not selector or not ports:
            continue
        selected = [
            (p, listen)
            for p in pods(inv)
            if p.manifest.namespace == pool.namespace
            and all(p.labels.get(k) == v for k, v in selector.items())
            and (listen := _vllm_ports(p))
        ]
        if not selected:
            continue  # the model servers are deployed elsewhere: nothing to compare
        listening = sorted({port for _, found in selected for port, _ in found})
        if set(ports) & set(listening):
            continue
        who = ", ".join(
            f"{p.manifest.ref} ({', '.join(f'{c}: {port}' for port, c in found)})"
            for p, found in selected
        )
        yield Finding.at(
            "inference-pool-port",
            "error",
            pool,
            ports_path,
            f"{pool.ref} sends requests to port {', '.join(map(str, ports))} of the pods it "
            f"selects ({_labels(selector)}), but vLLM listens on "
            f"{', '.join(map(str, listening))} there ({who}): every request through the "
            "gateway fails to connect.",
            f"Set the pool's target port to {listening[0]}, or start vLLM with --port {ports[0]}.",
        )


def _labels(d: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items()))
