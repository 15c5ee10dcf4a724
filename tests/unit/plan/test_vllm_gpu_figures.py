"""The memory model against the KV caches vLLM logged on an H200.

Recorded on 2026-12-03 with vLLM 0.26.0 (CUDA 13 build, torch 2.11.0+cu130) on one NVIDIA
H200 (CUDA reports 143,155 MiB), dummy weights from the published Gemma 3 configs
(``benchmarks/gpu/``; docs/benchmarks.md, "GPU: one H200"): the text models' configs
``benchmarks/gpu/models.py`` wrote, kept in tests/fixtures/plan/h200-gemma3. Each engine
logged, e.g. for the 12B of the four-model pack::

    gpu_worker.py: Available KV cache memory: 21.86 GiB
    gpu_worker.py: Free memory on device (139.29/139.8 GiB) on startup. Desired GPU memory
        utilization is (0.3334, 46.61 GiB). Actual usage is 22.62 GiB for weight, 1.9 GiB
        for peak activation, 0.22 GiB for non-torch memory, and 0.17 GiB for CUDAGraph
        memory.

The prediction is what vLLM computes with the model's terms in place of its measured ones:
``gpu_memory_utilization x CUDA's card figure - (weights + activation + non-torch)``; the
CUDA graphs are captured after the KV cache is sized, outside that budget (above: 46.61 -
22.62 - 1.9 - 0.22 = 21.87, the 0.17 GiB of graphs not subtracted). Every run below
started with a cold torch.compile cache, as a new pod does, except the one marked warm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.plan.memory import GiB, MiB, estimate_replica, load_model_config

CARD = 143_155 * MiB
CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "plan" / "h200-gemma3"

#: (run, model, gpu_memory_utilization, max_num_seqs, max_model_len, concurrency, logged GiB)
COLD = [
    ("270M alone", "gemma-3-270m", 0.1429, 256, 4096, 256, 18.90),
    ("12B alone, fleetserve", "gemma-3-12b", 0.8613, 256, 1024, 256, 95.66),
    ("12B alone, vllm serve", "gemma-3-12b", 0.336, 64, 1024, 64, 22.22),
    ("4B, one of two replicas", "gemma-3-4b", 0.107, 16, 8192, 8, 5.65),
    ("pack of four: 12B", "gemma-3-12b", 0.3334, 16, 4096, 16, 21.86),
    ("pack of four: 4B", "gemma-3-4b", 0.1166, 16, 4096, 16, 6.99),
    ("pack of four: 1B", "gemma-3-1b", 0.0284, 16, 4096, 16, 1.22),
    ("pack of four: 270M", "gemma-3-270m", 0.0146, 16, 4096, 16, 0.97),
]


#: Recorded on 2026-12-06, same build and card: seven engines of five models on the card
#: through one ``fleetserve serve``, every engine ``enforce_eager`` (no torch.compile, no
#: CUDA graphs: vLLM logged 0.0 GiB of CUDAGraph memory), each at its planned fraction.
EAGER = [
    ("pack of seven, eager: 270M", "gemma-3-270m", 0.0124, 8, 4096, 8, 0.91),
    ("pack of seven, eager: 1B", "gemma-3-1b", 0.0259, 8, 4096, 8, 1.31),
    ("pack of seven, eager: 4B", "gemma-3-4b", 0.0978, 8, 4096, 8, 5.43),
    ("pack of seven, eager: 12B", "gemma-3-12b", 0.2632, 8, 4096, 8, 13.67),
]


def predicted_kv(
    name: str, util: float, seqs: int, max_model_len: int, conc: int, *, eager: bool = False
) -> float:
    memory = estimate_replica(
        load_model_config(str(CONFIGS / f"{name}.json")),
        max_model_len=max_model_len,
        concurrency=conc,
        max_num_seqs=seqs,
        max_num_batched_tokens=2048,  # what the local plan gave every engine above
        enforce_eager=eager,
    )
    return (util * CARD - (memory.budget - memory.kv_cache)) / GiB


@pytest.mark.parametrize(("run", "name", "util", "seqs", "mml", "conc", "logged"), COLD)
def test_kv_cache_within_5_percent_of_what_vllm_logged(
    run: str, name: str, util: float, seqs: int, mml: int, conc: int, logged: float
) -> None:
    """Within 5 %, or 0.11 GiB on the smallest caches (the pack's 270M logged 1.18 GiB of
    non-KV terms and a KV cache of 0.97 GiB from a 2.04 GiB budget: its 0.11 GiB of CUDA
    graphs are outside the budget, which the model once counted inside, -10.6 %)."""
    predicted = predicted_kv(name, util, seqs, mml, conc)
    assert abs(predicted - logged) <= max(0.05 * logged, 0.11), (run, predicted, logged)


#: Recorded on 2026-12-06 with the same build on one H100 (CUDA reports 81,079 MiB): the
#: four-model pack through one ``fleetserve serve`` (concurrency 8, 2,048 batched tokens),
#: compiled (cold compile cache) and, in an earlier session, every engine enforce_eager.
H100 = 81_079 * MiB
H100_RUNS = [
    ("H100 pack, compiled: 270M", "gemma-3-270m", 0.0219, False, 0.66),
    ("H100 pack, compiled: 1B", "gemma-3-1b", 0.0456, False, 0.86),
    ("H100 pack, compiled: 4B", "gemma-3-4b", 0.1726, False, 4.35),
    ("H100 pack, compiled: 12B", "gemma-3-12b", 0.4646, False, 12.04),
    ("H100 pack, eager: 270M", "gemma-3-270m", 0.0177, True, 0.57),
    ("H100 pack, eager: 1B", "gemma-3-1b", 0.0388, True, 0.76),
    ("H100 pack, eager: 4B", "gemma-3-4b", 0.1576, True, 4.24),
    ("H100 pack, eager: 12B", "gemma-3-12b", 0.4423, True, 11.90),
]


@pytest.mark.parametrize(("run", "name", "util", "eager", "logged"), H100_RUNS)
def test_kv_cache_on_an_h100_within_5_percent_of_what_vllm_logged(
    run: str, name: str, util: float, eager: bool, logged: float
) -> None:
    """The same rule on the other card; the 1B is within the 0.11 GiB floor only (+8 %,
    +7 %): vLLM logs 0.07 GiB more weights for it than its parameters and RoPE caches, on
    both cards."""
    memory = estimate_replica(
        load_model_config(str(CONFIGS / f"{name}.json")),
        max_model_len=4096,
        concurrency=8,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        enforce_eager=eager,
    )
    predicted = (util * H100 - (memory.budget - memory.kv_cache)) / GiB
    assert abs(predicted - logged) <= max(0.05 * logged, 0.11), (run, predicted, logged)


def test_a_warm_compile_cache_only_adds_kv_cache() -> None:
    """The plan holds a cold compile's peak, so a warm start (6.74 GiB logged for the same
    4B engine) gets more than predicted, never less."""
    assert predicted_kv("gemma-3-4b", 0.107, 16, 8192, 8) < 6.74


@pytest.mark.parametrize(("run", "name", "util", "seqs", "mml", "conc", "logged"), EAGER)
def test_an_eager_engine_is_sized_without_graphs_or_compile(
    run: str, name: str, util: float, seqs: int, mml: int, conc: int, logged: float
) -> None:
    """``enforce_eager`` drops the CUDA graphs and the cold compile's peak from the non-KV
    terms: within 5 % of what each eager engine logged (the compiled model's terms left
    12-38 % of these caches unpredicted)."""
    predicted = predicted_kv(name, util, seqs, mml, conc, eager=True)
    assert abs(predicted - logged) <= 0.05 * logged, (run, predicted, logged)
    assert predicted_kv(name, util, seqs, mml, conc) < 0.9 * logged
