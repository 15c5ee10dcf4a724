"""ModelStore: cache location, resolve() of each source kind, atomic + idempotent preparation.

Preparation is exercised with a fake preparer (the real one is covered by
test_gemma_output.py and the integration test); the store's contract does not depend on
what the preparer writes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from fleetserve.errors import ModelPreparationError
from fleetserve.modelstore import ModelStore, cache_root, default_model_dir
from fleetserve.modelstore.preparer import ModelPreparer, ProgressReporter
from fleetserve.modelstore.progress import SilentProgress
from fleetserve.modelstore.store import MARKER_NAME, read_marker, validate_model_dir


class FakePreparer:
    """Writes a minimal HF-looking directory; can be told to fail or to block."""

    def __init__(self, name: str = "tiny", format_version: int = 1) -> None:
        self.name = name
        self.format_version = format_version
        self.calls = 0
        self.fail_with: BaseException | None = None
        self.release: threading.Event | None = None
        self.entered = threading.Event()

    def check_available(self) -> None:
        pass

    def prepare(self, workdir: Path, progress: ProgressReporter) -> dict[str, Any]:
        self.calls += 1
        self.entered.set()
        with progress.step("writing"):
            (workdir / "config.json").write_text('{"model_type": "tiny"}')
            (workdir / "partial.safetensors").write_bytes(b"half")
            if self.release is not None:
                assert self.release.wait(30)
            if self.fail_with is not None:
                raise self.fail_with
            (workdir / "model.safetensors").write_bytes(b"weights")
        return {"source": "fake", "calls": self.calls}


def make_store(tmp_path: Path, *preparers: FakePreparer) -> tuple[ModelStore, SilentProgress]:
    progress = SilentProgress()
    mapping: dict[str, ModelPreparer] = {p.name: p for p in preparers or (FakePreparer(),)}
    return ModelStore(tmp_path / "cache", progress=progress, preparers=mapping), progress


def leftovers(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.models_dir.iterdir() if ".tmp-" in p.name)


# --------------------------------------------------------------------------- cache location


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FLEETSERVE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "fleetserve"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "fleetserve"
    monkeypatch.setenv("FLEETSERVE_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert ModelStore(tmp_path / "arg").root == tmp_path / "arg"


def test_default_model_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEETSERVE_CACHE", str(tmp_path))
    assert default_model_dir() == tmp_path / "models" / "gemma-3-270m"
    assert default_model_dir(tmp_path / "x") == tmp_path / "x" / "models" / "gemma-3-270m"
    assert ModelStore().builtin_dir("gemma-3-270m") == default_model_dir()


def test_relative_cache_dir_is_made_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cache_root("rel") == tmp_path / "rel"


# --------------------------------------------------------------------------- builtin sources


def test_resolve_builtin_prepares_once(tmp_path: Path) -> None:
    preparer = FakePreparer()
    store, progress = make_store(tmp_path, preparer)
    first = store.resolve("builtin:tiny")
    assert first == str(tmp_path / "cache" / "models" / "tiny")
    assert (Path(first) / "model.safetensors").read_bytes() == b"weights"
    marker = read_marker(Path(first))
    assert marker is not None
    assert marker["format_version"] == 1
    assert marker["source"] == "fake"
    assert progress.steps == ["writing"]
    # Second call: no preparation at all.
    assert store.resolve("builtin:tiny") == first
    assert preparer.calls == 1
    assert store.is_prepared("tiny")
    assert leftovers(store) == []


def test_force_rebuilds(tmp_path: Path) -> None:
    preparer = FakePreparer()
    store, _ = make_store(tmp_path, preparer)
    store.prepare("tiny")
    store.prepare("tiny", force=True)
    assert preparer.calls == 2
    assert read_marker(store.builtin_dir("tiny"))["calls"] == 2  # type: ignore[index]
    assert leftovers(store) == []


def test_new_format_version_rebuilds(tmp_path: Path) -> None:
    old = FakePreparer(format_version=1)
    store, _ = make_store(tmp_path, old)
    store.prepare("tiny")
    new = FakePreparer(format_version=2)
    store2, _ = make_store(tmp_path, new)
    assert not store2.is_prepared("tiny")
    store2.prepare("tiny")
    assert new.calls == 1
    assert read_marker(store2.builtin_dir("tiny"))["format_version"] == 2  # type: ignore[index]


def test_directory_without_marker_is_not_trusted(tmp_path: Path) -> None:
    preparer = FakePreparer()
    store, _ = make_store(tmp_path, preparer)
    target = store.builtin_dir("tiny")
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # e.g. copied by hand, or an old crash
    store.prepare("tiny")
    assert preparer.calls == 1
    assert (target / MARKER_NAME).is_file()
    assert (target / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "error", [RuntimeError("conversion broke"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
def test_interrupted_preparation_leaves_nothing(tmp_path: Path, error: BaseException) -> None:
    preparer = FakePreparer()
    preparer.fail_with = error
    store, _ = make_store(tmp_path, preparer)
    with pytest.raises(type(error)):
        store.prepare("tiny")
    assert not store.builtin_dir("tiny").exists()
    assert leftovers(store) == []
    assert not store.is_prepared("tiny")


def test_failed_rebuild_keeps_the_previous_version(tmp_path: Path) -> None:
    preparer = FakePreparer()
    store, _ = make_store(tmp_path, preparer)
    store.prepare("tiny")
    preparer.fail_with = RuntimeError("boom")
    with pytest.raises(RuntimeError):
        store.prepare("tiny", force=True)
    assert store.is_prepared("tiny")
    assert (store.builtin_dir("tiny") / "model.safetensors").read_bytes() == b"weights"


def test_stale_work_dirs_of_killed_runs_are_removed(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    stale = store.models_dir / ".tiny.tmp-abc123"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    other = store.models_dir / ".other.tmp-1"  # another model's run: not ours to delete
    other.mkdir()
    store.prepare("tiny")
    assert not stale.exists()
    assert other.exists()


def test_prepared_files_are_world_readable(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    target = store.prepare("tiny")
    assert target.stat().st_mode & 0o755 == 0o755
    for path in target.iterdir():
        assert path.stat().st_mode & 0o444 == 0o444, path


def test_concurrent_prepare_builds_once(tmp_path: Path) -> None:
    preparer = FakePreparer()
    preparer.release = threading.Event()
    store_a, _ = make_store(tmp_path, preparer)
    store_b, progress_b = make_store(tmp_path, preparer)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(store_a.prepare("tiny")))
    first.start()
    assert preparer.entered.wait(30)  # A holds the lock and is building
    second = threading.Thread(target=lambda: results.append(store_b.prepare("tiny")))
    second.start()
    for _ in range(3000):  # B reports that it waits (no timing assumption beyond 'eventually')
        if progress_b.notes:
            break
        threading.Event().wait(0.01)
    assert any("waiting" in n for n in progress_b.notes)
    preparer.release.set()
    first.join(30)
    second.join(30)
    assert preparer.calls == 1
    assert results == [store_a.builtin_dir("tiny")] * 2
    assert any("prepared by another process" in n for n in progress_b.notes)


def test_unknown_builtin_lists_known(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path)
    with pytest.raises(ModelPreparationError, match=r"unknown built-in model builtin:nope") as e:
        store.resolve("builtin:nope")
    assert "builtin:tiny" in str(e.value)


def test_uncreatable_cache_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = ModelStore(blocker, progress=SilentProgress(), preparers={"tiny": FakePreparer()})
    with pytest.raises(ModelPreparationError, match="cannot create the model cache") as e:
        store.prepare("tiny")
    assert "--cache-dir" in str(e.value)


def test_missing_inputs_fail_before_any_work(tmp_path: Path) -> None:
    class Missing(FakePreparer):
        def check_available(self) -> None:
            raise ModelPreparationError("missing", hint="pip install 'fleetserve[model]'")

    preparer = Missing()
    store, _ = make_store(tmp_path, preparer)
    with pytest.raises(ModelPreparationError, match="missing"):
        store.resolve("builtin:tiny")
    assert preparer.calls == 0
    assert not store.models_dir.exists()


# --------------------------------------------------------------------------- local directories


def write_model_dir(path: Path, config: str = '{"model_type": "llama"}') -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(config)
    (path / "model.safetensors").write_bytes(b"x")
    return path


def test_resolve_local_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_model_dir(tmp_path / "my-model")
    store, _ = make_store(tmp_path)
    assert store.resolve(str(model)) == str(model)
    monkeypatch.chdir(tmp_path)
    assert store.resolve("./my-model") == str(model)
    assert store.resolve("my-model") == str(model)  # exists locally: not taken for a repo id


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text("x"), "is a file, not a directory"),
        (lambda p: p.mkdir(), "has no config.json"),
        (lambda p: write_model_dir(p, '{"model_type": "llama",\n  oops}'), r"config.json:2:3"),
        (lambda p: write_model_dir(p, '["a list"]'), "neither 'model_type' nor"),
        (lambda p: write_model_dir(p, '{"hidden_size": 8}'), "neither 'model_type' nor"),
    ],
    ids=["missing", "file", "no-config", "bad-json", "not-object", "no-model-type"],
)
def test_invalid_local_directory(tmp_path: Path, setup: Any, message: str) -> None:
    target = tmp_path / "models" / "m"
    target.parent.mkdir()
    setup(target)
    store, _ = make_store(tmp_path)
    with pytest.raises(ModelPreparationError, match=message) as e:
        store.resolve(str(target))
    assert str(target) in str(e.value)


def test_directory_without_weights(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    with pytest.raises(ModelPreparationError, match="has no weights"):
        validate_model_dir(target)
    (target / "pytorch_model.bin").write_bytes(b"x")
    assert validate_model_dir(target) == target


def test_weight_free_directory_for_dummy_load(tmp_path: Path) -> None:
    """``load_format: dummy`` (random weights of the config's shapes) needs only the config
    and the tokenizer; without it the refusal says how to serve such a directory."""
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    (target / "tokenizer.json").write_text("{}")
    store, _ = make_store(tmp_path)
    with pytest.raises(ModelPreparationError, match="load_format: dummy"):
        store.resolve(str(target))
    assert store.resolve(str(target), weights=False) == str(target)
    # the config is still required: dummy weights take their shapes from it
    (target / "config.json").unlink()
    with pytest.raises(ModelPreparationError, match=r"no config\.json"):
        store.resolve(str(target), weights=False)


# --------------------------------------------------------------------------- hub ids


@pytest.mark.parametrize("repo", ["google/gemma-3-270m", "gpt2", "org.x/Model_v1.5-it"])
def test_hf_repo_ids_pass_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo: str
) -> None:
    monkeypatch.chdir(tmp_path)
    store, _ = make_store(tmp_path)
    assert store.resolve(repo) == repo


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("./not-there", "does not exist"),
        ("/abs/not-there", "does not exist"),
        ("~/not-there-either", "does not exist"),
        ("models/org/name", "does not exist"),
        ("has space/model", "neither 'builtin:<name>'"),
        (" google/gemma", "invalid model source"),
        ("", "invalid model source"),
    ],
)
def test_bad_sources_are_errors_not_downloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    store, _ = make_store(tmp_path)
    with pytest.raises(ModelPreparationError, match=message):
        store.resolve(source)
