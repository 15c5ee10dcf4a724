"""The ``fleetserve`` command: a thin shell over the library.

Each area registers its own sub-command (``fleetserve.<area>.command.register``); this module
only wires them and maps errors to exit codes. What must stay true: a user never sees a
traceback for a :class:`FleetServeError` (exit code from the error, 2 for bad input) and
Ctrl-C exits 130 quietly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from fleetserve import __version__
from fleetserve.errors import FleetServeError

#: Sub-command modules, each exposing ``register(subparsers) -> None``; the parser it adds
#: sets ``handler`` (a callable taking the parsed namespace and returning an exit code).
_COMMAND_MODULES = (
    "fleetserve.serve.command",
    "fleetserve.modelstore.command",
    "fleetserve.plan.command",
    "fleetserve.k8s.render.command",
    "fleetserve.k8s.doctor.command",
    "fleetserve.bench.command",
    "fleetserve.observe.command",
)

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exits 2 (its convention)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"fleetserve: error: {message}\n  (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fleetserve",
        description="Serve many LLMs on a shared GPU fleet (Ray Serve + vLLM + KubeRay + HAMi).",
    )
    parser.add_argument("--version", action="version", version=f"fleetserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # area not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except FleetServeError as e:
        print(f"fleetserve: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("fleetserve: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
