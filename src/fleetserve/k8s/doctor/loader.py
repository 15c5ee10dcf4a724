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
What must stay true: a file that cannot be read (bad YAML, an unrendered Helm/Jinja template,
bad Python syntax, bytes that are not UTF-8, an invalid fleet spec) becomes an
:class:`InputProblem` of the inventory, naming the file and line, and the walk goes on: one
bad file never hides the findings of the others (the ``input-unreadable`` and
``unrendered-template`` rules report them). Only a path that does not exist raises
:class:`InputFileError` (bad usage, exit code 2).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import yaml
from pydantic import ValidationError

from fleetserve.errors import FleetServeError, InputFileError
from fleetserve.inputfile import field_path
from fleetserve.k8s.doctor.inventory import (
    FleetSource,
    HelmChart,
    HelmValues,
    InputProblem,
    Inventory,
    Manifest,
    RayResourceRequest,
    ScalingConfigCall,
)
from fleetserve.k8s.doctor.python_calls import read_python
from fleetserve.spec import FleetSpec, parse_spec

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


#: Top-level keys of a fleet spec (the spec model's own fields: one source of truth).
_FLEET_KEYS = frozenset(FleetSpec.model_fields)

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
    problems: list[InputProblem] = field(default_factory=list)
    #: (directory, body) of every kustomization file read.
    kustomizations: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)

    def build(self) -> Inventory:
        patch_files = _kustomize_patches(self.kustomizations)
        patches = [m for m in self.manifests if _resolved(m.file) in patch_files]
        return Inventory(
            manifests=tuple(m for m in self.manifests if _resolved(m.file) not in patch_files),
            patches=tuple(patches),
            helm_values=tuple(self.helm_values),
            scaling_configs=tuple(self.scaling_configs),
            fleets=tuple(self.fleets),
            skipped=tuple(self.skipped),
            ray_requests=tuple(self.ray_requests),
            problems=tuple(self.problems),
        )

    def add_file(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            self.problems.append(
                InputProblem(
                    str(path), 1, "encoding", f"not UTF-8 text ({e.reason} at byte {e.start})"
                )
            )
            return
        except OSError as e:  # permissions, a file removed during the walk
            self.problems.append(InputProblem(str(path), 1, "file", f"cannot read ({e.strerror})"))
            return
        if path.suffix in PY_SUFFIXES:
            self.add_python(text, str(path))
        else:
            self.add_yaml(text, str(path))

    # -- YAML -------------------------------------------------------------------------------

    def add_yaml(self, text: str, file: str) -> None:
        try:
            documents = list(_yaml_documents(text, file))
        except _Unparsable as e:
            # The whole file is left out (its documents before the error may be fragments of
            # a template), and said so once: nothing in it is judged.
            self.problems.append(_unparsable(text, file, "yaml", e.line, e.detail))
            return
        for index, (node, data) in enumerate(documents):
            if data is None:
                continue
            line = node.start_mark.line + 1
            if isinstance(data, dict) and Path(file).name in _KUSTOMIZATION_FILES:
                self.kustomizations.append((Path(file).parent, data))
            if not isinstance(data, dict):
                # A list or a scalar (an Ansible playbook, a values fragment) is no Kubernetes
                # object and no values doctor knows: skipped like unknown values, and noted.
                self.skipped.append(f"{file}:{line}")
                continue
            if "kind" in data:
                self._add_object(data, node, file, line, index)
            elif "models" in data and set(data) <= _FLEET_KEYS:
                # Only a document made of fleet-spec keys is a fleet spec: KubeAI's values also
                # have `models`, beside keys fleetserve does not know.
                self._add_fleet(data, file, line)
            else:
                chart = _detect_chart(data)
                if chart != "unknown":
                    self.helm_values.append(HelmValues(chart, data, file, line, _line_table(node)))
                else:
                    self.skipped.append(f"{file}:{line}")

    def _add_object(
        self,
        data: dict[str, Any],
        node: yaml.Node,
        file: str,
        line: int,
        index: int,
    ) -> None:
        kind = data.get("kind")
        if not isinstance(kind, str) or not kind:
            self.problems.append(
                InputProblem(
                    file,
                    line,
                    "document",
                    f"document {index + 1}: 'kind' must be a non-empty string, got {kind!r}",
                    "kind",
                )
            )
            return
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
                self._add_object(item, item_node, file, item_line, index)
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
            where = field_path(tuple(first["loc"]))
            self.problems.append(
                InputProblem(file, line, "fleet-spec", f"fleet spec invalid: {first['msg']}", where)
            )
            return
        except FleetServeError as e:
            self.problems.append(
                InputProblem(file, line, "fleet-spec", f"fleet spec invalid: {e.message}")
            )
            return
        self.fleets.append(FleetSource(spec=spec, file=file))

    # -- Python -----------------------------------------------------------------------------

    def add_python(self, text: str, file: str) -> None:
        try:
            tree = ast.parse(text, filename=file)
        except SyntaxError as e:
            detail = f"Python syntax error: {e.msg}"
            self.problems.append(_unparsable(text, file, "python", e.lineno or 1, detail))
            return
        calls, requests = read_python(tree, file)
        self.scaling_configs.extend(calls)
        self.ray_requests.extend(requests)


#: The names kustomize reads a kustomization from.
_KUSTOMIZATION_FILES = frozenset({"kustomization.yaml", "kustomization.yml", "Kustomization"})


def _resolved(file: str) -> Path | None:
    return None if file == "<stdin>" else Path(file).resolve()


def _kustomize_patches(kustomizations: list[tuple[Path, dict[str, Any]]]) -> set[Path | None]:
    """Files the kustomizations apply as patches (``patches[].path``, ``patchesStrategicMerge``,
    ``patchesJson6902[].path``), plus the files of a ``patches/`` folder beside one: the
    kubebuilder layout keeps its optional patches there, referenced only in comments until
    enabled. A patch is a partial object (a Deployment without its selector, a CRD with only an
    annotation), so judging it alone reports fields its base has."""
    out: set[Path | None] = set()
    for folder, body in kustomizations:
        refs: list[Any] = []
        for key in ("patches", "patchesJson6902"):
            items = body.get(key)
            if isinstance(items, list):
                refs.extend(i.get("path") for i in items if isinstance(i, dict))
        merge = body.get("patchesStrategicMerge")
        if isinstance(merge, list):
            refs.extend(merge)
        for ref in refs:
            if isinstance(ref, str) and "\n" not in ref:  # an inline patch is not a file
                out.add((folder / ref).resolve())
        beside = folder / "patches"
        if beside.is_dir():
            out.update(f.resolve() for f in beside.iterdir() if f.suffix in YAML_SUFFIXES)
    return out


# -- YAML helpers ---------------------------------------------------------------------------


#: libyaml's parser when available (same nodes and marks, much faster on large files).
_BASE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LOADER(_BASE_LOADER):  # type: ignore[valid-type,misc]
    """The safe loader, plus: a node with a tag it has no constructor for (mkdocs'
    ``!!python/name:``, CloudFormation's ``!Ref``, GitLab's ``!reference``) is read as the plain
    mapping, list or string it is. Such files are valid YAML; refusing them would report a
    false "unreadable" error, and nothing doctor judges lives behind those tags."""


def _untagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_LOADER.add_constructor(None, _untagged)


class _Unparsable(Exception):
    """YAML that does not parse (internal to the loader: it becomes an InputProblem)."""

    def __init__(self, line: int, detail: str) -> None:
        super().__init__(detail)
        self.line = line
        self.detail = detail


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
        line = mark.line + 1 if mark is not None else 1
        raise _Unparsable(line, f"invalid YAML: {e.problem or e.context or 'unknown error'}") from e
    except yaml.YAMLError as e:
        raise _Unparsable(1, f"invalid YAML: {e}") from e
    except RecursionError as e:  # a pathological nesting depth (YAML bombs, fuzzers)
        raise _Unparsable(1, "invalid YAML: nested too deeply to read") from e
    finally:
        loader.dispose()


#: Placeholders of the template languages people keep manifests in: Helm/Go templates and
#: Jinja (``{{ }}``, ``{% %}``), envsubst (``${VAR}``) and Terraform's ``templatefile``
#: (``${var.x}``, ``%{ if x ~}``: data-on-eks' helm-values). A file that does not parse AND holds
#: one is an unrendered template, not broken YAML.
_PLACEHOLDER = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|[$%]\{[^}\n]*\}")


