"""Ray resource requests read from Python source: ``ScalingConfig(...)``, ``@ray.remote(...)``,
``.options(...)``, ``placement_group(...)`` and the ``RAY_TRAIN_V2_ENABLED`` switch.

Design note: values come from :mod:`.static_eval` (literals and constants in scope); an
argument it cannot resolve is recorded as unresolved, and one read from an environment
variable (``int(os.environ["N"])``) keeps the variable's name so rules can look it up in the
manifest that runs the script. Nothing here executes the script.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from fleetserve.k8s.doctor.inventory import RayResourceRequest, ScalingConfigCall
from fleetserve.k8s.doctor.static_eval import UNRESOLVED, Scopes, evaluate, module_constants


def read_python(
    tree: ast.Module, file: str
) -> tuple[list[ScalingConfigCall], list[RayResourceRequest]]:
    """Every ScalingConfig call and Ray resource request of a parsed Python file."""
    constants = module_constants(tree)
    v2 = _train_v2_flag(tree, constants)
    scopes = Scopes(tree, constants)
    env_names = _env_assignments(tree, constants)
    calls: list[ScalingConfigCall] = []
    for call in _scaling_config_calls(tree):
        args = _bind_scaling_args(call, scopes.at(call))
        workers_node = _scaling_arg_node(call, "num_workers")
        fields = {
            "num_workers": _as_int(args.get("num_workers", 1)),
            "use_gpu": _as_bool(args.get("use_gpu", False)),
            "resources_per_worker": _as_resources(args.get("resources_per_worker")),
            "trainer_resources": _as_resources(args.get("trainer_resources")),
            "placement_strategy": _as_str(args.get("placement_strategy", "PACK")),
        }
        # Given but unusable (computed at run time, or of a shape Ray would reject):
        # rules must not fall back to Ray's default for these.
        unresolved = sorted(
            k
            for k, v in args.items()
            if v is UNRESOLVED or (k in fields and v is not None and fields[k] is None)
        )
        calls.append(
            ScalingConfigCall(
                file=file,
                line=call.lineno,
                num_workers=_as_int(fields["num_workers"]),
                use_gpu=_as_bool(fields["use_gpu"]),
                resources_per_worker=_as_resources(fields["resources_per_worker"]),
                trainer_resources=_as_resources(fields["trainer_resources"]),
                placement_strategy=_as_str(fields["placement_strategy"]),
                train_v2=v2,
                unresolved=tuple(unresolved),
                num_workers_env=(
                    _env_read(workers_node, constants, env_names)
                    if workers_node is not None and fields["num_workers"] is None
                    else None
                ),
            )
        )
    return calls, _ray_requests(tree, scopes, file)


#: ``@ray.remote`` / ``.options`` keywords that request resources.
_RESOURCE_KEYWORDS = ("num_cpus", "num_gpus", "memory", "resources")


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _remote_bundle(
    call: ast.Call, scope: dict[str, Any], default_cpu: float
) -> dict[str, float] | None:
    """Resources of a ray.remote/.options call; None when absent or not resolvable."""
    kws = {kw.arg: kw.value for kw in call.keywords if kw.arg in _RESOURCE_KEYWORDS}
    if not kws:
        return None
    values = {k: evaluate(v, scope) for k, v in kws.items()}
    if any(v is UNRESOLVED for v in values.values()):
        return None
    bundle: dict[str, float] = {"CPU": default_cpu}
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
        v = values.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        bundle[name] = float(v)
    custom = values.get("resources")
    if custom is not None:
        extra = _as_resources(custom)
        if extra is None:
            return None
        bundle.update(extra)
    return bundle


def _ray_requests(tree: ast.Module, scopes: Scopes, file: str) -> list[RayResourceRequest]:
    out: list[RayResourceRequest] = []
    decorator_calls: set[ast.Call] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and _call_name(dec.func) == "remote":
                    decorator_calls.add(dec)
                    # Ray's defaults once resources are given: tasks 1 CPU, actors 0.
                    cpu = 0.0 if isinstance(node, ast.ClassDef) else 1.0
                    bundle = _remote_bundle(dec, scopes.at(dec), cpu)
                    if bundle is not None:
                        out.append(
                            RayResourceRequest(file, dec.lineno, "remote", node.name, (bundle,))
                        )
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node in decorator_calls:
            continue
        name = _call_name(node.func)
        scope = scopes.at(node)
        if name in ("remote", "options"):
            bundle = _remote_bundle(node, scope, 0.0)
            if bundle is not None:
                if bundle.get("CPU") == 0.0 and "num_cpus" not in {k.arg for k in node.keywords}:
                    del bundle["CPU"]  # unknown target: only what is written
                out.append(
                    RayResourceRequest(file, node.lineno, "remote", f"{name}(...)", (bundle,))
                )
        elif name == "placement_group" and node.args:
            raw = evaluate(node.args[0], scope)
            if not isinstance(raw, list) or not raw:
                continue
            bundles = [_as_resources(b) for b in raw]
            if any(b is None for b in bundles):
                continue
            strategy: Any = "PACK"
            if len(node.args) > 1:
                strategy = evaluate(node.args[1], scope)
            for kw in node.keywords:
                if kw.arg == "strategy":
                    strategy = evaluate(kw.value, scope)
            out.append(
                RayResourceRequest(
                    file,
                    node.lineno,
                    "placement_group",
                    "placement_group(...)",
                    tuple(b for b in bundles if b is not None),
                    strategy if isinstance(strategy, str) else None,
                )
            )
    return sorted(out, key=lambda r: r.line)


def _scaling_config_calls(tree: ast.Module) -> Iterable[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if name == "ScalingConfig":
                yield node
    return


#: Positional order of ray.train ScalingConfig (ray.air.config, a dataclass).
_SCALING_POSITIONAL = (
    "trainer_resources",
    "num_workers",
    "use_gpu",
    "resources_per_worker",
    "placement_strategy",
)


def _bind_scaling_args(call: ast.Call, constants: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name, node in zip(_SCALING_POSITIONAL, call.args, strict=False):
        args[name] = evaluate(node, constants)
    for kw in call.keywords:
        if kw.arg is not None:
            args[kw.arg] = evaluate(kw.value, constants)
    return args


def _scaling_arg_node(call: ast.Call, name: str) -> ast.expr | None:
    """The expression passed as ScalingConfig argument ``name`` (keyword or positional)."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if name in _SCALING_POSITIONAL:
        i = _SCALING_POSITIONAL.index(name)
        if i < len(call.args):
            return call.args[i]
    return None


