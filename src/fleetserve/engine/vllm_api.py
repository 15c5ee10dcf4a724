"""The vLLM server functions fleetserve calls, from wherever the installed release keeps them.

Design note. The engine adapter uses five functions of vLLM's OpenAI server - the CLI
parser and its validation, the FastAPI app, its state, and the OpenAI error object - whose
signatures have not changed across the supported releases but whose modules have.
:data:`MOVES` gives each function's history of places; the place for the installed version
(:mod:`fleetserve.engine.vllm_version`, read from package metadata) is imported once, here,
and every other module takes the functions from this one. Chosen over
try-this-then-that imports: a release whose layout is not listed fails with the supported
range, not with whichever fallback happened to import, and the table says which release
moved what (checked against each release's sources; the version tests import every entry
of the installed one).

What must stay true: every history starts at the lower bound of ``SUPPORTED_VLLM`` and
is ordered oldest first. Engine methods that a release lacks are reached here too
(:func:`unfinished_requests`), never by ``hasattr`` at the call site.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from packaging.version import Version

from fleetserve.engine.vllm_version import require_supported_vllm
from fleetserve.errors import EngineError

#: Where each function lives, as a history of moves: (first release, module), oldest first.
#: Read from each release's sources (0.26, 0.27.1, 0.28, 0.29, 0.30, 0.31, 0.32, 0.33).
MOVES: dict[str, tuple[tuple[str, str], ...]] = {
    "build_app": (
        ("0.26", "vllm.entrypoints.openai.api_server"),
        ("0.29", "vllm.entrypoints.launchers.app"),  # the server moved to launchers
    ),
    "init_app_state": (
        ("0.26", "vllm.entrypoints.openai.api_server"),
        ("0.29", "vllm.entrypoints.launchers.api_server.app_state"),
    ),
    "make_arg_parser": (
        ("0.26", "vllm.entrypoints.openai.cli_args"),
        ("0.29", "vllm.entrypoints.launchers.cli_args"),
        ("0.33", "vllm.entrypoints.common.cli_args"),  # the CLI arguments moved to common
    ),
    "create_error_response": (
        ("0.26", "vllm.entrypoints.serve.utils.error_response"),
        ("0.28", "vllm.entrypoints.serve.exception_handling.error_response"),
    ),
}
#: Functions that live beside another one (same module in every release).
MOVES["validate_parsed_serve_args"] = MOVES["make_arg_parser"]


def module_of(name: str, version: Version) -> str:
    """The module that holds function ``name`` in vLLM ``version`` (its latest move)."""
    release = Version(version.base_version)
    found = [module for since, module in MOVES[name] if release >= Version(since)]
    if not found:
        raise EngineError(f"vLLM {version} predates {name}'s first known place")
    return found[-1]


def _load(name: str) -> Callable[..., Any]:
    module = module_of(name, VERSION)
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as e:
        raise EngineError(f"vLLM {VERSION} has no {module}.{name}: {e}") from None


DISTRIBUTION, VERSION = require_supported_vllm()

build_app = _load("build_app")
init_app_state = _load("init_app_state")
make_arg_parser = _load("make_arg_parser")
validate_parsed_serve_args = _load("validate_parsed_serve_args")
create_error_response = _load("create_error_response")


def unfinished_requests(engine: Any) -> int:
    """Requests an ``AsyncLLM`` still holds. ``AsyncLLM.get_num_unfinished_requests`` exists
    from 0.29; every supported release keeps the count on the engine's output processor,
    which that method reads."""
    return int(engine.output_processor.get_num_unfinished_requests())
