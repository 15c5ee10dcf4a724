"""The sampling an engine's requests get by default, and what its top-p sort costs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fleetserve.modelstore.gemma import generation_config
from fleetserve.perf import Calibration, engine_perf
from fleetserve.plan.architecture import load_model_config
from fleetserve.plan.catalogue import GEMMA3_SAMPLING, catalogue_entry
from fleetserve.plan.gpus import gpu_type
from fleetserve.plan.roofline import EngineSteps
from fleetserve.sampling import default_sampling, sorts_vocabulary

GEMMA = load_model_config("gemma-3-270m")
GREEDY = {"override_generation_config": {"temperature": 0}}


def test_gemma_3_requests_sort_by_default_and_overrides_decide() -> None:
    assert dict(GEMMA.sampling) == {"top_k": 64.0, "top_p": 0.95}
    assert sorts_vocabulary(default_sampling(GEMMA, {}))
    # examples/multi-model.yaml's gemma-short: greedy, so no sort whatever top_p says
    assert not sorts_vocabulary(default_sampling(GEMMA, GREEDY))
    # --generation-config vllm: the model's defaults are not applied
    assert not sorts_vocabulary(default_sampling(GEMMA, {"generation_config": "vllm"}))
    assert not sorts_vocabulary(
        default_sampling(GEMMA, {"override_generation_config": {"top_p": 1}})
    )
    # a model without defaults samples as vLLM does: temperature 1, no top-p
    llama = load_model_config("llama-3.1-8b")
    assert llama.sampling == ()
    assert not sorts_vocabulary(default_sampling(llama, {}))
    assert sorts_vocabulary(default_sampling(llama, {"override_generation_config": {"top_p": 0.9}}))


def test_the_default_models_file_and_the_catalogue_say_the_same() -> None:
    written = generation_config()
    assert {k: written[k] for k in GEMMA3_SAMPLING} == GEMMA3_SAMPLING
    assert load_model_config("builtin:gemma-3-270m").sampling == GEMMA.sampling


def test_a_checkpoints_generation_config_is_read_beside_its_config(tmp_path: Path) -> None:
    # the directory's config.json: the catalogue entry's facts
    (tmp_path / "config.json").write_text(json.dumps(catalogue_entry("gemma-3-270m")))
    assert load_model_config(str(tmp_path)).sampling == ()  # no generation_config.json
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.9, "do_sample": True, "eos_token_id": 1})
    )
    assert dict(load_model_config(str(tmp_path)).sampling) == {"temperature": 0.6, "top_p": 0.9}
    # not JSON: vLLM's load of it fails and it falls back to config.json's generation keys
    # (none here, as in every published Gemma 3 config), so the server starts without
    # defaults - and the model reads the same, no error
    (tmp_path / "generation_config.json").write_text('{"top_p": 0.9,')
    assert load_model_config(str(tmp_path)).sampling == ()
    legacy = {**catalogue_entry("gemma-3-270m"), "top_p": 0.8}  # type: ignore[dict-item]
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    assert dict(load_model_config(str(tmp_path)).sampling) == {"top_p": 0.8}


def test_a_cpu_step_pays_the_sort_for_each_sampled_sequence_of_a_top_p_model() -> None:
    cal = Calibration.default(cpu=True)
    top_p = engine_perf(GEMMA, None, cal)
    greedy = engine_perf(GEMMA, None, cal, engine_args=GREEDY)
    v = GEMMA.vocab_size
    per_sequence = cal.sort_s_per_compare * v * math.log2(v)
    assert 0.010 < per_sequence < 0.020  # ~15 ms a sequence on one core (the default's note)
    for batch in (1, 4, 16):
        extra = top_p.decode_step_time(batch, 200) - greedy.decode_step_time(batch, 200)
        assert extra == pytest.approx(batch * per_sequence)
    # a prefill chunk that does not finish its prompt samples nothing, so sorts nothing
    chunk = top_p.load(prefills=[(512, 0)])
    unfinished = (chunk.tokens, chunk.seqs, 0, *chunk.sums[3:])
    assert top_p.step_seconds(unfinished) == pytest.approx(
        greedy.step_seconds(unfinished)  # type: ignore[arg-type]
    )


def test_gpu_engines_and_old_calibration_files_price_no_sort() -> None:
    h100 = gpu_type("H100-80GB")
    cal = Calibration.default(cpu=False)
    assert cal.sort_s_per_compare == 0
    a = engine_perf(GEMMA, h100, cal).decode_step_time(16, 200)
    b = engine_perf(GEMMA, h100, cal, engine_args=GREEDY).decode_step_time(16, 200)
    assert a == b
    # a CPU file written before the constant existed folds the sort into seq_overhead_s
    old = {
        k: v
        for k, v in Calibration.default(cpu=True).model_dump().items()
        if k != "sort_s_per_compare"
    }
    assert Calibration.model_validate(old).sort_s_per_compare == 0


def test_the_planners_reason_names_the_sort_where_it_weighs() -> None:
    # what a user can change (greedy, or top-k alone) is named in a target's reason
    cal = Calibration.default(cpu=True)
    top_p = EngineSteps(engine_perf(GEMMA, None, cal)).step(0, 16, 16 * 200)
    assert "sorting the vocabulary of 16 sequences for top-p sampling" in top_p.why, top_p.why
    greedy = EngineSteps(engine_perf(GEMMA, None, cal, engine_args=GREEDY)).step(0, 16, 3200)
    assert "sorting" not in greedy.why
    assert greedy.seconds < top_p.seconds
    gpu = EngineSteps(engine_perf(GEMMA, gpu_type("H100-80GB"))).step(0, 16, 3200)
    assert "sorting" not in gpu.why