def _env_read(
    node: ast.expr, constants: dict[str, Any], names: dict[str, tuple[str, str | None]]
) -> tuple[str, str | None] | None:
    """(variable, default) when ``node`` reads an env var: ``os.environ["N"]``,
    ``os.environ.get("N", d)``, ``os.getenv("N", d)``, wrapped in ``int(...)`` or not, or a
    name assigned from one of those (``names``)."""
    if isinstance(node, ast.Call) and _call_name(node.func) in ("int", "float") and node.args:
        return _env_read(node.args[0], constants, names)
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        var = evaluate(node.slice, constants)
        return (var, None) if isinstance(var, str) else None
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        getter = (
            isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value)
        ) or _call_name(func) == "getenv"
        if not getter:
            return None
        var = evaluate(node.args[0], constants)
        default: Any = evaluate(node.args[1], constants) if len(node.args) > 1 else None
        if not isinstance(var, str):
            return None
        shown = None if default is None or default is UNRESOLVED else str(default)
        return var, shown
    return None


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _env_assignments(
    tree: ast.Module, constants: dict[str, Any]
) -> dict[str, tuple[str, str | None]]:
    """Names assigned from an env var anywhere in the file (``n = int(os.getenv("N", 2))``)."""
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                found = _env_read(node.value, constants, {})
                if found is not None:
                    out[target.id] = found
    return out


def _train_v2_flag(tree: ast.Module, constants: dict[str, Any]) -> bool | None:
    """True/False when the file sets ``RAY_TRAIN_V2_ENABLED`` (os.environ[...] = / setdefault)."""
    flag: bool | None = None
    for node in ast.walk(tree):
        value: Any = UNRESOLVED
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and evaluate(target.slice, constants) == "RAY_TRAIN_V2_ENABLED"
                ):
                    value = evaluate(node.value, constants)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("setdefault", "putenv")
            and len(node.args) == 2
            and evaluate(node.args[0], constants) == "RAY_TRAIN_V2_ENABLED"
        ):
            value = evaluate(node.args[1], constants)
        if isinstance(value, str):
            flag = value.strip().lower() in ("1", "true", "yes")
    return flag


def _as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _as_bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _as_resources(v: Any) -> dict[str, float] | None:
    if not isinstance(v, dict):
        return None
    out: dict[str, float] = {}
    for k, amount in v.items():
        if not isinstance(k, str) or isinstance(amount, bool):
            return None
        if not isinstance(amount, int | float):
            return None
        out[k] = float(amount)
    return out
