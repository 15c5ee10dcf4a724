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

#: Sub-commands: name -> (module, one-line help). Each module exposes
#: ``register(subparsers) -> None``, adding the parser of that name; the parser sets
#: ``handler`` (a callable taking the parsed namespace and returning an exit code).
#: Only the chosen command's module is imported: serve pulls in Ray and vLLM, plan scipy,
#: and ``fleetserve doctor`` or ``--help`` must not pay for them.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("fleetserve.serve.control.command", "serve the fleet's models behind an OpenAI API"),
    "model": ("fleetserve.modelstore.command", "prepare or locate the default model"),
    "plan": ("fleetserve.plan.command", "place model replicas on GPUs; derive engine settings"),
    "render": ("fleetserve.k8s.render.command", "write KubeRay/HAMi/monitoring manifests"),
    "doctor": ("fleetserve.k8s.doctor.command", "find known traps in manifests before deploy"),
    "bench": ("fleetserve.bench.command", "measure an OpenAI-compatible endpoint"),
    "simulate": ("fleetserve.sim.command", "simulate a fleet under a workload (bench reports)"),
    "observe": ("fleetserve.observe.command", "print alert rules or the Grafana dashboard"),
    "top": ("fleetserve.top.command", "live terminal view of a running fleet"),
}

Handler = Callable[[argparse.Namespace], int]

#: Sub-sub-commands with their own parser: (command, word) -> module with ``run(argv)``.
#: ``plan`` takes the spec as its positional, so ``plan calibrate`` cannot be an argparse
#: sub-parser of it.
NESTED: dict[tuple[str, str], str] = {
    ("plan", "calibrate"): "fleetserve.sim.calibrate_command",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exits 2 (its convention)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"fleetserve: error: {message}\n  (see '{self.prog} --help')\n")


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command named on the command line (first non-option word), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; only the command named in ``argv`` gets its full (imported) parser."""
    parser = _Parser(
        prog="fleetserve",
        description="Serve many LLMs on a shared GPU fleet (Ray Serve + vLLM + KubeRay + HAMi).",
    )
    parser.add_argument("--version", action="version", version=f"fleetserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = _chosen_command(argv)
    for name, (module_name, help_text) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module_name).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    nested = NESTED.get((argv[0], argv[1])) if len(argv) > 1 else None
    if nested is not None:
        try:
            return int(importlib.import_module(nested).run(argv[2:]))
        except FleetServeError as e:
            print(f"fleetserve: error: {e}", file=sys.stderr)
            return e.exit_code
    parser = build_parser(argv)
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
