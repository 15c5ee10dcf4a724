"""Bad inputs to `fleetserve plan` (issue #10 point 7): a message and exit code 2, never a
traceback; what is written is what is read (no dropped keys, relative paths from the spec)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.cli import main
from fleetserve.errors import SpecError
from fleetserve.plan import plan_fleet
from fleetserve.plan.catalogue import MODEL_CATALOGUE
from fleetserve.plan.memory import estimate_replica, parse_config
from fleetserve.spec import load_spec, parse_spec

POOL = """pools:
  - name: a6000
    gpu: {type: RTX-A6000, count: 2}
"""


def run_plan(spec: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["plan", str(spec), "--format", "json", "--time-limit", "1"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def write_config(directory: Path, **override: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    raw = {**MODEL_CATALOGUE["mixtral-8x7b"], **override}
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    return directory


def spec_with_config(tmp_path: Path, config: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"models:\n  - name: m\n    source: m\n    config: {config}\n    max_model_len: 2048\n"
        + POOL
    )
    return path


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"num_local_experts": "eight"}, "'num_local_experts' must be an integer, got 'eight'"),
        ({"max_position_embeddings": "4k"}, "'max_position_embeddings' must be an integer"),
        ({"hidden_size": -1}, "'hidden_size' must be between 1 and"),
        ({"hidden_size": 1e300}, "'hidden_size' must be an integer"),
        ({"num_hidden_layers": 10**12}, "'num_hidden_layers' must be between 1 and 10000"),
    ],
)
def test_bad_config_values_are_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: dict[str, Any], message: str
) -> None:
    write_config(tmp_path / "model", **override)
    code, out = run_plan(spec_with_config(tmp_path, "model"), capsys)
    assert code == 2
    assert message in out
    assert "Traceback" not in out


def test_broken_config_json_reports_the_json_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    code, out = run_plan(spec_with_config(tmp_path, "model"), capsys)
    assert code == 2
    assert "config.json:3:3: invalid JSON" in out
    assert "names no known model config" not in out


def test_deeply_nested_config_json_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("[" * 20_000 + "]" * 20_000)
    code, out = run_plan(spec_with_config(tmp_path, "model"), capsys)
    assert code == 2
    assert "nested too deeply" in out
    assert "Traceback" not in out


def test_deeply_nested_yaml_spec_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("models: " + "[" * 20_000 + "]" * 20_000 + "\n")
    code, out = run_plan(path, capsys)
    assert code == 2
    assert "nested too deeply" in out
    # also below the recursion limit: refused before validation walks it
    path.write_text("models: " + "[" * 200 + "]" * 200 + "\n")
    with pytest.raises(SpecError, match="nested more than 64 levels"):
        load_spec(path)


def test_duplicate_keys_are_an_error_naming_key_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "models:\n  - {name: a, source: a, config: qwen2.5-0.5b}\n"
        "models:\n  - {name: b, source: b, config: qwen2.5-0.5b}\n" + POOL
    )
    with pytest.raises(SpecError, match=r"fleet\.yaml:3:1: .*duplicate key 'models'.*line 1"):
        load_spec(path)
    nested = tmp_path / "nested.yaml"
    nested.write_text("models:\n  - name: a\n    source: a\n    name: b\n")
    with pytest.raises(SpecError, match=r"nested\.yaml:4:5: .*duplicate key 'name'"):
        load_spec(nested)


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("base: &b {source: s, config: qwen2.5-0.5b}\nmodels:\n  - {<<: *b, name: a}\n")
    with pytest.raises(SpecError, match="base: unknown key"):  # merged fine, then validated
        load_spec(path)


def test_tiny_gpu_memory_is_refused_not_a_division_by_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "models:\n  - {name: q, source: q, config: qwen2.5-0.5b}\n"
        "pools:\n  - name: p\n    gpu: {count: 1, memory_gb: 0.0001}\n"
    )
    code, out = run_plan(path, capsys)
    assert code == 2
    assert "pools[0].gpu.memory_gb" in out
    assert "Traceback" not in out
    # the smallest card the spec allows plans without dividing by zero
    spec = parse_spec(
        {
            "models": [{"name": "q", "source": "q", "config": "qwen2.5-0.5b"}],
            "pools": [{"name": "p", "gpu": {"count": 1, "memory_gb": 0.25}}],
        }
    )
    (u,) = plan_fleet(spec).unplaced
    assert u.resource == "gpu_memory"


def test_replicas_max_defaults_to_min() -> None:
    spec = parse_spec({"models": [{"name": "q", "source": "q", "replicas": {"min": 4}}]})
    assert (spec.models[0].replicas.min, spec.models[0].replicas.max) == (4, 4)
    spec = parse_spec({"models": [{"name": "q", "source": "q", "replicas": {"min": 0}}]})
    assert spec.models[0].replicas.max == 1
    with pytest.raises(SpecError, match=r"replicas.min \(4\) > replicas.max \(2\)"):
        parse_spec({"models": [{"name": "q", "source": "q", "replicas": {"min": 4, "max": 2}}]})


def test_relative_config_paths_resolve_against_the_spec_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_dir = tmp_path / "fleet"
    write_config(fleet_dir / "models" / "mixtral")
    spec = spec_with_config(fleet_dir, "models/mixtral")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_spec(spec)
    assert loaded.models[0].config == str((fleet_dir / "models" / "mixtral").resolve())
    code, out = run_plan(spec, capsys)
    assert code in (0, 1), out  # planned (feasible or not), not a missing config
    # catalogue names are kept as written
    catalogue = spec_with_config(fleet_dir, "qwen2.5-0.5b")
    assert load_spec(catalogue).models[0].config == "qwen2.5-0.5b"


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 10**7),
        st.floats(),
        st.text(max_size=5),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
MUTABLE_KEYS = ["layer_types", "rope_scaling", "quantization_config", "vision_config"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(MODEL_CATALOGUE)), data=st.data())
def test_any_mangled_config_is_a_model_or_a_spec_error(name: str, data: st.DataObject) -> None:
    """Random values under real keys: parse_config returns a model whose memory can be
    estimated, or a SpecError - never another exception."""
    raw = json.loads(json.dumps(MODEL_CATALOGUE[name]))
    nested = "text_config" in raw and data.draw(st.booleans())
    target = raw["text_config"] if nested else raw
    keys = sorted(target) + MUTABLE_KEYS
    for _ in range(data.draw(st.integers(1, 3))):
        target[data.draw(st.sampled_from(keys))] = data.draw(JSON_VALUES)
    try:
        config = parse_config(raw, name)
    except SpecError:
        return
    memory = estimate_replica(
        config, max_model_len=min(4096, config.max_model_len_limit), concurrency=2
    )
    assert memory.total > 0
