"""The seam between the model store and whatever builds a model directory.

A :class:`ModelPreparer` turns something installed locally (a PyPI package, a file) into a
HF-format directory vLLM can load. The store owns *where* and *atomically*; the preparer owns
*what goes in*. What must stay true for every implementation:

- it writes only under the ``workdir`` it is given (the store renames that directory into
  place when :meth:`ModelPreparer.prepare` returns, and deletes it if it raises);
- it makes no network calls;
- it raises :class:`~fleetserve.errors.ModelPreparationError` (with a hint) for anything a
  user can fix, never a bare foreign exception;
- :attr:`ModelPreparer.format_version` changes whenever the directory it writes changes in a
  way a consumer could notice (dtype, tokenizer fix, template), so stale caches are rebuilt.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ProgressReporter(Protocol):
    """Where a long preparation reports its steps (a terminal, a log, or nothing)."""

    def step(self, description: str) -> AbstractContextManager[None]:
        """Context manager around one step; reports its start, its end and how long it took."""
        ...

    def note(self, message: str) -> None:
        """A one-line message outside any step (e.g. 'already prepared')."""
        ...


@runtime_checkable
class ModelPreparer(Protocol):
    """Builds one built-in model into an empty directory."""

    #: Short name used in ``builtin:<name>`` sources and as the cache directory name.
    name: str
    #: Version of the directory layout this preparer writes (stored in the marker file).
    format_version: int

    def check_available(self) -> None:
        """Raise ModelPreparationError (with an install hint) when inputs are missing.

        Cheap; called before any work so a missing package fails fast with a clear message.
        """
        ...

    def prepare(self, workdir: Path, progress: ProgressReporter) -> dict[str, Any]:
        """Write the model into the empty ``workdir``; return provenance for the marker."""
        ...
