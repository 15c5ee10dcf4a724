"""What doctor reads: every object from the input files, as plain data with source positions.

The loader (``loader.py``) builds an :class:`Inventory`; rules only read it. What must stay
true: every item knows its file and 1-based line, so each finding points at the source;
``Manifest.ref`` is the ``Kind/namespace/name`` used in reports ("default" when the document
has no namespace); nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import yaml

from fleetserve.spec import FleetSpec

HelmChart = Literal[
    "hami",
    "kuberay-operator",
    "ingress-nginx",
    "kube-prometheus-stack",
    "vllm-production-stack",
    "kubeai",
    "kubeai-models",
    "unknown",
]

#: Annotation that silences doctor rules on one object: a comma-separated list of rule ids
#: (for a finding that is intended, e.g. ``advertised-vs-limit``). Kubernetes ignores it.
IGNORE_ANNOTATION = "doctor.fleetserve.io/ignore"


@dataclass(frozen=True, eq=False)
class Manifest:
    """One YAML document with a ``kind`` (a Kubernetes object)."""

    #: ``apiVersion`` as written ("" when absent).
    api_version: str
    #: ``kind``, e.g. ``RayService``.
    kind: str
    #: ``metadata.name`` ("" when absent).
    name: str
    #: ``metadata.namespace``, ``"default"`` when absent.
    namespace: str
    #: The whole document.
    body: dict[str, Any]
    #: Source file, as given on the command line (or a label for in-memory input).
    file: str
    #: 1-based line where the document starts.
    line: int
    #: Field path -> 1-based line, for every mapping key and sequence item in the document
    #: (filled by the loader from YAML node marks; may be empty for synthetic manifests).
    lines: Mapping[str, int] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        """``Kind/namespace/name``; ``Kind/namespace/<generateName>*`` for an object named by
        the API server from ``metadata.generateName`` (``kubectl create`` of a RayJob)."""
        if not self.name and self.generate_name:
            return f"{self.kind}/{self.namespace}/{self.generate_name}*"
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def generate_name(self) -> str:
        """``metadata.generateName`` ("" when absent)."""
        meta = self.body.get("metadata")
        value = meta.get("generateName") if isinstance(meta, dict) else None
        return str(value) if isinstance(value, str) else ""

    @property
    def name_is_template(self) -> bool:
        """The name is filled in later (``${JOB_ID}``, ``$NAMESPACE``, Helm ``{{ }}``), so it is
        not the name the object will have: rules must not judge its length or spelling."""
        return is_template(self.name)

    def line_of(self, path: str) -> int:
        """Best-effort line of ``path``: the nearest recorded ancestor, else the document start.

        ``outer:inner`` addresses a field inside a YAML document embedded as a string (e.g.
        ``spec.serveConfigV2:applications[0].deployments[1]``); its line is found inside the
        block scalar, which starts on the line after its key.
        """
        outer, sep, inner = path.partition(":")
        base = _nearest(self.lines, outer, self.line)
        if sep:
            raw = get_path(self.body, outer)
            if isinstance(raw, str):
                inside = _nearest(_embedded_lines(raw), inner, -1)
                if inside >= 0:
                    return base + 1 + inside
        return base

    def get(self, path: str, default: Any = None) -> Any:
        """Value at a dotted field path (``a.b[0].c``), or ``default`` when any step is missing."""
        return get_path(self.body, path, default)

    @property
    def ignored_rules(self) -> frozenset[str]:
        """Rule ids silenced on this object by the annotation ``IGNORE_ANNOTATION``."""
        meta = self.body.get("metadata")
        ann = meta.get("annotations") if isinstance(meta, dict) else None
        raw = ann.get(IGNORE_ANNOTATION) if isinstance(ann, dict) else None
        if not isinstance(raw, str):
            return frozenset()
        return frozenset(r.strip() for r in raw.split(",") if r.strip())


_TEMPLATE = re.compile(r"\$\{|\$\(|\{\{|\$[A-Za-z_]|<[A-Za-z_-]+>")


def is_template(text: str) -> bool:
    """Whether ``text`` holds a placeholder another tool substitutes: ``${VAR}``, ``$(VAR)``,
    ``$VAR`` (envsubst, kustomize), ``{{ .Values.x }}`` (Helm), ``<name>`` (docs)."""
    return bool(_TEMPLATE.search(text))


@dataclass(frozen=True, eq=False)
class HelmValues:
    """A Helm values document (no ``kind``), e.g. the HAMi chart's values.yaml."""

    #: Which chart the keys look like: "hami" | "kuberay-operator" | "unknown".
    chart: HelmChart
    #: The whole document.
    body: dict[str, Any]
    #: Source file.
    file: str
    #: 1-based line where the document starts.
    line: int
    #: Field path -> 1-based line (as for :class:`Manifest`).
    lines: Mapping[str, int] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        """``HelmValues/<file>``."""
        return f"HelmValues/{self.file}"

    def line_of(self, path: str) -> int:
        """Best-effort line of ``path`` (nearest recorded ancestor, else the document start)."""
        return _nearest(self.lines, path, self.line)

    def get(self, path: str, default: Any = None) -> Any:
        """Value at a dotted field path, or ``default``."""
        return get_path(self.body, path, default)


