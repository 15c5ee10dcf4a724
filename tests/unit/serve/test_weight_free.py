"""A model directory with config.json and tokenizer but no weights, served with
``load_format: dummy`` (random weights of the real shapes): serve resolves it, plan sizes
it and render describes it; without ``dummy`` serve refuses it before Ray starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetserve.errors import ModelPreparationError
from fleetserve.plan.catalogue import MODEL_CATALOGUE
from fleetserve.serve.control.app import resolve_model_paths
from fleetserve.spec import parse_spec

ROOT = Path(__file__).resolve().parents[3]


def weight_free_dir(tmp_path: Path) -> Path:
    """Gemma 3 12B's published text config and a tokenizer file: no weights."""
    model = tmp_path / "gemma-3-12b"
    model.mkdir()
    text = MODEL_CATALOGUE["gemma-3-12b"]["text_config"]
    config = {**text, "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 48}
    (model / "config.json").write_text(json.dumps(config))
    (model / "tokenizer.json").write_text("{}")
    return model


def spec_of(model: Path, *, dummy: bool) -> dict[str, object]:
    entry: dict[str, object] = {"name": "g12", "source": str(model), "max_model_len": 4096}
    if dummy:
        entry["engine_args"] = {"load_format": "dummy"}
    return {
        "models": [entry],
        "pools": [{"name": "h200", "gpu": {"type": "h200", "count": 1}, "max_nodes": 1}],
    }


def test_serve_resolves_a_weight_free_directory_with_dummy_load(tmp_path: Path) -> None:
    model = weight_free_dir(tmp_path)
    paths = resolve_model_paths(parse_spec(spec_of(model, dummy=True), "t"), "vllm")
    assert paths == {"g12": str(model)}


def test_serve_refuses_it_without_dummy_load_and_says_how(tmp_path: Path) -> None:
    model = weight_free_dir(tmp_path)
    with pytest.raises(ModelPreparationError, match="has no weights") as e:
        resolve_model_paths(parse_spec(spec_of(model, dummy=False), "t"), "vllm")
    assert "load_format: dummy" in str(e.value)


@pytest.mark.parametrize("command", ["plan", "render"])
def test_plan_and_render_take_a_weight_free_directory(tmp_path: Path, command: str) -> None:
    model = weight_free_dir(tmp_path)
    spec = tmp_path / "fleet.yaml"
    spec.write_text(yaml.safe_dump(spec_of(model, dummy=True)))
    extra = ["-o", str(tmp_path / "out")] if command == "render" else ["--format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "fleetserve.cli", command, str(spec), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    if command == "plan":
        plan = json.loads(done.stdout)
        (replica,) = plan["replicas"]
        # sized from the config's shapes: 12B in bf16 is ~24 GB of weights alone
        assert replica["need_mb"] > 24_000
    else:
        rendered = (tmp_path / "out" / "rayservice-fleetserve.yaml").read_text()
        assert "load_format" in rendered
        assert "dummy" in rendered
