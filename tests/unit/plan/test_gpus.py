"""The GPU catalogue."""

from __future__ import annotations

import pytest

from fleetserve.errors import SpecError
from fleetserve.plan.gpus import GPU_CATALOGUE, custom_gpu, gpu_type, with_memory


@pytest.mark.parametrize(
    ("name", "canonical", "mib"),
    [
        ("T4", "T4", 15360),
        ("Tesla T4", "T4", 15360),
        ("L4", "L4", 23034),
        ("A10G", "A10G", 23028),
        ("rtx-3090", "RTX-3090", 24576),
        ("NVIDIA GeForce RTX 4090", "RTX-4090", 24564),
        ("RTX-A6000", "RTX-A6000", 49140),
        ("L40S", "L40S", 46068),
        ("A100-40GB", "A100-40GB", 40960),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB", 81920),
        ("H100", "H100-80GB", 81559),
        ("h200", "H200", 143771),
    ],
)
def test_names_resolve_loosely(name: str, canonical: str, mib: int) -> None:
    gpu = gpu_type(name)
    assert (gpu.name, gpu.memory_mib) == (canonical, mib)


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match="unknown GPU type 'V99'") as info:
        gpu_type("V99")
    assert "H100-80GB" in str(info.value)


def test_capabilities() -> None:
    assert not gpu_type("T4").bf16
    assert gpu_type("H100").fp8
    assert not gpu_type("A100-80GB").fp8
    assert all(g.sm_count > 0 for g in GPU_CATALOGUE)


@pytest.mark.parametrize(
    ("name", "canonical", "mib", "cc", "bf16", "fp8"),
    [
        # memory as nvidia-smi / rocm-smi report it; capability as torch reports it
        ("NVIDIA B200", "B200", 183359, (10, 0), True, True),
        ("H20", "H20", 97871, (9, 0), True, True),
        ("NVIDIA H800", "H800-80GB", 81559, (9, 0), True, True),
        ("NVIDIA A800-SXM4-80GB", "A800-80GB", 81920, (8, 0), True, False),
        ("NVIDIA L20", "L20", 46068, (8, 9), True, True),
        ("Tesla V100-SXM2-16GB", "V100-16GB", 16384, (7, 0), False, False),
        ("V100-32GB", "V100-32GB", 32768, (7, 0), False, False),
        ("AMD Instinct MI300X", "MI300X", 196592, (9, 4), True, True),  # 206141652992 B
    ],
)
def test_new_cards_and_what_they_support(
    name: str, canonical: str, mib: int, cc: tuple[int, int], bf16: bool, fp8: bool
) -> None:
    gpu = gpu_type(name)
    assert (gpu.name, gpu.memory_mib, gpu.compute_capability) == (canonical, mib, cc)
    assert (gpu.bf16, gpu.fp8) == (bf16, fp8)


def test_mi300x_is_amd() -> None:
    assert gpu_type("mi300x").vendor == "amd"
    assert {g.vendor for g in GPU_CATALOGUE} == {"nvidia", "amd"}


def test_custom_card_memory_is_gib() -> None:
    # every memory_gb is GiB (fleetserve.units): 24 GiB = 24576 MiB, as render reads it
    assert custom_gpu(24).memory_mib == 24576
    assert custom_gpu(0.5).memory_mib == 512
    assert not custom_gpu(24).known  # capability unknown: the card rules are skipped


def test_memory_override_keeps_the_capability() -> None:
    t4 = with_memory(gpu_type("T4"), 8)
    assert (t4.memory_mib, t4.compute_capability, t4.bf16) == (8192, (7, 5), False)
