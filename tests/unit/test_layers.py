"""Layering: no fleetserve module imports back up into what imports it, and ``serve/``'s
parts depend on each other only down the request path.

``serve/`` is split by concern, read as the request path: ``ingress`` (HTTP, the gateway,
how the ingress reaches replicas) -> ``guard`` (keys, quotas, admission) -> ``routing``
(which replica) -> ``replica`` (the model deployment, the stream relay back). ``control``
(the command, the lifecycle, the app builder) builds all of them; the plan
(``fleetserve.plan``) decides every number they run with, and never imports ``serve``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "fleetserve"

#: What each part of serve/ may import from the others (its own modules always).
SERVE_LAYERS: dict[str, set[str]] = {
    "control": {"ingress", "guard", "routing", "replica", "openai_errors"},
    "ingress": {"guard", "routing", "replica", "openai_errors"},
    "guard": {"openai_errors"},
    "routing": set(),
    "replica": {"routing"},
    "openai_errors": set(),
}
#: Packages that must not import these (the core below the shells).
FORBIDDEN = {
    "fleetserve.plan": ("fleetserve.serve", "fleetserve.k8s", "fleetserve.bench"),
    "fleetserve.engine": ("fleetserve.serve", "fleetserve.k8s", "fleetserve.plan"),
    "fleetserve.k8s": ("fleetserve.serve.control", "fleetserve.serve.ingress"),
}


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, eager_only: bool) -> set[str]:
    """fleetserve modules ``path`` imports (at load time only, with ``eager_only``)."""
    found: set[str] = set()

    def walk(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            ):
                walk(child, False)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if eager or not eager_only:
                    found.add(child.module)
                    found.update(f"{child.module}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                if eager or not eager_only:
                    found.update(a.name for a in child.names)
            else:
                walk(child, eager)

    walk(ast.parse(path.read_text(), str(path)), True)
    return {m for m in found if m.startswith("fleetserve")}


def _graph(*, eager_only: bool) -> dict[str, set[str]]:
    files = {_module(p): p for p in SRC.rglob("*.py")}
    return {
        mod: {m for m in _imports(path, eager_only=eager_only) if m in files and m != mod}
        for mod, path in files.items()
    }


def test_no_module_imports_back_into_what_imports_it() -> None:
    graph = _graph(eager_only=True)
    # Tarjan-free: a depth-first search that reports the first cycle it closes.
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the stack, 2 done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(mod: str) -> None:
        state[mod] = 1
        stack.append(mod)
        for dep in sorted(graph[mod]):
            if state[dep] == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif state[dep] == 0:
                visit(dep)
        stack.pop()
        state[mod] = 2

    for mod in sorted(graph):
        if state[mod] == 0:
            visit(mod)
    assert cycles == []


def _serve_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["fleetserve", "serve"] or len(parts) < 3:
        return None
    return parts[2]


def test_serve_parts_depend_only_down_the_request_path() -> None:
    parts = {p.name for p in (SRC / "serve").iterdir() if p.is_dir() and p.name != "__pycache__"}
    parts |= {p.stem for p in (SRC / "serve").glob("*.py") if p.stem != "__init__"}
    assert parts == set(SERVE_LAYERS), "a new part of serve/: give it its place in SERVE_LAYERS"
    wrong = []
    for mod, deps in _graph(eager_only=False).items():
        part = _serve_part(mod)
        if part is None:
            continue
        for dep in deps:
            other = _serve_part(dep)
            if other is not None and other != part and other not in SERVE_LAYERS[part]:
                wrong.append(f"{mod} imports {dep}")
    assert wrong == []


def test_the_core_does_not_import_the_shells() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in _graph(eager_only=False).items()
        for package, banned in FORBIDDEN.items()
        if mod == package or mod.startswith(package + ".")
        for dep in deps
        if dep.startswith(banned)
    ]
    assert wrong == []
