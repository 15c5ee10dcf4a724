"""A static evaluator for Python source: literal values of expressions, never running code.

Design note: doctor reads Ray resource requests from training and Serve scripts without
executing them (``ast`` only). :func:`evaluate` folds literals, containers, ``dict(...)`` and
arithmetic on numbers, resolving names through the constants in scope; :class:`Scopes` gives the
constants visible at a call (module level, then simple assignments earlier in the enclosing
functions). Anything else is :data:`UNRESOLVED`, and callers must not guess a value for it.
What must stay true: evaluation has no side effects and is bounded (huge powers refused).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

#: The value of an expression that cannot be known without running the code.
UNRESOLVED = object()

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def evaluate(node: ast.AST | None, constants: dict[str, Any]) -> Any:
    """Literal value of ``node``, resolving module-level constant names; else UNRESOLVED."""
    if node is None:
        return UNRESOLVED
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id, UNRESOLVED)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        val = evaluate(node.operand, constants)
        if isinstance(val, int | float) and not isinstance(val, bool):
            return -val if isinstance(node.op, ast.USub) else val
        return UNRESOLVED
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = evaluate(node.left, constants), evaluate(node.right, constants)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))
        if isinstance(node.op, ast.Pow) and numbers and abs(right) > 64:
            return UNRESOLVED  # bytes are 1024**3, not 10**100000: refuse huge powers
        if numbers:
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError:
                return UNRESOLVED
        return UNRESOLVED
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:  # {**other}
                return UNRESOLVED
            key, val = evaluate(k, constants), evaluate(v, constants)
            if key is UNRESOLVED or val is UNRESOLVED:
                return UNRESOLVED
            out[key] = val
        return out
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and not node.args
    ):
        out = {}
        for kw in node.keywords:
            if kw.arg is None:
                return UNRESOLVED
            val = evaluate(kw.value, constants)
            if val is UNRESOLVED:
                return UNRESOLVED
            out[kw.arg] = val
        return out
    if isinstance(node, ast.List | ast.Tuple):
        items = [evaluate(e, constants) for e in node.elts]
        if any(i is UNRESOLVED for i in items):
            return UNRESOLVED
        return items if isinstance(node, ast.List) else tuple(items)
    return UNRESOLVED


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """``NAME = <literal>`` at module level (later assignments win; reassigned names drop)."""
    constants: dict[str, Any] = {}
    for stmt in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        for target in targets:
            if isinstance(target, ast.Name):
                val = evaluate(value, constants)
                if val is UNRESOLVED:
                    constants.pop(target.id, None)
                else:
                    constants[target.id] = val
    return constants


class Scopes:
    """Constants visible at a call: module constants, then simple assignments earlier in the
    enclosing function(s) (``cpus = 4`` ... ``ScalingConfig(resources_per_worker={"CPU": cpus})``).
    """

    def __init__(self, tree: ast.Module, constants: dict[str, Any]) -> None:
        self.constants = constants
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    def at(self, node: ast.AST) -> dict[str, Any]:
        chain: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        cur = self.parents.get(node)
        while cur is not None:
            if isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef):
                chain.append(cur)
            cur = self.parents.get(cur)
        scope = dict(self.constants)
        line = getattr(node, "lineno", 0)
        for func in reversed(chain):
            for stmt in func.body:
                if getattr(stmt, "lineno", line) >= line:
                    break
                target = value = None
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    target, value = stmt.target, stmt.value
                if isinstance(target, ast.Name):
                    val = evaluate(value, scope)
                    if val is UNRESOLVED:
                        scope.pop(target.id, None)
                    else:
                        scope[target.id] = val
        return scope
