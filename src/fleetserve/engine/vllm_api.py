"""The vLLM server functions fleetserve calls, from wherever the installed release keeps them.

Design note. The engine adapter uses five functions of vLLM's OpenAI server - the CLI
parser and its validation, the FastAPI app, its state, and the OpenAI error object - whose
signatures have not changed across the supported releases but whose modules have. Each
:class:`Layout` names those modules for a run of releases; the layout of the installed
version (:mod:`fleetserve.engine.vllm_version`, read from package metadata) is imported
once, here, and every other module takes the functions from this one. Chosen over
try-this-then-that imports: a release whose layout is not listed fails with the supported
range, not with whichever fallback happened to import, and the table says which release
moved what (checked against each release's sources; the version tests import every entry
of the installed one).

What must stay true: a layout is listed for every release in ``SUPPORTED_VLLM``, and the
layouts are ordered by ``since``. Engine methods that a release lacks are reached here too
(:func:`unfinished_requests`), never by ``hasattr`` at the call site.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from fleetserve.engine.vllm_version import require_supported_vllm
from fleetserve.errors import EngineError


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one run of vLLM releases (``since`` up to the next layout) keeps each function."""

    since: str
    app: str  # build_app
    app_state: str  # init_app_state
    cli_args: str  # make_arg_parser, validate_parsed_serve_args
    errors: str  # create_error_response


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        since="0.26",
        app="vllm.entrypoints.openai.api_server",
        app_state="vllm.entrypoints.openai.api_server",
        cli_args="vllm.entrypoints.openai.cli_args",
        errors="vllm.entrypoints.serve.utils.error_response",
    ),
    Layout(  # the error helper moved to serve.exception_handling
        since="0.28",
        app="vllm.entrypoints.openai.api_server",
        app_state="vllm.entrypoints.openai.api_server",
        cli_args="vllm.entrypoints.openai.cli_args",
        errors="vllm.entrypoints.serve.exception_handling.error_response",
    ),
    Layout(  # the server moved to entrypoints.launchers
        since="0.29",
        app="vllm.entrypoints.launchers.app",
        app_state="vllm.entrypoints.launchers.api_server.app_state",
        cli_args="vllm.entrypoints.launchers.cli_args",
        errors="vllm.entrypoints.serve.exception_handling.error_response",
    ),
    Layout(  # the CLI arguments moved to entrypoints.common
        since="0.33",
        app="vllm.entrypoints.launchers.app",
        app_state="vllm.entrypoints.launchers.api_server.app_state",
        cli_args="vllm.entrypoints.common.cli_args",
        errors="vllm.entrypoints.serve.exception_handling.error_response",
    ),
)


def layout_for(version: Version) -> Layout:
    """The layout of ``version`` (the last one whose ``since`` it has reached)."""
    release = Version(version.base_version)
    found = [layout for layout in LAYOUTS if release >= Version(layout.since)]
    if not found:
        raise EngineError(f"vLLM {version} predates every known layout ({LAYOUTS[0].since}+)")
    return found[-1]


def _load(module: str, name: str) -> Callable[..., Any]:
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as e:
        raise EngineError(f"vLLM {VERSION} has no {module}.{name}: {e}") from None


DISTRIBUTION, VERSION = require_supported_vllm()
LAYOUT = layout_for(VERSION)

build_app = _load(LAYOUT.app, "build_app")
init_app_state = _load(LAYOUT.app_state, "init_app_state")
make_arg_parser = _load(LAYOUT.cli_args, "make_arg_parser")
validate_parsed_serve_args = _load(LAYOUT.cli_args, "validate_parsed_serve_args")
create_error_response = _load(LAYOUT.errors, "create_error_response")


def unfinished_requests(engine: Any) -> int:
    """Requests an ``AsyncLLM`` still holds. ``AsyncLLM.get_num_unfinished_requests`` exists
    from 0.29; every supported release keeps the count on the engine's output processor,
    which that method reads."""
    return int(engine.output_processor.get_num_unfinished_requests())
