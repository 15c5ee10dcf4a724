"""The simulator's per-step entry point computes the step time the public API does."""

from __future__ import annotations

import pytest

from fleetserve.perf import engine_perf
from fleetserve.plan.architecture import load_model_config
from fleetserve.plan.gpus import gpu_type


@pytest.mark.parametrize(
    ("model", "card", "tp", "cores"),
    [
        ("llama-3.1-8b", "H100", 1, 100),
        ("gemma-3-12b", "L40S", 1, 50),  # windowed layers, a gpucores slice
        ("llama-3.1-70b", "H200", 4, 100),  # tensor parallel: link time
    ],
)
def test_step_seconds_is_step_time_exactly(model: str, card: str, tp: int, cores: int) -> None:
    perf = engine_perf(
        load_model_config(model),
        gpu_type(card),
        tensor_parallel=tp,
        cores_percent=cores,
    )
    loads = [
        perf.load(decodes=[700] * 32),
        perf.load(prefills=[(2048, 0), (512, 4096)], decodes=[100, 9000]),
        perf.load(prefills=[(8192, 0)]),
    ]
    for load in loads:
        for shares in ((1.0, 1.0), (0.5, 0.5), (1 / 3, 1.0)):
            bw, cs = shares
            slow = perf.terms(load, bandwidth_share=bw, compute_share=cs).total
            assert perf.step_time(load, bandwidth_share=bw, compute_share=cs) == slow
            assert perf.step_seconds(load.sums, bandwidth_share=bw, compute_share=cs) == slow
    decode = perf.decode_step_time(32, 700.0, bandwidth_share=0.5)
    assert decode == perf.step_time(perf.load(decodes=[700] * 32), bandwidth_share=0.5)
