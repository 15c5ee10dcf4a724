"""Fleet spec: one validation path for YAML and dicts, errors that name the field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.cli import main
from fleetserve.errors import SpecError
from fleetserve.spec import (
    DEFAULT_MODEL_NAME,
    FleetSpec,
    ModelSpec,
    SecretRef,
    admitting,
    default_fleet,
    load_spec,
    parse_spec,
)

MINIMAL = {"models": [{"name": "m", "source": "builtin:gemma-3-270m"}]}


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "fleet.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_default_fleet_is_the_gemma_model() -> None:
    spec = default_fleet()
    assert [m.name for m in spec.models] == [DEFAULT_MODEL_NAME]
    assert spec.server.port == 8000
    assert spec.server.host == "127.0.0.1"


def test_yaml_and_dict_give_the_same_spec(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "models:\n  - name: m\n    source: builtin:gemma-3-270m\n    replicas: {min: 1, max: 3}\n",
    )
    from_yaml = load_spec(p)
    from_dict = parse_spec(
        {
            "models": [
                {"name": "m", "source": "builtin:gemma-3-270m", "replicas": {"min": 1, "max": 3}}
            ]
        }
    )
    assert from_yaml == from_dict
    assert from_yaml.models[0].replicas.max == 3


def test_unknown_key_names_the_field_path() -> None:
    bad = {"models": [{"name": "m", "source": "x", "replicas": {"min": 1, "maxx": 2}}]}
    with pytest.raises(SpecError) as e:
        parse_spec(bad, "f.yaml")
    assert "f.yaml: models[0].replicas.maxx: unknown key" in str(e.value)


def test_cross_field_error_names_the_values() -> None:
    bad = {"models": [{"name": "m", "source": "x", "replicas": {"min": 5, "max": 2}}]}
    with pytest.raises(SpecError, match=r"replicas.min \(5\) > replicas.max \(2\)"):
        parse_spec(bad)
    bad2 = {"models": [{"name": "m", "source": "x", "concurrency": 16, "max_num_seqs": 4}]}
    with pytest.raises(SpecError, match=r"max_num_seqs \(4\) < concurrency \(16\)"):
        parse_spec(bad2)


def test_engine_args_may_not_shadow_first_class_fields() -> None:
    bad = {"models": [{"name": "m", "source": "x", "engine_args": {"tensor_parallel_size": 2}}]}
    with pytest.raises(SpecError, match="duplicates the model field 'tensor_parallel'"):
        parse_spec(bad)


def test_references_must_exist() -> None:
    bad = {"models": [{"name": "m", "source": "x", "pools": ["gpu"]}]}
    with pytest.raises(SpecError, match="names pool 'gpu', which is not in pools"):
        parse_spec(bad)
    dup = {"models": [{"name": "m", "source": "x"}, {"name": "m", "source": "y"}]}
    with pytest.raises(SpecError, match="name 'm' appears twice"):
        parse_spec(dup)


def test_secrets_are_references_never_literals() -> None:
    assert SecretRef.model_validate("${HF_TOKEN}").env == "HF_TOKEN"
    ref = SecretRef.model_validate({"secret": "hf", "key": "token"})
    assert (ref.secret, ref.key) == ("hf", "token")
    bad = {**MINIMAL, "tenants": [{"name": "a", "api_keys": ["sk-literal-123"]}]}
    with pytest.raises(SpecError, match="literal secret values are not allowed"):
        parse_spec(bad)


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "models:\n  - name: m\n    source: [unclosed\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert str(e.value).startswith(f"{p}:")
    assert "invalid YAML" in str(e.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "the file is empty"),
        ("- just\n- a list\n", "must be a mapping"),
        ("models: []\n", "models"),
    ],
)
def test_degenerate_files(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        load_spec(_write(tmp_path, text))


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec("/nonexistent/fleet.yaml")


def test_spec_is_immutable() -> None:
    spec = FleetSpec.model_validate(MINIMAL)
    with pytest.raises(Exception):  # noqa: B017, PT011 - pydantic's frozen error type
        spec.models[0].name = "other"  # type: ignore[misc]


def test_cli_maps_errors_to_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _write(tmp_path, "models:\n  - name: m\n    source: x\n    colour: red\n")
    code = main(["plan", str(p)])
    err = capsys.readouterr().err
    assert code == 2
    assert "models[0].colour: unknown key" in err
    assert "Traceback" not in err


def test_cli_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_replica_admits_two_batches_unless_told_otherwise() -> None:
    """max_ongoing_requests follows the engine's batch: one running and one waiting in the
    engine (H200, concurrency 256: a flat 64 left 192 requests queued in Serve while vLLM's
    batch had room; H100, 12B, 128 a batch at concurrency 256: one batch was +129 ms TTFT
    p50 against two)."""

    def admitted(**fields: object) -> int:
        model = ModelSpec.model_validate({"name": "m", "source": "x", **fields})
        return model.replicas.max_ongoing_requests

    assert admitted() == 64  # concurrency 8: the floor
    assert admitted(concurrency=256) == 512
    assert admitted(concurrency=100, max_num_seqs=300) == 600
    # set by the user: kept, even below the batch
    assert admitted(concurrency=256, replicas={"max_ongoing_requests": 32}) == 32
    assert admitted(concurrency=256, replicas={"max_ongoing_requests": 64}) == 64


def test_the_admission_default_stays_a_default() -> None:
    # Unset in fields_set, so a batch the planner chooses later recomputes it.
    model = ModelSpec.model_validate({"name": "m", "source": "x", "concurrency": 128})
    assert "max_ongoing_requests" not in model.replicas.model_fields_set
    assert admitting(model.replicas, 16).max_ongoing_requests == 64
    assert admitting(model.replicas, 200).max_ongoing_requests == 400
    mine = ModelSpec.model_validate(
        {"name": "m", "source": "x", "replicas": {"max_ongoing_requests": 32}}
    )
    assert admitting(mine.replicas, 200).max_ongoing_requests == 32
