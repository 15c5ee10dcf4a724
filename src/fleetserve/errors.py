"""The one exception hierarchy of fleetserve.

Every error a user can cause or meet derives from :class:`FleetServeError`; the CLI maps
them to a one-line message and an exit code (never a traceback). Each boundary (YAML
parsing, Ray, vLLM, HTTP, files) translates foreign exceptions with ``raise ... from e``.
"""

from __future__ import annotations


class FleetServeError(Exception):
    """Base of all fleetserve errors. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class UsageError(FleetServeError):
    """Bad input from the user: a bad file, flag, or spec. Exit code 2."""

    exit_code = 2


class SpecError(UsageError):
    """The fleet spec is unreadable or invalid (names the file and field path)."""


class InputFileError(UsageError):
    """A file given on the command line is missing or unreadable (names file and line)."""


class CapacityError(UsageError):
    """The fleet cannot fit the cluster or GPUs it is given (names the arithmetic)."""


class ModelPreparationError(FleetServeError):
    """The model could not be located, assembled or converted."""


class EngineError(FleetServeError):
    """The inference engine failed to start or failed a request."""


class ServeError(FleetServeError):
    """Ray Serve could not deploy or run the application."""


class BenchError(FleetServeError):
    """A benchmark run could not be carried out (e.g. endpoint unreachable)."""


class RenderError(FleetServeError):
    """Manifests could not be rendered from the spec and plan."""


class MetricsSourceError(FleetServeError):
    """A metrics endpoint or Prometheus server could not be read (``fleetserve top``)."""


class InternalError(FleetServeError):
    """A bug in fleetserve met on valid input (not the user's fault). Exit code 3, so CI can
    tell "the tool broke" from "the input has errors" (1) and "bad input or usage" (2)."""

    exit_code = 3
