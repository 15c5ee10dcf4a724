"""Every third-party module ``src/fleetserve`` imports is declared in ``pyproject.toml``.

A package imported when fleetserve's modules load must be a core dependency: an install
without extras still loads them (``fleetserve doctor`` once imported httpx from the ``dev``
extra, so a plain install could not start it). A package imported only inside a function, or
by a module that fleetserve itself imports only inside a function (the vLLM adapter,
``engine/factory.py``), may come from a runtime extra instead (the engine, the model
converter), never from ``dev``. A package that arrives only through another one is not
declared: its version is whatever that one resolves to, and it goes away when that one stops
needing it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "fleetserve"
#: Extras that are not part of what users install to run fleetserve.
NOT_RUNTIME = {"dev"}


def _imports(tree: ast.Module) -> Iterator[tuple[str, bool, int]]:
    """(imported module, imported when the file loads, line) for each absolute import.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (c may be a submodule).
    """

    def walk(node: ast.AST, eager: bool) -> Iterator[tuple[str, bool, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                # Read by mypy only; never imported at run time.
                yield from walk(child, False)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, eager, child.lineno
            elif isinstance(child, ast.ImportFrom):
                if child.level == 0 and child.module:
                    yield child.module, eager, child.lineno
                    for alias in child.names:
                        yield f"{child.module}.{alias.name}", eager, child.lineno
            else:
                yield from walk(child, eager)

    yield from walk(tree, True)


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: The vLLM adapter: loaded only where an engine runs (``engine/factory.py`` imports it
#: inside a function), so its load-time imports may come from the engine extras.
ENGINE_ADAPTER = {
    "fleetserve.engine.vllm_engine",
    "fleetserve.engine.lora",
    "fleetserve.engine.ray_stats",
}


def _found() -> dict[str, tuple[Path, list[tuple[str, bool, int]]]]:
    """Each fleetserve module: its file and its imports."""
    return {
        _module_name(p): (p, list(_imports(ast.parse(p.read_text(), str(p)))))
        for p in sorted(SRC.rglob("*.py"))
    }


def _declared() -> tuple[set[str], set[str]]:
    """(core dependency names, names in a runtime extra), canonicalized."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    extras = {
        canonicalize_name(Requirement(r).name)
        for extra, reqs in project["optional-dependencies"].items()
        if extra not in NOT_RUNTIME
        for r in reqs
    }
    return core, extras


def test_every_imported_package_is_declared() -> None:
    core, extras = _declared()
    providers = importlib.metadata.packages_distributions()
    missing: list[str] = []
    for module, (path, imps) in _found().items():
        for name, eager, line in imps:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in {"fleetserve", "__future__"}:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {top}"
            dists = {canonicalize_name(d) for d in providers.get(top, [])}
            if not dists:
                missing.append(f"{where}: no installed distribution provides it")
            elif eager and module not in ENGINE_ADAPTER and not dists & core:
                missing.append(f"{where} when it loads: {sorted(dists)} not in dependencies")
            elif not dists & (core | extras):
                missing.append(f"{where}: {sorted(dists)} in neither dependencies nor an extra")
    assert not missing, "\n".join(sorted(set(missing)))


def test_the_engine_adapter_loads_only_inside_a_function() -> None:
    # What makes ENGINE_ADAPTER's exemption sound: nothing outside it imports it when it
    # loads, so `fleetserve doctor` or `plan` never pulls vLLM in.
    found = _found()
    assert set(found) >= ENGINE_ADAPTER
    eager = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, (path, imps) in found.items()
        if module not in ENGINE_ADAPTER
        for name, at_load, line in imps
        if at_load and name in ENGINE_ADAPTER
    ]
    assert not eager, eager


def test_the_check_sees_eager_lazy_and_type_only_imports() -> None:
    tree = ast.parse(
        "import a.b\n"
        "from c import d\n"
        "from . import e\n"
        "if TYPE_CHECKING:\n"
        "    import f\n"
        "try:\n"
        "    import g\n"
        "except ImportError:\n"
        "    pass\n"
        "def h():\n"
        "    import i\n"
        "class J:\n"
        "    import k\n"
    )
    assert [(m, eager) for m, eager, _ in _imports(tree)] == [
        ("a.b", True),
        ("c", True),
        ("c.d", True),
        ("f", False),
        ("g", True),
        ("i", False),
        ("k", True),
    ]