def _unparsable(
    text: str, file: str, language: Literal["yaml", "python"], line: int, detail: str
) -> InputProblem:
    """The problem of a file that does not parse: an unrendered template when it holds a
    placeholder (the first one is quoted, with its line), else unreadable YAML or Python."""
    # A placeholder inside a comment (`## {{ .Values.x }}` in chart docs) proves nothing.
    found = next(
        (
            m
            for m in _PLACEHOLDER.finditer(text)
            if "#" not in text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
        ),
        None,
    )
    if found is None:
        return InputProblem(file, line, language, detail)
    at = text.count("\n", 0, found.start()) + 1
    shown = found.group(0) if len(found.group(0)) <= 60 else found.group(0)[:57] + "..."
    return InputProblem(file, line, "template", detail, placeholder=shown, placeholder_line=at)


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
    prometheus = data.get("prometheus")
    if isinstance(prometheus, dict) and isinstance(prometheus.get("prometheusSpec"), dict):
        return "kube-prometheus-stack"  # the chart's own block for its Prometheus CR
    serving = data.get("servingEngineSpec")
    if isinstance(serving, dict) and "modelSpec" in serving:
        return "vllm-production-stack"  # vllm-project/production-stack's helm/values.yaml
    if isinstance(data.get("resourceProfiles"), dict) and isinstance(
        data.get("modelServers"), dict
    ):
        return "kubeai"  # substratusai/kubeai charts/kubeai/values.yaml
    catalog = data.get("catalog")
    if isinstance(catalog, dict) and any(
        isinstance(m, dict) and "engine" in m and "url" in m for m in catalog.values()
    ):
        return "kubeai-models"  # substratusai/kubeai charts/models/values.yaml
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
