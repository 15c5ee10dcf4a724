"""Schema validation: what the API server would refuse at ``kubectl apply``.

Design note:
- Custom resources (RayService, RayCluster, RayJob, ServiceMonitor, PodMonitor,
  PrometheusRule...) are checked against the OpenAPI v3 schema of their CRD: the schemas
  ``crds.py`` finds (cache, upstream release, cluster or ``--crds DIR``) and any
  CustomResourceDefinition among the inputs. The walker follows the API server's
  structural-schema rules: ``type``, ``nullable`` (a null in a non-nullable field is pruned,
  not an error), ``enum``, ``required``, ``pattern``, length/size/range limits,
  ``x-kubernetes-int-or-string``, ``x-kubernetes-preserve-unknown-fields``,
  ``x-kubernetes-embedded-resource``, list-type map/set uniqueness, and unknown fields (what
  ``kubectl apply --validate=strict``, the default, rejects). ``x-kubernetes-validations`` CEL
  rules are evaluated with cel-python with ``self`` bound; transition rules (those using
  ``oldSelf``) only run on update and are skipped, as the API server does on create. A rule
  that uses a Kubernetes CEL extension cel-python lacks is skipped, never guessed.
- Core kinds (Service, Secret, Deployment, NetworkPolicy, ConfigMap...) are checked with the
  ``kubernetes-validate`` package's offline JSON schemas (strict: unknown fields rejected) for
  the chosen Kubernetes version.
What must stay true: every violation is a Finding with rule "schema", severity error, the
field path and its line; a kind with no known schema is skipped (doctor cannot know it), and
validators are pure over the manifest (schemas are loaded once and cached).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import celpy
import jsonschema  # type: ignore[import-untyped]
import yaml
from celpy.adapter import json_to_cel
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

from fleetserve.errors import InputFileError, UsageError
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory, Manifest, is_template

_MAX_ERRORS_PER_OBJECT = 50
#: libyaml's loader when PyYAML was built with it (CRDs are tens of thousands of lines).
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SchemaValidator(Protocol):
    """Validates one manifest; returns None when it has no schema for the manifest's kind."""

    def validate(self, m: Manifest) -> list[Finding] | None: ...


def _finding(m: Manifest, path: str, message: str, fix: str) -> Finding:
    return Finding("schema", "error", m.ref, path, message, fix, m.file, m.line_of(path))


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


# --------------------------------------------------------------------------------------------
# CRD (OpenAPI v3 structural schema + CEL)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrdVersion:
    """One version of one CRD."""

    crd: str  # CRD name, e.g. rayservices.ray.io
    group: str
    version: str
    kind: str
    served: bool
    schema: dict[str, Any]


