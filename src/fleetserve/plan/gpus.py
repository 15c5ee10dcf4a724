"""The GPU catalogue: card types a pool may name, with the facts the planner needs.

Memory is in MiB *as nvidia-smi reports it* (``memory.total``), not the marketing GB: a
"24 GB" A10G shows 23028 MiB, and a HAMi ``nvidia.com/gpumem`` slice is carved from what the
device plugin registers, which is that figure. Names are matched loosely (case, dashes,
spaces and vendor prefixes do not matter), so ``A100-80GB``, ``a100_80gb`` and
``NVIDIA A100-SXM4-80GB`` are the same card.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetserve.errors import SpecError


@dataclass(frozen=True)
class GpuType:
    """One card model."""

    name: str
    """Canonical catalogue name (what the plan reports)."""
    memory_mib: int
    """Memory as nvidia-smi reports it (MiB)."""
    sm_count: int
    """Streaming multiprocessors (HAMi's gpucores are a share of these)."""
    bf16: bool
    """Native bfloat16 (Ampere and later); vLLM falls back to float16 otherwise."""
    fp8: bool
    """Native FP8 tensor cores (Ada, Hopper); weight-only FP8 still runs on Ampere."""
    aliases: tuple[str, ...] = ()


#: The catalogue. Memory figures are nvidia-smi's ``memory.total`` on current drivers.
GPU_CATALOGUE: tuple[GpuType, ...] = (
    GpuType("T4", 15360, 40, bf16=False, fp8=False, aliases=("tesla-t4",)),
    GpuType("L4", 23034, 58, bf16=True, fp8=True),
    GpuType("A10", 23028, 72, bf16=True, fp8=False),
    GpuType("A10G", 23028, 80, bf16=True, fp8=False),
    GpuType("RTX-3090", 24576, 82, bf16=True, fp8=False, aliases=("geforce-rtx-3090", "3090")),
    GpuType("RTX-4090", 24564, 128, bf16=True, fp8=True, aliases=("geforce-rtx-4090", "4090")),
    GpuType("RTX-A6000", 49140, 84, bf16=True, fp8=False, aliases=("a6000",)),
    GpuType("A40", 46068, 84, bf16=True, fp8=False),
    GpuType("L40", 46068, 142, bf16=True, fp8=True),
    GpuType("L40S", 46068, 142, bf16=True, fp8=True),
    GpuType("A100-40GB", 40960, 108, bf16=True, fp8=False, aliases=("a100-sxm4-40gb", "a100-40")),
    GpuType(
        "A100-80GB",
        81920,
        108,
        bf16=True,
        fp8=False,
        aliases=("a100-sxm4-80gb", "a100-pcie-80gb", "a100-80", "a100"),
    ),
    GpuType(
        "H100-80GB",
        81559,
        132,
        bf16=True,
        fp8=True,
        aliases=("h100-80gb-hbm3", "h100-sxm", "h100-80", "h100"),
    ),
    GpuType("H100-PCIE", 81559, 114, bf16=True, fp8=True, aliases=("h100-pcie-80gb",)),
    GpuType("H200", 143771, 132, bf16=True, fp8=True, aliases=("h200-141gb", "h200-sxm")),
)


def _key(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidia", "tesla", "geforce"):
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix) :]
    return key


_INDEX: dict[str, GpuType] = {}
for _gpu in GPU_CATALOGUE:
    for _name in (_gpu.name, *_gpu.aliases):
        _INDEX.setdefault(_key(_name), _gpu)


def gpu_type(name: str) -> GpuType:
    """The catalogue entry for ``name`` (SpecError naming the known types if absent)."""
    found = _INDEX.get(_key(name))
    if found is None:
        known = ", ".join(g.name for g in GPU_CATALOGUE)
        raise SpecError(
            f"unknown GPU type '{name}'",
            hint=f"known types: {known}; or give the pool's gpu.memory_gb instead",
        )
    return found


def custom_gpu(memory_gb: float, name: str | None = None) -> GpuType:
    """A card given only by its memory (pool ``gpu.memory_gb``; GB = 10^9 bytes)."""
    mib = int(memory_gb * 1e9 / 2**20)
    return GpuType(name or f"custom-{memory_gb:g}GB", mib, 0, bf16=True, fp8=False)
