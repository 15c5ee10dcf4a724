"""The model store: turns a model ``source`` into something vLLM can load, offline.

Design note. ``resolve(source)`` accepts three kinds of source:

- ``builtin:<name>``: a model fleetserve builds from locally installed packages (today
  ``builtin:gemma-3-270m``); prepared on first use into ``<cache>/models/<name>`` and
  returned as that directory;
- a local directory: validated (``config.json`` that parses, weights present) and returned
  as an absolute path;
- anything else that looks like a Hugging Face repo id (``org/name``): returned unchanged,
  for vLLM to download where it runs (a GPU cluster with a model cache).

Preparation is atomic and idempotent. The preparer writes into a fresh temporary directory
beside the target (same filesystem, so the final ``rename`` is atomic); a marker file with
the preparer's ``format_version`` is written last, inside the temporary directory, before the
rename. So a directory at the target path without a current marker is never trusted, and an
interrupted run (exception, Ctrl-C, SIGKILL) leaves at most a ``.<name>.tmp-*`` directory,
which the next run deletes. An exclusive ``flock`` on ``<cache>/models/.<name>.lock``
serialises concurrent preparers (two test sessions, a server and ``make model``): the second
waits, then finds the marker and returns at once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleetserve.errors import ModelPreparationError
from fleetserve.modelstore.gemma import GemmaPreparer
from fleetserve.modelstore.preparer import ModelPreparer, ProgressReporter
from fleetserve.modelstore.progress import RichProgress

#: Environment variable that overrides the cache root.
CACHE_ENV = "FLEETSERVE_CACHE"
#: Prefix of built-in sources.
BUILTIN_PREFIX = "builtin:"
#: Name of the marker file written last into a prepared directory.
MARKER_NAME = ".fleetserve-prepared.json"
#: Weight files vLLM can load from a local directory.
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
#: A Hugging Face repo id: ``name`` or ``org/name`` (letters, digits, ``-_.``).
_HF_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def cache_root(cache: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache`` if given, else ``$FLEETSERVE_CACHE``, else the user cache.

    The user cache is ``$XDG_CACHE_HOME/fleetserve`` when that is set, else
    ``~/.cache/fleetserve``.
    """
    if cache is not None:
        return Path(cache).expanduser().absolute()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "fleetserve").absolute()


