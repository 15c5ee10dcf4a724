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
- Python files are parsed with :mod:`ast` and never executed; :mod:`.python_calls` reads their
  Ray requests (``ScalingConfig(...)`` and friends) through the static evaluator
  (:mod:`.static_eval`): literals and constants only, anything else stays ``None`` and rules
  do not guess.
What must stay true: unreadable input (missing file, bad YAML, bad Python syntax, invalid
fleet spec) raises :class:`InputFileError` naming the file and line (exit code 2).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
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
from fleetserve.k8s.doctor.python_calls import read_python
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
        calls, requests = read_python(tree, file)
        self.scaling_configs.extend(calls)
        self.ray_requests.extend(requests)


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
    if _is_ingress_nginx(data.get("controller")):
        return "ingress-nginx"
    return "unknown"


def _is_ingress_nginx(controller: Any) -> bool:
    """The ingress-nginx chart's ``controller`` block, told apart from the many charts that
    also have a ``controller`` key (Karpenter, Argo...) by keys only ingress-nginx has."""
    if not isinstance(controller, dict):
        return False
    service = controller.get("service")
    return bool(
        {"ingressClassResource", "admissionWebhooks", "publishService"} & set(controller)
        or (isinstance(service, dict) and "targetPorts" in service)
    )
