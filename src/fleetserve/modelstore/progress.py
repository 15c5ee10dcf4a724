"""Progress reporters for model preparation: a rich one for terminals and a silent one.

The rich reporter shows a spinner with the running step and its elapsed time while the step
runs (on a terminal), and always leaves one line per finished step with its duration, so a
log of a non-interactive run (CI, Ray worker) still says where the time went.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class RichProgress:
    """Reports preparation steps on a rich console (stderr by default: stdout stays clean)."""

    def __init__(self, console: Console | None = None, *, title: str | None = None) -> None:
        self._console = console if console is not None else Console(stderr=True)
        self._title = title
        self._started: float | None = None

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        if self._started is None:
            self._started = time.monotonic()
            if self._title:
                self._console.print(f"[bold]{self._title}[/bold]")
        begin = time.monotonic()
        ok = False
        try:
            if self._console.is_terminal:
                # Live spinner + elapsed clock; transient, replaced by the summary line below.
                progress = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    TimeElapsedColumn(),
                    console=self._console,
                    transient=True,
                )
                with progress:
                    progress.add_task(description, total=None)
                    yield
            else:
                # A log: say what started, so a slow step is visible before it ends.
                self._console.print(f"  … {description}", highlight=False)
                yield
            ok = True
        finally:
            elapsed = time.monotonic() - begin
            mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
            self._console.print(
                f"  {mark} {description} [dim]({elapsed:.1f} s)[/dim]", highlight=False
            )

    def note(self, message: str) -> None:
        self._console.print(message)

    @property
    def total_seconds(self) -> float:
        """Seconds since the first step started (0 when no step ran)."""
        return 0.0 if self._started is None else time.monotonic() - self._started


class SilentProgress:
    """Reports nothing; records step names (handy for tests and library callers)."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.notes: list[str] = []

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        self.steps.append(description)
        yield

    def note(self, message: str) -> None:
        self.notes.append(message)