def default_model_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the default model (``builtin:gemma-3-270m``) lives, prepared or not."""
    return cache_root(cache) / "models" / GemmaPreparer.name


def builtin_preparers() -> dict[str, ModelPreparer]:
    """The built-in models, by name."""
    gemma = GemmaPreparer()
    return {gemma.name: gemma}


class ModelStore:
    """Resolves model sources to loadable references; prepares built-in models on demand."""

    def __init__(
        self,
        cache: str | os.PathLike[str] | None = None,
        *,
        progress: ProgressReporter | None = None,
        preparers: Mapping[str, ModelPreparer] | None = None,
    ) -> None:
        self.root = cache_root(cache)
        self.progress: ProgressReporter = progress if progress is not None else RichProgress()
        self.preparers: dict[str, ModelPreparer] = dict(
            preparers if preparers is not None else builtin_preparers()
        )

    # ------------------------------------------------------------------ queries

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    def builtin_dir(self, name: str) -> Path:
        """Directory of built-in model ``name`` (whether or not it is prepared)."""
        self._preparer(name)
        return self.models_dir / name

    def is_prepared(self, name: str) -> bool:
        """True when ``name`` is prepared with the current format version."""
        return self._marker_current(self.builtin_dir(name), self._preparer(name))

    # ------------------------------------------------------------------ resolve

    def resolve(self, source: str, *, weights: bool = True) -> str:
        """What to hand vLLM as ``model`` for ``source`` (see the module's design note).

        ``weights``: False for a model vLLM loads with random weights (``load_format:
        dummy``), whose directory needs only config.json and the tokenizer.
        """
        if not source or source != source.strip():
            raise ModelPreparationError(f"invalid model source {source!r}")
        if source.startswith(BUILTIN_PREFIX):
            return str(self.prepare(source.removeprefix(BUILTIN_PREFIX)))
        path = Path(source).expanduser()
        if _looks_like_path(source) or path.exists():
            return str(validate_model_dir(path, weights=weights))
        if _HF_REPO_ID.match(source):
            return source
        raise ModelPreparationError(
            f"model source {source!r} is neither 'builtin:<name>', an existing directory, "
            "nor a Hugging Face repo id ('org/name')",
            hint=f"built-in models: {', '.join(BUILTIN_PREFIX + n for n in self.preparers)}",
        )

    # ------------------------------------------------------------------ prepare

    def prepare(self, name: str, *, force: bool = False) -> Path:
        """Prepare built-in model ``name`` (once) and return its directory.

        Instant when already prepared with the current format version, unless ``force``.
        """
        preparer = self._preparer(name)
        target = self.models_dir / name
        if not force and self._marker_current(target, preparer):
            return target
        preparer.check_available()
        try:
            self.models_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ModelPreparationError(
                f"cannot create the model cache {self.models_dir}: {e.strerror or e}",
                hint=f"set {CACHE_ENV} or pass --cache-dir to use another directory",
            ) from e
        with self._lock(name):
            # Another process may have finished while we waited for the lock.
            if not force and self._marker_current(target, preparer):
                self.progress.note(f"{name}: prepared by another process at {target}")
                return target
            self._remove_stale_work(name)
            self._build(name, preparer, target)
        return target

    def _build(self, name: str, preparer: ModelPreparer, target: Path) -> None:
        work = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=self.models_dir))
        try:
            provenance = preparer.prepare(work, self.progress)
            marker = {
                "name": name,
                "format_version": preparer.format_version,
                "prepared_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                **provenance,
            }
            (work / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", "utf-8")
            # mkdtemp makes 0700 and safetensors writes 0600; the model is not a secret, and
            # other users (a Ray worker, a container user) must be able to read it.
            work.chmod(0o755)
            for path in work.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            self._swap_into_place(work, target)
        except BaseException:
            # Exceptions and Ctrl-C alike: leave nothing half-made behind.
            shutil.rmtree(work, ignore_errors=True)
            raise

    def _swap_into_place(self, work: Path, target: Path) -> None:
        """Rename ``work`` to ``target``; an old ``target`` is moved aside first, then removed."""
        old: Path | None = None
        try:
            if target.exists() or target.is_symlink():
                old = target.with_name(f".{target.name}.tmp-old-{os.getpid()}")
                shutil.rmtree(old, ignore_errors=True)
                target.rename(old)
            work.rename(target)
        except OSError as e:
            if old is not None and not target.exists():
                old.rename(target)  # put the previous version back
            raise ModelPreparationError(f"cannot move the prepared model to {target}: {e}") from e
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _remove_stale_work(self, name: str) -> None:
        """Delete leftovers of interrupted runs (safe: we hold the lock for ``name``)."""
        for stale in self.models_dir.glob(f".{name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        lock_path = self.models_dir / f".{name}.lock"
        with lock_path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.progress.note(f"{name}: waiting for another process preparing it...")
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ helpers

    def _preparer(self, name: str) -> ModelPreparer:
        try:
            return self.preparers[name]
        except KeyError:
            known = ", ".join(BUILTIN_PREFIX + n for n in sorted(self.preparers)) or "none"
            raise ModelPreparationError(
                f"unknown built-in model {BUILTIN_PREFIX}{name}", hint=f"built-in models: {known}"
            ) from None

    @staticmethod
    def _marker_current(target: Path, preparer: ModelPreparer) -> bool:
        marker = read_marker(target)
        return marker is not None and marker.get("format_version") == preparer.format_version


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The preparation marker of ``directory``, or None when absent or unreadable."""
    try:
        data = json.loads((directory / MARKER_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def validate_model_dir(path: Path, *, weights: bool = True) -> Path:
    """Check that ``path`` is a HF-format model directory; return it absolute.

    ``weights``: whether weight files must be there (not for ``load_format: dummy``).
    Raises ModelPreparationError naming the path and what is missing.
    """
    path = path.expanduser().absolute()
    if not path.exists():
        raise ModelPreparationError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelPreparationError(
            f"model source {path} is a file, not a directory",
            hint="point at the directory that holds config.json and the weights",
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelPreparationError(
            f"{path} is not a Hugging Face model directory: it has no config.json",
            hint="a model directory holds config.json, the tokenizer and *.safetensors",
        )
    try:
        config = json.loads(config_path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelPreparationError(f"cannot read {config_path}: {e}") from e
    except json.JSONDecodeError as e:
        raise ModelPreparationError(
            f"{config_path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}"
        ) from e
    if not isinstance(config, dict) or not ("model_type" in config or "architectures" in config):
        raise ModelPreparationError(
            f"{config_path} is not a model config: it has neither 'model_type' nor 'architectures'"
        )
    if weights and not any(next(path.glob(pattern), None) for pattern in _WEIGHT_GLOBS):
        raise ModelPreparationError(
            f"{path} has no weights (expected {', '.join(_WEIGHT_GLOBS)})",
            hint="serve it with random weights of its shapes: engine_args: {load_format: dummy}",
        )
    return path


def _looks_like_path(source: str) -> bool:
    """Sources written as paths are never taken for repo ids (a typo must not download)."""
    return (
        source.startswith(("/", "./", "../", "~")) or source in {".", ".."} or source.count("/") > 1
    )