@dataclass
class CrdSchemas:
    """CRD schemas by (group, kind) -> version -> schema."""

    versions: dict[tuple[str, str], dict[str, CrdVersion]] = field(default_factory=dict)
    #: (group, kind, version) -> other schemas the input's own CRDs give the same version. A
    #: repository often carries a generated install bundle older than its CRD bases
    #: (vllm-project/production-stack: operator/config/default.yaml beside crd/bases/): an
    #: object one of them accepts is no schema error.
    alternatives: dict[tuple[str, str, str], list[CrdVersion]] = field(default_factory=dict)

    def add_crd(self, body: dict[str, Any], *, keep_previous: bool = False) -> None:
        """Register every version of one CustomResourceDefinition object; with
        ``keep_previous``, a different schema already registered for a version stays as an
        alternative instead of being replaced."""
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else None
        if spec is None:
            return
        group = str(spec.get("group", ""))
        names = spec.get("names") if isinstance(spec.get("names"), dict) else {}
        kind = str(names.get("kind", "")) if isinstance(names, dict) else ""
        name = str((body.get("metadata") or {}).get("name", f"{kind}.{group}"))
        for v in spec.get("versions") or []:
            if not isinstance(v, dict):
                continue
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if not isinstance(schema, dict):
                continue
            entry = CrdVersion(name, group, str(v.get("name")), kind, v.get("served", True), schema)
            by_version = self.versions.setdefault((group, kind), {})
            previous = by_version.get(entry.version)
            if keep_previous and previous is not None and previous.schema != schema:
                self.alternatives.setdefault((group, kind, entry.version), []).append(previous)
            by_version[entry.version] = entry

    @classmethod
    def from_dir(
        cls, directory: str | Path, wanted: set[tuple[str, str]] | None = None
    ) -> CrdSchemas:
        """Load the CRDs in ``directory`` (``*.yaml``/``*.yml``, multi-document).

        With ``wanted`` ((group, kind) pairs), a file whose header names another kind is not
        parsed in full: CRDs run to tens of thousands of lines and most runs need one or two.
        """
        root = Path(directory)
        if not root.is_dir():
            raise InputFileError(f"{root}: --crds must be a directory of CRD YAML files")
        out = cls()
        for f in sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml")):
            stat = f.stat()
            header = _crd_header(str(f), stat.st_mtime_ns, stat.st_size)
            if wanted is not None and header is not None and header not in wanted:
                continue
            for doc in _crd_documents(str(f), stat.st_mtime_ns, stat.st_size):
                out.add_crd(doc)
        return out

    def add_file(self, path: str | Path) -> None:
        """Register every CRD in one YAML file (parsed once per file version, then cached)."""
        stat = Path(path).stat()
        for doc in _crd_documents(str(path), stat.st_mtime_ns, stat.st_size):
            self.add_crd(doc)

    def copy(self) -> CrdSchemas:
        """A copy that can take more CRDs without changing this one."""
        return CrdSchemas(
            {k: dict(v) for k, v in self.versions.items()},
            {k: list(v) for k, v in self.alternatives.items()},
        )

    def lookup(self, api_version: str, kind: str) -> tuple[CrdVersion | None, list[str]]:
        """(schema for apiVersion/kind or None, the versions the CRD serves)."""
        group, _, version = api_version.rpartition("/")
        by_version = self.versions.get((group, kind))
        if not by_version:
            return None, []
        served = sorted(v for v, e in by_version.items() if e.served)
        entry = by_version.get(version)
        return (entry if entry is not None and entry.served else None), served

    def knows(self, api_version: str, kind: str) -> bool:
        group = api_version.rpartition("/")[0]
        return (group, kind) in self.versions


_HEADER_END = re.compile(r"^  versions:", re.MULTILINE)


@lru_cache(maxsize=64)
def _crd_header(file: str, mtime_ns: int, size: int) -> tuple[str, str] | None:
    """(group, kind) of a single-CRD file from the part before ``spec.versions``; None when
    the file does not look like one (then it is parsed in full)."""
    del mtime_ns, size  # cache key only
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if text.count("kind: CustomResourceDefinition") != 1:
        return None
    end = _HEADER_END.search(text)
    if end is None:
        return None
    try:
        doc = yaml.load(text[: end.start()], Loader=_FAST_LOADER)
    except yaml.YAMLError:
        return None
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        return None
    names = spec.get("names")
    if not isinstance(names, dict) or not spec.get("group") or not names.get("kind"):
        return None
    return str(spec["group"]), str(names["kind"])


