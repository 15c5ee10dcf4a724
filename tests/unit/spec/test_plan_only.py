"""A plan-only spec (no ``source``): plan works from the catalogue; serve and render refuse
it with the field path, exit 2, before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.cli import main
from fleetserve.errors import SpecError
from fleetserve.serve.control.app import build_app
from fleetserve.spec import parse_spec

PLAN_ONLY = (
    "models:\n"
    "  - {name: small, source: builtin:gemma-3-270m, config: qwen2.5-0.5b}\n"
    "  - {name: big, config: llama-3.1-8b, max_model_len: 8192}\n"
    "pools: [{name: p, gpu: {type: A100-80GB, count: 1}, max_nodes: 4}]\n"
)


def _spec(tmp_path: Path, text: str = PLAN_ONLY) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def test_plan_needs_no_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", _spec(tmp_path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["feasible"] is True
    assert {r["model"] for r in data["replicas"]} == {"small", "big"}


def test_a_model_needs_source_or_config() -> None:
    with pytest.raises(SpecError, match=r"models\[0\]: set source .* or config"):
        parse_spec({"models": [{"name": "x"}]})


@pytest.mark.parametrize("command", ["serve", "render"])
def test_weights_commands_name_the_missing_source(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command, _spec(tmp_path)]
    if command == "render":
        args += ["-o", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"models[1].source: required to {command} model 'big'" in err
    assert "models[0]" not in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_build_app_refuses_a_plan_only_spec(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"models\[1\]\.source: required to serve"):
        build_app({"spec_path": _spec(tmp_path), "engine": "fake"})
