"""The performance model: roofline terms, slices and sharing, the steady-state estimate."""

from __future__ import annotations

import math

import pytest

from fleetserve.errors import InputFileError, SpecError
from fleetserve.perf import Calibration, EngineLimits, Traffic, engine_perf, estimate
from fleetserve.perf.model import graph_tokens
from fleetserve.plan.architecture import load_model_config
from fleetserve.plan.gpus import CPU_HOST, custom_gpu, gpu_type
from fleetserve.plan.memory import cuda_graph_tokens

LLAMA = load_model_config("llama-3.1-8b")


@pytest.mark.parametrize("card", ["H200", "H100", "A100", "L4", "L40S", "A10G", "T4"])
def test_catalogue_cards_have_speed_facts(card: str) -> None:
    gpu = gpu_type(card)
    assert gpu.peak_flops("bfloat16") > 1e13
    assert gpu.bandwidth > 1e11
    assert CPU_HOST.peak_flops("bfloat16") > 0
    assert CPU_HOST.vendor == "cpu"


def test_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    perf = engine_perf(LLAMA, gpu_type("H100"))
    decode = perf.terms(perf.load(decodes=[1000] * 8))
    prefill = perf.terms(perf.load(prefills=[(4096, 0)]))
    assert decode.bound == "memory"
    assert prefill.bound == "compute"
    # A decode step reads every weight once: ~16 GB at 3.35 TB/s x efficiency.
    weights = perf.cost.dense_weight_bytes
    assert decode.memory == pytest.approx(
        (weights + perf.cost.kv_bytes_per_token * 8 * 1001) / (3.35e12 * 0.75), rel=0.05
    )


def test_a_step_beyond_the_cuda_graphs_lasts_at_least_its_layers_launches() -> None:
    gemma = load_model_config("gemma-3-1b")
    cal = Calibration.default(cpu=False)
    perf = engine_perf(gemma, gpu_type("H100"), graph_tokens=16)
    launch = cal.layer_launch_s * gemma.num_layers
    # a 522-token prefill: ~1 ms of the card, ~13 ms of launches at the default cost
    prompt = perf.terms(perf.load(prefills=[(522, 0)]))
    assert prompt.compute < launch
    assert prompt.launch == pytest.approx(launch)
    assert prompt.bound == "launch"
    assert prompt.total == pytest.approx(prompt.overhead + launch)
    # other constants keep the engine's graphs (a calibration fit swaps them in)
    assert perf.recalibrated(cal.model_copy(update={"layer_launch_s": 1e-3})).graph_tokens == 16
    # a decode batch within the graphs replays them: no launch term
    assert perf.terms(perf.load(decodes=[600] * 16)).launch == 0
    # a prefill the card takes longer over than the launches: the card bounds it
    big = perf.terms(perf.load(prefills=[(8192, 0)]))
    assert big.bound == "compute"
    assert big.total == pytest.approx(big.overhead + big.compute)
    # CPU engines have no graphs and no launch term; pipeline stages launch in turn
    assert (
        engine_perf(gemma, None, graph_tokens=0).terms(perf.load(prefills=[(522, 0)])).launch == 0
    )
    staged = engine_perf(gemma, gpu_type("H100"), pipeline_parallel=2, graph_tokens=16)
    assert staged.terms(staged.load(prefills=[(522, 0)])).launch == pytest.approx(
        cal.layer_launch_s * 13 * 2
    )


def test_graph_tokens_follow_vllms_capture_sizes() -> None:
    h100, b200, cpu = gpu_type("H100"), gpu_type("B200"), None
    assert graph_tokens(h100, 8, 8192) == 16  # 2 x max_num_seqs
    assert graph_tokens(h100, 256, 8192) == 512  # the ceiling
    assert graph_tokens(b200, 1024, 8192) == 1024  # capability 10.x: 1,024
    assert graph_tokens(h100, 256, 256) == 256  # never past a step's budget
    assert graph_tokens(h100, 256, 8192, {"enforce_eager": True}) == 0
    capped = {"compilation_config": {"max_cudagraph_capture_size": 64}}
    assert graph_tokens(h100, 256, 8192, capped) == 64
    assert graph_tokens(cpu, 256, 8192) == 0
    # the planner's count of captured graphs sizes from the same top
    assert cuda_graph_tokens(8, 8192) == graph_tokens(h100, 8, 8192)


def test_engines_sharing_a_card_take_turns_on_it() -> None:
    small = engine_perf(load_model_config("gemma-3-1b"), gpu_type("H100"))
    big = engine_perf(LLAMA, gpu_type("H100"))
    turn = small.calibration.time_slice_s
    s_load, b_load = small.decode_load(8, 600), big.decode_load(8, 600)
    s_alone, s_turn = small.time_sliced(s_load, 0.0)
    b_alone, b_turn = big.time_sliced(b_load, 0.0)
    # alone: the step as the roofline gives it, holding a turn of at most time_slice_s
    assert s_alone == pytest.approx(small.step_time(small.load(decodes=[600] * 8)))
    assert s_turn < turn
    assert b_turn == turn  # an 8B decode step is longer than one turn
    # the small engine's short step waits a whole turn of the big one's, and more
    s_beside, _ = small.time_sliced(s_load, b_turn)
    assert s_beside - s_alone == pytest.approx((s_turn / turn + 1) * b_turn)
    # the big one waits a round of the small one's short turns per turn of its own
    b_beside, _ = big.time_sliced(b_load, s_turn)
    terms = big.terms(big.load(decodes=[600] * 8))
    work = max(terms.compute, terms.memory)
    assert b_beside - b_alone == pytest.approx((work / turn + 1) * s_turn)
    assert (s_beside / s_alone) > (b_beside / b_alone)