@lru_cache(maxsize=64)
def _crd_documents(file: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    """CRD documents of one file, cached by (path, mtime, size): CRDs are large and reused."""
    del mtime_ns, size  # cache key only
    try:
        docs = list(yaml.load_all(Path(file).read_text(encoding="utf-8"), Loader=_FAST_LOADER))
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else 0
        raise InputFileError(f"{file}:{line}: invalid YAML in CRD: {e.problem}") from e
    except (OSError, yaml.YAMLError) as e:
        raise InputFileError(f"{file}: cannot read CRD ({e})") from e
    return tuple(
        d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"
    )


_TYPE_NAMES = {
    "object": "object",
    "array": "array",
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _type_ok(value: Any, typ: str) -> bool:
    actual = _type_of(value)
    if typ == "number":
        return actual in ("integer", "number")
    return actual == typ


@lru_cache(maxsize=512)
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_check(rule: str, value: Any) -> bool | None:
    """True/False from evaluating ``rule`` with ``self`` = value; None when not evaluable."""
    if re.search(r"\boldSelf\b", rule):
        return None  # transition rule: only evaluated on update
    try:
        result = _cel_program(rule).evaluate({"self": json_to_cel(value)})
    except Exception:
        # CELParseError/CELEvalError (an extension function cel-python lacks, e.g. isSorted,
        # quantity): skipped, not guessed.
        return None
    if isinstance(result, celpy.celtypes.BoolType):
        return bool(result)
    return None


@dataclass
class _Walk:
    m: Manifest
    out: list[Finding] = field(default_factory=list)

    def error(self, path: str, message: str, fix: str) -> None:
        if len(self.out) < _MAX_ERRORS_PER_OBJECT:
            self.out.append(_finding(self.m, path, message, fix))

    def check(self, value: Any, schema: dict[str, Any], path: str) -> None:
        if value is None:
            return  # the API server prunes nulls of non-nullable fields
        if isinstance(value, str) and is_template(value):
            # `replicas: $MIN_WORKERS` (envsubst; data-on-eks' RayJobs): a tool fills it in
            # before apply, so its type, enum, pattern and length are not known here.
            return
        if schema.get("x-kubernetes-int-or-string"):
            if not isinstance(value, int | str) or isinstance(value, bool):
                self.error(
                    path,
                    f"{path} must be an integer or a string, got {_type_of(value)} {value!r}.",
                    'Write an integer (8) or a string ("50%").',
                )
                return
        elif "anyOf" in schema and "type" not in schema:
            wanted = " or ".join(s["type"] for s in schema["anyOf"] if "type" in s)
            if wanted and not any(_type_ok(value, s.get("type", "")) for s in schema["anyOf"]):
                self.error(
                    path, f"{path} must be {wanted}, got {_type_of(value)}.", f"Write a {wanted}."
                )
                return
        typ = schema.get("type")
        if typ in _TYPE_NAMES and not _type_ok(value, typ):
            fix = f"Write a {typ}."
            if typ == "string" and isinstance(value, int | float | bool):
                fix = f'Quote it: "{str(value).lower() if isinstance(value, bool) else value}".'
            self.error(
                path,
                f'{path}: Invalid value: "{_type_of(value)}": {path} in body must be of type '
                f"{typ}: {value!r}.",
                fix,
            )
            return
        enum = schema.get("enum")
        if isinstance(enum, list) and value not in enum:
            self.error(
                path,
                f"{path}: Unsupported value: {value!r}: supported values: "
                + ", ".join(repr(e) for e in enum),
                f"Use one of {', '.join(str(e) for e in enum)}.",
            )
        self._limits(value, schema, path)
        if isinstance(value, dict):
            self._object(value, schema, path)
        elif isinstance(value, list):
            self._array(value, schema, path)
        for v in schema.get("x-kubernetes-validations") or []:
            if not isinstance(v, dict) or not isinstance(v.get("rule"), str):
                continue
            ok = _cel_check(v["rule"], value)
            if ok is False:
                where = path
                if isinstance(v.get("fieldPath"), str):
                    where = path + v["fieldPath"]
                msg = v.get("message") or f"failed rule: {v['rule']}"
                self.error(
                    where,
                    f"{where}: Invalid value: {msg} (x-kubernetes-validations rule `{v['rule']}`).",
                    "Change the object so the rule holds: " + str(msg),
                )

    def _limits(self, value: Any, schema: dict[str, Any], path: str) -> None:
        if isinstance(value, str):
            pattern = schema.get("pattern")
            if isinstance(pattern, str):
                try:
                    if not re.search(pattern, value):
                        self.error(
                            path,
                            f"{path} in body should match '{pattern}': {value!r}.",
                            f"Use a value matching {pattern}.",
                        )
                except re.error:
                    pass
            lo, hi = schema.get("minLength"), schema.get("maxLength")
            if isinstance(lo, int) and len(value) < lo:
                self.error(path, f"{path} should be at least {lo} chars long.", "Lengthen it.")
            if isinstance(hi, int) and len(value) > hi:
                self.error(
                    path,
                    f"{path} may not be longer than {hi} characters ({len(value)}).",
                    f"Shorten it to {hi} characters.",
                )
        if isinstance(value, int | float) and not isinstance(value, bool):
            lo, hi = schema.get("minimum"), schema.get("maximum")
            if isinstance(lo, int | float) and (
                value < lo or (schema.get("exclusiveMinimum") is True and value == lo)
            ):
                self.error(
                    path, f"{path} should be greater than or equal to {lo}: {value}.", f">= {lo}"
                )
            if isinstance(hi, int | float) and (
                value > hi or (schema.get("exclusiveMaximum") is True and value == hi)
            ):
                self.error(
                    path, f"{path} should be less than or equal to {hi}: {value}.", f"<= {hi}"
                )
            int32 = schema.get("format") == "int32" and isinstance(value, int)
            if int32 and not -(2**31) <= value < 2**31:
                self.error(path, f"{path} does not fit int32: {value}.", "Use a smaller value.")
        if isinstance(value, list):
            lo, hi = schema.get("minItems"), schema.get("maxItems")
            if isinstance(lo, int) and len(value) < lo:
                self.error(path, f"{path} should have at least {lo} items.", f"Add items ({lo}+).")
            if isinstance(hi, int) and len(value) > hi:
                self.error(path, f"{path} should have at most {hi} items.", f"Keep {hi} or fewer.")

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: str) -> None:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        assert isinstance(props, dict)
        for req in schema.get("required") or []:
            has_default = isinstance(props.get(req), dict) and "default" in props[req]
            if (req not in value or value[req] is None) and not has_default:
                self.error(
                    _join(path, req),
                    f"{_join(path, req)}: Required value.",
                    f"Add {req} under {path or 'the object'}.",
                )
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
        embedded = schema.get("x-kubernetes-embedded-resource") is True
        for key, sub in value.items():
            sub_path = _join(path, str(key))
            if path == "" and key == "metadata":
                continue  # ObjectMeta: checked by _metadata_checks, not the CRD schema
            if key in props:
                self.check(sub, props[key], sub_path)
            elif isinstance(additional, dict):
                self.check(sub, additional, sub_path)
            elif (
                additional is True
                or preserve
                or (embedded and key in ("apiVersion", "kind", "metadata"))
                or (path == "" and key in ("apiVersion", "kind", "metadata", "status"))
            ):
                continue
            elif props or additional is False or not preserve:
                close = difflib.get_close_matches(str(key), list(props), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                known = ", ".join(sorted(props)) if props else "no fields"
                self.error(
                    sub_path,
                    f'{path or "object"}: unknown field "{key}" ({sub_path}): kubectl apply '
                    "(strict field validation) rejects it, or it is silently dropped.",
                    f"Remove it or fix its name/indentation; {hint}allowed here: {known}.",
                )

    def _array(self, value: list[Any], schema: dict[str, Any], path: str) -> None:
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                self.check(item, items, _join(path, i))
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            seen: list[Any] = []
            for i, item in enumerate(value):
                if item in seen:
                    self.error(
                        _join(path, i),
                        f"{_join(path, i)}: Duplicate value: {item!r}.",
                        "Remove it.",
                    )
                seen.append(item)
        elif list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen_keys: set[tuple[str, ...]] = set()
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    continue
                k = tuple(json.dumps(item.get(key), sort_keys=True) for key in keys)
                if k in seen_keys:
                    shown = ", ".join(f"{key}={item.get(key)!r}" for key in keys)
                    self.error(
                        _join(path, i),
                        f"{_join(path, i)}: Duplicate value: {{{shown}}}.",
                        "Merge or rename the duplicate entry.",
                    )
                seen_keys.add(k)


def _metadata_checks(w: _Walk, body: dict[str, Any]) -> None:
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        w.error("metadata", "metadata: Required value (a mapping with name).", "Add metadata.name.")
        return
    if not meta.get("name") and not meta.get("generateName"):
        w.error("metadata.name", "metadata.name: Required value.", "Add metadata.name.")
    for key in ("labels", "annotations"):
        table = meta.get(key)
        if table is None:
            continue
        if not isinstance(table, dict):
            w.error(f"metadata.{key}", f"metadata.{key} must be a map of strings.", "Fix it.")
            continue
        for k, v in table.items():
            if not isinstance(v, str):
                w.error(
                    f"metadata.{key}.{k}",
                    f"metadata.{key}.{k}: must be a string, got {_type_of(v)} {v!r}.",
                    f'Quote it: {k}: "{str(v).lower() if isinstance(v, bool) else v}".',
                )


@dataclass
class CrdValidator:
    """Validates custom resources against CRD schemas."""

    schemas: CrdSchemas

    def validate(self, m: Manifest) -> list[Finding] | None:
        if not self.schemas.knows(m.api_version, m.kind):
            return None
        entry, served = self.schemas.lookup(m.api_version, m.kind)
        if entry is None:
            group = m.api_version.rpartition("/")[0]
            return [
                _finding(
                    m,
                    "apiVersion",
                    f"apiVersion {m.api_version} is not served by the {m.kind} CRD (served: "
                    f"{', '.join(f'{group}/{v}' for v in served) or 'none'}): kubectl apply "
                    'fails with "no matches for kind".',
                    f"Use apiVersion {group}/{served[-1]}." if served else "Install the CRD.",
                )
            ]
        w = _Walk(m)
        _metadata_checks(w, m.body)
        w.check(m.body, entry.schema, "")
        if w.out:
            for other in self.schemas.alternatives.get(
                (entry.group, entry.kind, entry.version), []
            ):
                alt = _Walk(m)
                _metadata_checks(alt, m.body)
                alt.check(m.body, other.schema, "")
                if not alt.out:
                    return []  # another CRD of the input for this kind accepts the object
        return w.out


# --------------------------------------------------------------------------------------------
# Core kinds (kubernetes-validate)
# --------------------------------------------------------------------------------------------


@dataclass
class CoreValidator:
    """Validates built-in kinds with kubernetes-validate's published (strict) JSON schemas."""

    k8s_version: str | None = None

    def _version(self) -> str:
        return _schema_version(self.k8s_version)

    def validate(self, m: Manifest) -> list[Finding] | None:
        validator = _core_validator(self._version(), m.api_version, m.kind)
        if validator is None:
            return None
        out = []
        errors = sorted(validator.iter_errors(m.body), key=lambda e: list(e.absolute_path))
        if _is_pod_template_file(m):
            # A Spark/Flink pod template (``spark.kubernetes.driver.podTemplateFile``) is a
            # partial Pod the job merges its own containers into, never applied as is: its
            # missing required fields are by design; wrong and unknown fields still count.
            errors = [e for e in errors if e.validator != "required"]
        for err in errors[:_MAX_ERRORS_PER_OBJECT]:
            path = ""
            for part in err.absolute_path:
                path = _join(path, part if isinstance(part, int) else str(part))
            message = err.message
            if err.validator == "additionalProperties":
                fix = "Remove the unexpected field or fix its name/indentation."
            elif err.validator == "type":
                fix = f"Use a {err.validator_value}."
            elif err.validator == "required":
                fix = "Add the required field."
            else:
                fix = "Make the value match the Kubernetes schema."
            out.append(
                _finding(
                    m,
                    path or "(object)",
                    f"{path or m.kind}: {message} (Kubernetes {self._version()} schema).",
                    fix,
                )
            )
        return out


def _is_pod_template_file(m: Manifest) -> bool:
    """A ``kind: Pod`` read from a file named as a pod template (``*pod-template*.yaml``,
    ``*podtemplate*``, ``*pod_template*``)."""
    name = Path(m.file).name.lower().replace("_", "-")
    return m.kind == "Pod" and ("pod-template" in name or "podtemplate" in name)


def _minor(version: str) -> tuple[int, int]:
    m = re.match(r"^v?(\d+)\.(\d+)", version.strip())
    if not m:
        raise UsageError(f"--k8s-version {version!r}: expected MAJOR.MINOR, e.g. 1.30")
    return int(m.group(1)), int(m.group(2))


@lru_cache(maxsize=16)
def _schema_version(wanted: str | None) -> str:
    """The newest kubernetes-validate schema version not newer than ``wanted``."""
    versions = sorted(kv.all_versions(), key=_minor)
    if wanted is None:
        return str(versions[-1])
    target = _minor(wanted)
    known = [v for v in versions if _minor(v) <= target]
    if not known:
        raise UsageError(f"--k8s-version {wanted}: no schemas that old (oldest: {versions[0]})")
    return str(known[-1])


@lru_cache(maxsize=64)
def _core_validator(version: str, api_version: str, kind: str) -> Any:
    """A jsonschema validator for (version, apiVersion, kind), or None when not a core kind."""
    if not api_version or not kind:
        return None
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"v{version}-local-strict"
    try:
        schema = kv.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group}.json", version
        )
    except (FileNotFoundError, kv.VersionNotSupportedError, kv.InvalidSchemaError):
        return None
    definitions = _core_definitions(version)
    registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry = definitions @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