@dataclass(frozen=True)
class ScalingConfigCall:
    """A Ray Train ``ScalingConfig(...)`` call read statically from a Python file's AST.

    ``None`` means "not given or not a literal we could resolve" (rules then use Ray's default
    or stay silent; they never guess).
    """

    #: Source file.
    file: str
    #: 1-based line of the call.
    line: int
    #: ``num_workers``.
    num_workers: int | None
    #: ``use_gpu``.
    use_gpu: bool | None
    #: ``resources_per_worker`` (e.g. ``{"CPU": 4, "GPU": 1}``).
    resources_per_worker: dict[str, float] | None
    #: ``trainer_resources`` (Ray Train v1 default ``{"CPU": 1}`` when not given).
    trainer_resources: dict[str, float] | None
    #: ``placement_strategy`` (default "PACK").
    placement_strategy: str | None
    #: True when the file enables Ray Train v2 (``RAY_TRAIN_V2_ENABLED=1``), whose rank-0 bundle
    #: carries no trainer resources; None when not seen.
    train_v2: bool | None = None
    #: Arguments that were given but could not be resolved statically (e.g. computed at run
    #: time); their fields above are None and rules must not assume Ray's default for them.
    unresolved: tuple[str, ...] = ()
    #: ``num_workers`` read from an environment variable (``int(os.environ["N"])``,
    #: ``os.getenv("N", "2")``): (variable, the script's default or None). The manifest that
    #: runs the script may set it (RayJob runtime env, pod env); rules look it up there.
    num_workers_env: tuple[str, str | None] | None = None

    @property
    def ref(self) -> str:
        """``ScalingConfig/<file>:<line>``."""
        return f"ScalingConfig/{self.file}:{self.line}"

    def line_of(self, path: str) -> int:
        """The call's line, whatever argument ``path`` names."""
        return self.line


@dataclass(frozen=True)
class RayResourceRequest:
    """A Ray task/actor resource request or placement group read statically from Python.

    Sources: ``@ray.remote(num_cpus=..., num_gpus=..., memory=..., resources={...})``,
    ``.options(...)`` with those keywords, and ``placement_group([...], strategy=...)``.
    """

    #: Source file.
    file: str
    #: 1-based line of the decorator or call.
    line: int
    #: "remote" (a task or actor) or "placement_group".
    kind: Literal["remote", "placement_group"]
    #: Function/class name for ``@ray.remote``; the call text otherwise.
    name: str
    #: One entry per bundle (a remote request is one bundle): ``{"CPU": 2, "GPU": 1}``.
    bundles: tuple[dict[str, float], ...]
    #: Placement group strategy ("PACK" default); None for remote requests.
    strategy: str | None = None

    @property
    def ref(self) -> str:
        """``RayRemote/<file>:<line>`` or ``PlacementGroup/<file>:<line>``."""
        prefix = "PlacementGroup" if self.kind == "placement_group" else "RayRemote"
        return f"{prefix}/{self.file}:{self.line}"

    def line_of(self, path: str) -> int:
        """The call's line, whatever ``path`` names."""
        return self.line


#: What kind of input problem a file has: an unrendered template (Helm, Jinja), YAML that does
#: not parse, a document that is no object, Python that does not parse, bytes that are not
#: UTF-8, a file the OS will not let us read, or a fleet spec that fleetserve refuses.
ProblemKind = Literal["template", "yaml", "document", "python", "encoding", "file", "fleet-spec"]