def test_a_gpucores_slice_caps_the_cards_time_for_compute_and_memory_alike() -> None:
    # HAMi-core throttles launches on the container's measured utilisation, the share of
    # time any kernel of it runs: a memory-bound decode is held to the cap as a prefill is
    whole = engine_perf(LLAMA, gpu_type("H100"))
    slice_ = engine_perf(LLAMA, gpu_type("H100"), cores_percent=50)
    prefill = whole.load(prefills=[(4096, 0)])
    decode = whole.load(decodes=[500] * 4)
    assert slice_.terms(prefill).compute == pytest.approx(2 * whole.terms(prefill).compute)
    assert slice_.terms(decode).memory == pytest.approx(2 * whole.terms(decode).memory)
    assert whole.step_time(decode, bandwidth_share=0.5) > 1.8 * whole.terms(decode).memory
    # alone on its card the simulator's step is the capped roofline's
    alone, _ = slice_.time_sliced(decode.sums, 0.0)
    assert alone == pytest.approx(slice_.step_time(decode))


def test_a_cap_and_the_turns_on_a_card_bound_one_time_not_two() -> None:
    """Two engines capped at half the card, both stepping: each gets about its half by the
    turns alone, so the step is the longer of the two bounds, never their sum."""
    half = engine_perf(LLAMA, gpu_type("H100"), cores_percent=50)
    whole = engine_perf(LLAMA, gpu_type("H100"))
    turn = half.calibration.time_slice_s
    load = half.decode_load(8, 600)
    terms = whole.terms(whole.load(decodes=[600] * 8))
    work = max(terms.compute, terms.memory)  # whole-card work: an 8B decode, > one turn
    assert work > turn
    beside, held = half.time_sliced(load, turn)
    shared = work + (work / turn + 1) * turn
    assert beside == pytest.approx(terms.overhead + max(work / 0.5, shared))
    assert beside < terms.overhead + work / 0.5 + (work / turn + 1) * turn
    # the turn it holds for the other's wait is whole-card work, not capped time
    assert held == turn
    # a cap far below the engines' fair share binds however busy the neighbour is
    tenth = engine_perf(LLAMA, gpu_type("H100"), cores_percent=10)
    capped, _ = tenth.time_sliced(load, turn)
    assert capped == pytest.approx(terms.overhead + work / 0.1)


def test_cpu_engines_split_only_the_hosts_bandwidth() -> None:
    # pinned cores of their own: compute is not shared, DRAM bandwidth is, evenly
    cpu = engine_perf(LLAMA, None).hardware
    assert cpu.shares(1) == (1.0, 1.0)
    assert cpu.shares(2) == (0.5, 1.0)
    # engines on a card take turns instead (test_engines_sharing_a_card_take_turns_on_it)
    with pytest.raises(ValueError, match="take turns"):
        engine_perf(LLAMA, gpu_type("H100")).hardware.shares(2)


def test_moe_reads_only_touched_experts() -> None:
    moe = engine_perf(load_model_config("qwen3-30b-a3b"), gpu_type("H200"))
    assert moe.cost.weight_read_bytes(1) < moe.cost.weight_read_bytes(512)
    full = (
        moe.cost.dense_weight_bytes + moe.cost.moe_layers * moe.cost.experts * moe.cost.expert_bytes
    )
    assert moe.cost.weight_read_bytes(100_000) == pytest.approx(full, rel=1e-3)


def test_card_without_speed_facts_is_refused() -> None:
    with pytest.raises(SpecError, match="no speed facts"):
        engine_perf(LLAMA, custom_gpu(40))


def test_estimate_below_and_above_capacity() -> None:
    perf = engine_perf(LLAMA, gpu_type("H100"))
    limits = EngineLimits(max_num_seqs=128, max_num_batched_tokens=8192)
    low = estimate(perf, Traffic(rate=1, prompt_tokens=512, output_tokens=256), limits)
    assert not low.saturated
    assert math.isfinite(low.ttft_s)
    assert low.tpot_s == pytest.approx(perf.decode_step_time(1, 640), rel=0.5)
    high = estimate(
        perf, Traffic(rate=low.capacity * 2, prompt_tokens=512, output_tokens=256), limits
    )
    assert high.saturated
    assert math.isinf(high.ttft_s)
    assert high.rate == pytest.approx(low.capacity)
    more = estimate(perf, Traffic(1, 512, 256), EngineLimits(256, 8192))
    assert more.capacity > low.capacity  # a bigger batch amortises the weight reads


def test_calibration_file_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cal = Calibration.default(cpu=True)
    path = tmp_path / "cal.json"
    cal.save(path)
    assert Calibration.load(path) == cal
    path.write_text('{"format": "fleetserve-perf-calibration/1", "backend": "cpu"}')
    with pytest.raises(InputFileError, match="compute_efficiency"):
        Calibration.load(path)


def test_the_steady_wait_is_erlang_c_shared_with_the_planner() -> None:
    """M/M/2 at one server's worth of load: P(wait) = 1/3 (textbook), mean wait = P x s /
    (c - a) - the planner's Erlang C term, not a second copy of it."""
    from fleetserve.perf.steady import _erlang_c_wait  # noqa: PLC0415
    from fleetserve.plan.capacity import erlang_c  # noqa: PLC0415

    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert _erlang_c_wait(2, arrival=0.5, service_s=2.0) == pytest.approx(1 / 3 * 2.0 / 1.0)
    assert _erlang_c_wait(2, arrival=1.0, service_s=2.0) == float("inf")