@lru_cache(maxsize=4)
def _core_definitions(version: str) -> Any:
    name = f"kubernetes-json-schema/v{version}-local-strict/_definitions.json"
    return Resource.from_contents(kv.schema_contents(name, version))


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def validators(
    inv: Inventory,
    crds: str | Path | CrdSchemas | None = None,
    k8s_version: str | None = None,
) -> list[SchemaValidator]:
    """CRD validator (``crds``: schemas already found, or a directory of CRD files; plus the
    CRDs among the inputs) and the core-kind validator."""
    if isinstance(crds, CrdSchemas):
        schemas = crds.copy()
    elif crds is not None:
        wanted = {(m.api_version.rpartition("/")[0], m.kind) for m in inv.manifests}
        schemas = CrdSchemas.from_dir(crds, wanted)
    else:
        schemas = CrdSchemas()
    # The input's CRDs replace the release's; several input CRDs for one kind are alternatives.
    seen: set[tuple[str, str]] = set()
    for m in inv.of_kind("CustomResourceDefinition"):
        spec = m.body.get("spec")
        key = (str(spec.get("group", "")), _crd_kind_of(spec)) if isinstance(spec, dict) else None
        schemas.add_crd(m.body, keep_previous=key in seen)
        if key is not None:
            seen.add(key)
    return [CrdValidator(schemas), CoreValidator(k8s_version)]


def _crd_kind_of(spec: dict[str, Any]) -> str:
    names = spec.get("names")
    return str(names.get("kind", "")) if isinstance(names, dict) else ""


@dataclass(frozen=True)
class SchemaReport:
    """Schema findings, and the objects no schema was known for (reported as a note)."""

    findings: list[Finding]
    unchecked: list[str]


def validate_schemas(
    inv: Inventory,
    crds_dir: str | Path | CrdSchemas | None = None,
    k8s_version: str | None = None,
    chain: Iterable[SchemaValidator] | None = None,
) -> SchemaReport:
    """Schema findings for every manifest (the first validator that knows a kind decides)."""
    chain = list(chain) if chain is not None else validators(inv, crds_dir, k8s_version)
    out: list[Finding] = []
    unchecked: list[str] = []
    for m in inv.manifests:
        for v in chain:
            found = v.validate(m)
            if found is not None:
                out.extend(found)
                break
        else:
            unchecked.append(m.ref)
    return SchemaReport(out, unchecked)
