"""Read doctor's inputs into an :class:`Inventory` (the thin I/O shell; rules stay pure).

Design note:
- Paths may be files or directories; directories are walked recursively for ``*.yaml``,
  ``*.yml`` and ``*.py``, in sorted order, so the inventory (and the report) is the same on
  every machine. Hidden directories (``.git``) are skipped.
- YAML is read with PyYAML's node API (``SafeLoader.get_node``) so each document keeps its start
  line and every key/item keeps its own line: findings point at ``file:line`` of the field.
- A document with ``kind`` is a :class:`Manifest` (``kind: List`` is expanded into its items);
  one without ``kind`` is a fleetserve fleet spec (has ``models``), or Helm values of a chart
  we recognise from its keys (HAMi, kuberay-operator); anything else is ignored.
- Python files are parsed with :mod:`ast` and never executed. ``ScalingConfig(...)`` calls are
  read when their arguments are literals or simple module-level constants (``CPUS = 4``);
  anything else stays ``None`` and rules do not guess.
What must stay true: unreadable input (missing file, bad YAML, bad Python syntax, invalid
fleet spec) raises :class:`InputFileError` naming the file and line (exit code 2).
"""

from __future__ import annotations

import ast
import operator
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from fleetserve.errors import FleetServeError, InputFileError
from fleetserve.k8s.doctor.inventory import (
    FleetSource,
    HelmChart,
    HelmValues,
    Inventory,
    Manifest,
    RayResourceRequest,
    ScalingConfigCall,
)
from fleetserve.spec import parse_spec

YAML_SUFFIXES = (".yaml", ".yml")
PY_SUFFIXES = (".py",)

#: Top-level keys only the HAMi chart's values have (v2.x).
_HAMI_KEYS = frozenset(
    {
        "devicePlugin",
        "resourceMem",
        "resourceCores",
        "resourceMemPercentage",
        "mockDevicePlugin",
        "mluResourceName",
        "dcuResourceName",
        "hamiScheduler",
    }
)
#: Top-level keys only the kuberay-operator chart's values have.
_KUBERAY_KEYS = frozenset(
    {
        "operatorCommand",
        "batchScheduler",
        "featureGates",
        "crNamespacedRbacEnable",
        "singleNamespaceInstall",
        "watchNamespace",
    }
)


#: The path that means "read YAML from standard input" (``helm template ... | doctor -``).
STDIN = "-"


def load_paths(paths: Sequence[str | Path], stdin: TextIO | None = None) -> Inventory:
    """Load every file under ``paths`` (files, directories, or ``-`` for stdin)."""
    builder = _Builder()
    for path in expand_paths(paths):
        if str(path) == STDIN:
            builder.add_yaml((stdin or sys.stdin).read(), "<stdin>")
        else:
            builder.add_file(path)
    return builder.build()