@dataclass(frozen=True)
class InputProblem:
    """A file (or one of its documents) doctor could not read: reported as a finding about the
    file, never an abort, so one bad file cannot hide the findings of every other one."""

    #: Source file.
    file: str
    #: 1-based line of the problem (the parser's mark; 1 when the whole file is concerned).
    line: int
    kind: ProblemKind
    #: What is wrong, from the parser or validator (``did not find expected key``).
    detail: str
    #: Field path inside the document, when the problem is about one field (fleet specs).
    field: str = ""
    #: For a template: the first placeholder found (``{{ .Release.Name }}``) and its line.
    placeholder: str = ""
    placeholder_line: int = 0

    @property
    def ref(self) -> str:
        """``File/<file>``: the report's name for a file that could not be read as objects."""
        return f"File/{self.file}"

    def line_of(self, path: str) -> int:
        """The problem's line, whatever ``path`` names."""
        return self.line


@dataclass(frozen=True, eq=False)
class FleetSource:
    """A fleetserve fleet spec found among the inputs (it describes node pools)."""

    spec: FleetSpec
    file: str


@dataclass(frozen=True, eq=False)
class Inventory:
    """Everything doctor read, in input order (files sorted, documents in file order)."""

    manifests: tuple[Manifest, ...] = ()
    helm_values: tuple[HelmValues, ...] = ()
    scaling_configs: tuple[ScalingConfigCall, ...] = ()
    #: Fleet specs among the inputs (their pools count as node pools for scheduling rules).
    fleets: tuple[FleetSource, ...] = ()
    #: ``file:line`` of documents that are none of the above (no kind, unknown values).
    skipped: tuple[str, ...] = ()
    #: Ray task/actor/placement-group requests read from Python files.
    ray_requests: tuple[RayResourceRequest, ...] = ()
    #: Files (or documents) that could not be read: each becomes a finding, never an abort.
    problems: tuple[InputProblem, ...] = ()
    #: Documents a kustomization applies as patches: partial objects that complete a base, so
    #: neither schemas nor rules judge them alone (``kustomize build`` output is checkable).
    patches: tuple[Manifest, ...] = ()

    def of_kind(self, *kinds: str) -> list[Manifest]:
        """Manifests whose ``kind`` is one of ``kinds``, in input order."""
        wanted = set(kinds)
        return [m for m in self.manifests if m.kind in wanted]

    def charts(self, chart: HelmChart) -> list[HelmValues]:
        """Helm values documents detected as ``chart``."""
        return [h for h in self.helm_values if h.chart == chart]


def _nearest(lines: Mapping[str, int], path: str, default: int) -> int:
    """Line of ``path`` or of its nearest recorded ancestor."""
    probe = path
    while probe:
        if probe in lines:
            return lines[probe]
        cut = max(probe.rfind("."), probe.rfind("["))
        if cut <= 0:
            break
        probe = probe[:cut]
    return lines.get(probe, default)


@lru_cache(maxsize=128)
def _embedded_lines(text: str) -> dict[str, int]:
    """Field path -> 0-based line inside an embedded YAML document ({} when unparseable)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[str, int] = {}

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = f"{path}.{key.value}" if path else str(key.value)
                out.setdefault(sub, key.start_mark.line)
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = f"{path}[{i}]"
                out.setdefault(sub, item.start_mark.line)
                walk(item, sub)

    if root is not None:
        walk(root, "")
    return out


def get_path(body: Any, path: str, default: Any = None) -> Any:
    """Walk ``a.b[0].c`` through dicts and lists; ``default`` when a step is missing.

    Keys containing dots cannot be addressed (annotations are read directly by rules).
    """
    node = body
    for part in split_path(path):
        if isinstance(part, int):
            if not isinstance(node, list) or not -len(node) <= part < len(node):
                return default
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
    return node


def split_path(path: str) -> list[str | int]:
    """``"a.b[0].c"`` -> ``["a", "b", 0, "c"]``."""
    out: list[str | int] = []
    for chunk in path.split(".") if path else []:
        name, _, rest = chunk.partition("[")
        if name:
            out.append(name)
        while rest:
            idx, _, rest = rest.partition("]")
            out.append(int(idx))
            rest = rest.removeprefix("[")
    return out
