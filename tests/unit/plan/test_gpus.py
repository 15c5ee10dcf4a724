"""The GPU catalogue."""

from __future__ import annotations

import pytest

from fleetserve.errors import SpecError
from fleetserve.plan.gpus import GPU_CATALOGUE, custom_gpu, gpu_type


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


def test_custom_card_uses_decimal_gigabytes() -> None:
    assert custom_gpu(24).memory_mib == 22888