def is_helm_template(f: Path) -> bool:
    """A file under a Helm chart's ``templates/`` (Go templates, not YAML until rendered)."""
    parents = list(f.parents)
    return any(d.name == "templates" and (d.parent / "Chart.yaml").is_file() for d in parents)


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Files named directly, plus ``*.yaml|*.yml|*.py`` found recursively in directories.

    A directory walk skips hidden directories and Helm chart templates (``templates/`` next to
    a ``Chart.yaml``: run ``helm template`` and give doctor its output instead); a file named
    explicitly is always read.
    """
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if str(raw) == STDIN:
            out.append(p)
        elif p.is_dir():
            found = [
                f
                for f in p.rglob("*")
                if f.is_file()
                and f.suffix in YAML_SUFFIXES + PY_SUFFIXES
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
                and not is_helm_template(f)
            ]
            out.extend(sorted(found))
        elif p.is_file():
            out.append(p)
        else:
            raise InputFileError(f"{p}: no such file or directory")
    # A file named twice (directly and via its directory) is read once.
    seen: set[Path] = set()
    unique = []
    for f in out:
        key = f if str(f) == STDIN else f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def load_text(text: str, file: str = "<input>") -> Inventory:
    """Load one YAML text (tests and programmatic use)."""
    builder = _Builder()
    builder.add_yaml(text, file)
    return builder.build()


def load_python_text(text: str, file: str = "<input>.py") -> Inventory:
    """Load one Python source text (tests and programmatic use)."""
    builder = _Builder()
    builder.add_python(text, file)
    return builder.build()


@dataclass
class _Builder:
    manifests: list[Manifest] = field(default_factory=list)
    helm_values: list[HelmValues] = field(default_factory=list)
    scaling_configs: list[ScalingConfigCall] = field(default_factory=list)
    fleets: list[FleetSource] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    ray_requests: list[RayResourceRequest] = field(default_factory=list)

    def build(self) -> Inventory:
        return Inventory(
            manifests=tuple(self.manifests),
            helm_values=tuple(self.helm_values),
            scaling_configs=tuple(self.scaling_configs),
            fleets=tuple(self.fleets),
            skipped=tuple(self.skipped),
            ray_requests=tuple(self.ray_requests),
        )

    def add_file(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
        except OSError as e:
            raise InputFileError(f"{path}: cannot read ({e.strerror})") from e
        if path.suffix in PY_SUFFIXES:
            self.add_python(text, str(path))
        else:
            self.add_yaml(text, str(path))

    # -- YAML -------------------------------------------------------------------------------

    def add_yaml(self, text: str, file: str) -> None:
        for node, data in _yaml_documents(text, file):
            if data is None:
                continue
            line = node.start_mark.line + 1
            if not isinstance(data, dict):
                raise InputFileError(
                    f"{file}:{line}: expected a mapping (a Kubernetes object or values), "
                    f"got a {type(data).__name__}"
                )
            lines = _line_table(node)
            if "kind" in data:
                self._add_object(data, node, file, line)
            elif "models" in data:
                self._add_fleet(data, file, line)
            else:
                chart = _detect_chart(data)
                if chart != "unknown":
                    self.helm_values.append(HelmValues(chart, data, file, line, lines))
                else:
                    self.skipped.append(f"{file}:{line}")

    def _add_object(
        self,
        data: dict[str, Any],
        node: yaml.Node,
        file: str,
        line: int,
    ) -> None:
        kind = data.get("kind")
        if not isinstance(kind, str) or not kind:
            raise InputFileError(f"{file}:{line}: 'kind' must be a non-empty string")
        if kind == "List" or (kind.endswith("List") and isinstance(data.get("items"), list)):
            items = data.get("items") or []
            item_nodes = _child(node, "items")
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    continue
                item_node = (
                    item_nodes.value[i] if isinstance(item_nodes, yaml.SequenceNode) else node
                )
                item_line = item_node.start_mark.line + 1
                self._add_object(item, item_node, file, item_line)
            return
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        name = meta.get("name")
        namespace = meta.get("namespace")
        self.manifests.append(
            Manifest(
                api_version=str(data.get("apiVersion", "")),
                kind=kind,
                name=str(name) if name is not None else "",
                namespace=str(namespace) if namespace else "default",
                body=data,
                file=file,
                line=line,
                lines=_line_table(node),
            )
        )

    def _add_fleet(self, data: dict[str, Any], file: str, line: int) -> None:
        try:
            spec = parse_spec(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputFileError(
                f"{file}:{line}: fleet spec invalid at {where}: {first['msg']}"
            ) from e
        except FleetServeError as e:
            raise InputFileError(f"{file}:{line}: fleet spec invalid: {e.message}") from e
        self.fleets.append(FleetSource(spec=spec, file=file))

    # -- Python -----------------------------------------------------------------------------

    def add_python(self, text: str, file: str) -> None:
        try:
            tree = ast.parse(text, filename=file)
        except SyntaxError as e:
            raise InputFileError(f"{file}:{e.lineno}: Python syntax error: {e.msg}") from e
        constants = _module_constants(tree)
        v2 = _train_v2_flag(tree, constants)
        scopes = _Scopes(tree, constants)
        env_names = _env_assignments(tree, constants)
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
                if v is _UNRESOLVED or (k in fields and v is not None and fields[k] is None)
            )
            self.scaling_configs.append(
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
        self.ray_requests.extend(_ray_requests(tree, scopes, file))


# -- YAML helpers ---------------------------------------------------------------------------


#: libyaml's parser when available (same nodes and marks, much faster on large files).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml_documents(text: str, file: str) -> Iterator[tuple[yaml.Node, Any]]:
    loader = _LOADER(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            yield node, loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = e.problem or e.context or "invalid YAML"
        raise InputFileError(f"{file}:{line}: invalid YAML: {problem}") from e
    except yaml.YAMLError as e:
        raise InputFileError(f"{file}: invalid YAML: {e}") from e
    finally:
        loader.dispose()


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key and isinstance(v, yaml.Node):
                return v
    return None


def _line_table(node: yaml.Node) -> dict[str, int]:
    """Field path -> 1-based line for every key and item under ``node``."""
    table: dict[str, int] = {}

    def walk(n: yaml.Node, path: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
                sub = f"{path}.{key}" if path else key
                table.setdefault(sub, k.start_mark.line + 1)
                walk(v, sub)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                sub = f"{path}[{i}]"
                table.setdefault(sub, item.start_mark.line + 1)
                walk(item, sub)

    walk(node, "")
    return table


def _detect_chart(data: dict[str, Any]) -> HelmChart:
    keys = set(data)
    scheduler = data.get("scheduler")
    if keys & _HAMI_KEYS or (
        isinstance(scheduler, dict) and ("kubeScheduler" in scheduler or "extender" in scheduler)
    ):
        return "hami"
    if keys & _KUBERAY_KEYS:
        return "kuberay-operator"
    return "unknown"


# -- Python helpers -------------------------------------------------------------------------

_UNRESOLVED = object()

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def _eval(node: ast.AST | None, constants: dict[str, Any]) -> Any:
    """Literal value of ``node``, resolving module-level constant names; else _UNRESOLVED."""
    if node is None:
        return _UNRESOLVED
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id, _UNRESOLVED)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        val = _eval(node.operand, constants)
        if isinstance(val, int | float) and not isinstance(val, bool):
            return -val if isinstance(node.op, ast.USub) else val
        return _UNRESOLVED
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, constants), _eval(node.right, constants)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))
        if isinstance(node.op, ast.Pow) and numbers and abs(right) > 64:
            return _UNRESOLVED  # bytes are 1024**3, not 10**100000: refuse huge powers
        if numbers:
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError:
                return _UNRESOLVED
        return _UNRESOLVED
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:  # {**other}
                return _UNRESOLVED
            key, val = _eval(k, constants), _eval(v, constants)
            if key is _UNRESOLVED or val is _UNRESOLVED:
                return _UNRESOLVED
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
                return _UNRESOLVED
            val = _eval(kw.value, constants)
            if val is _UNRESOLVED:
                return _UNRESOLVED
            out[kw.arg] = val
        return out
    if isinstance(node, ast.List | ast.Tuple):
        items = [_eval(e, constants) for e in node.elts]
        if any(i is _UNRESOLVED for i in items):
            return _UNRESOLVED
        return items if isinstance(node, ast.List) else tuple(items)
    return _UNRESOLVED


def _module_constants(tree: ast.Module) -> dict[str, Any]:
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
                val = _eval(value, constants)
                if val is _UNRESOLVED:
                    constants.pop(target.id, None)
                else:
                    constants[target.id] = val
    return constants


class _Scopes:
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
                    val = _eval(value, scope)
                    if val is _UNRESOLVED:
                        scope.pop(target.id, None)
                    else:
                        scope[target.id] = val
        return scope


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
    values = {k: _eval(v, scope) for k, v in kws.items()}
    if any(v is _UNRESOLVED for v in values.values()):
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


def _ray_requests(tree: ast.Module, scopes: _Scopes, file: str) -> list[RayResourceRequest]:
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
            raw = _eval(node.args[0], scope)
            if not isinstance(raw, list) or not raw:
                continue
            bundles = [_as_resources(b) for b in raw]
            if any(b is None for b in bundles):
                continue
            strategy: Any = "PACK"
            if len(node.args) > 1:
                strategy = _eval(node.args[1], scope)
            for kw in node.keywords:
                if kw.arg == "strategy":
                    strategy = _eval(kw.value, scope)
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
        args[name] = _eval(node, constants)
    for kw in call.keywords:
        if kw.arg is not None:
            args[kw.arg] = _eval(kw.value, constants)
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
        var = _eval(node.slice, constants)
        return (var, None) if isinstance(var, str) else None
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        getter = (
            isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value)
        ) or _call_name(func) == "getenv"
        if not getter:
            return None
        var = _eval(node.args[0], constants)
        default: Any = _eval(node.args[1], constants) if len(node.args) > 1 else None
        if not isinstance(var, str):
            return None
        shown = None if default is None or default is _UNRESOLVED else str(default)
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
        value: Any = _UNRESOLVED
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and _eval(target.slice, constants) == "RAY_TRAIN_V2_ENABLED"
                ):
                    value = _eval(node.value, constants)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("setdefault", "putenv")
            and len(node.args) == 2
            and _eval(node.args[0], constants) == "RAY_TRAIN_V2_ENABLED"
        ):
            value = _eval(node.args[1], constants)
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
