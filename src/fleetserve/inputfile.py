"""Reading a file the user names, and saying what is wrong with it in one line.

Every command that reads a file of fleetserve's own (a spec, a bench report, a calibration,
a workload, a saved plan) says the same things the same way: ``PATH: cannot read: ...``,
``PATH:LINE:COL: not JSON: ...`` and ``PATH: field.path[i]: message`` for a value that does
not validate. This module is where those wordings and the field-path notation live, so a
user sees one notation whichever command read the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from fleetserve.errors import InputFileError

M = TypeVar("M", bound=BaseModel)


def field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's ``loc`` as the user writes it: ``models[0].name``; ``(root)`` when empty."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "union[")) or "[" in part:
            continue  # pydantic's internal validator/union markers are not field names
        else:
            out += f".{part}" if out else part
    return out or "(root)"


def first_problem(error: ValidationError) -> str:
    """``field.path: message`` of the first thing pydantic refused (one line for the CLI)."""
    first = error.errors()[0]
    return f"{field_path(tuple(first['loc']))}: {first['msg']}"


def read_text(path: Path) -> str:
    """The file's text; an unreadable file is an :class:`InputFileError` naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputFileError(f"{path}: cannot read: {e.strerror or e}") from e


def read_json(path: Path) -> Any:
    """The file's JSON; errors name the file (and the line and column of bad JSON)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputFileError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from e


def load_tagged(model: type[M], path: Path, fmt: str, what: str, *, hint: str | None = None) -> M:
    """A JSON file fleetserve wrote with ``"format": fmt``, validated into ``model``.

    ``what`` names the kind of file in the error ("bench report") when the tag is not there.
    """
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise InputFileError(
            f"{path}: not a fleetserve {what} (format {fmt!r} expected)", hint=hint
        )
    return validate(model, data, path)


def validate(model: type[M], data: Any, source: Path | str) -> M:
    """``model`` from ``data``; a refused value is an :class:`InputFileError` naming its field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InputFileError(f"{source}: {first_problem(e)}") from e


def save_json(model: BaseModel, path: Path) -> None:
    """Write ``model`` as indented JSON, creating the folder (the form ``load_tagged`` reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=1) + "\n", encoding="utf-8")
