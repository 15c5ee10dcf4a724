"""CRD schemas that ship with fleetserve, so the default offline run still checks schemas.

Design note: upstream CRD files are not shipped (they are the upstream's files, and a KubeRay
CRD runs to a megabyte of YAML, mostly prose). What ships is what validation needs, derived
by this module from a release's CRD files and written in fleetserve's own compact form: per
CRD its name, group, kind and per version ``served`` and the ``openAPIV3Schema`` without its
``description`` texts, as gzipped JSON under ``schemas/<component>-<version>.json.gz``
(~50 KB per KubeRay release). Shipped: the last patch of each supported minor, KubeRay 1.3.2,
1.4.2, 1.5.2, 1.6.2 (from each tag's ``helm-chart/kuberay-operator/crds/``) and 1.7.0 (from
``../shared/k8s/crds``, which a test re-derives and compares). Re-derive after adding one::

    python -m fleetserve.k8s.doctor.bundled kuberay 1.7.0 ../shared/k8s/crds --group ray.io

:func:`crd_documents` turns the compact form back into CRD-shaped documents, so the schema
walker (``schema.CrdSchemas``) reads them exactly as it reads a cluster's or a release's CRDs.
What must stay true: only keywords that decide validity survive (types, properties, required,
enums, formats, bounds, patterns, ``x-kubernetes-*`` including CEL rules, defaults); a
property *named* ``description`` is a field, not prose, and is kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

#: Bump when the compact form changes; a file of another format is ignored, never misread.
FORMAT = 1
_PACKAGE = "fleetserve.k8s.doctor"
_FOLDER = "schemas"
#: Schema keywords whose value maps names to subschemas (the names are kept as written).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs"})
#: Keywords whose value is one subschema, or a list of them.
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not"})
_SCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf"})
#: Prose only: no bearing on whether an object is valid.
_PROSE = frozenset({"description", "example", "externalDocs", "title"})


def compact(schema: Any) -> Any:
    """``schema`` without its prose keywords, recursively through subschemas."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _PROSE:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: compact(sub) for name, sub in value.items()}
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = compact(value)
        elif key in _SCHEMA_LIST and isinstance(value, list):
            out[key] = [compact(sub) for sub in value]
        else:
            out[key] = value
    return out


def derive(files: Sequence[Path], component: str, version: str) -> dict[str, Any]:
    """The compact form of every CustomResourceDefinition in ``files``."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crds: list[dict[str, Any]] = []
    for f in sorted(files):
        for doc in yaml.load_all(f.read_text(encoding="utf-8"), Loader=loader):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc.get("spec") or {}
            versions = [
                {
                    "name": v["name"],
                    "served": bool(v.get("served", True)),
                    "schema": compact((v.get("schema") or {}).get("openAPIV3Schema") or {}),
                }
                for v in spec.get("versions") or []
                if isinstance(v, dict) and "name" in v
            ]
            crds.append(
                {
                    "name": (doc.get("metadata") or {}).get("name", ""),
                    "group": spec.get("group", ""),
                    "kind": (spec.get("names") or {}).get("kind", ""),
                    "versions": versions,
                }
            )
    crds.sort(key=lambda c: (c["group"], c["kind"]))
    return {"format": FORMAT, "component": component, "version": version, "crds": crds}


def crd_documents(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """CustomResourceDefinition-shaped documents from the compact form."""
    return [
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": c["name"]},
            "spec": {
                "group": c["group"],
                "names": {"kind": c["kind"]},
                "versions": [
                    {
                        "name": v["name"],
                        "served": v["served"],
                        "schema": {"openAPIV3Schema": v["schema"]},
                    }
                    for v in c["versions"]
                ],
            },
        }
        for c in facts["crds"]
    ]


def _file_name(component: str, version: str) -> str:
    return f"{component}-{version}.json.gz"


@lru_cache(maxsize=8)
def bundled(component: str, version: str) -> dict[str, Any] | None:
    """The shipped compact schemas of ``component`` at ``version``, or None."""
    ref = resources.files(_PACKAGE) / _FOLDER / _file_name(component, version)
    if not ref.is_file():
        return None
    facts: dict[str, Any] = json.loads(gzip.decompress(ref.read_bytes()))
    return facts if facts.get("format") == FORMAT else None


def bundled_versions(component: str) -> list[str]:
    """Versions of ``component`` shipped with fleetserve (unsorted)."""
    folder = resources.files(_PACKAGE) / _FOLDER
    if not folder.is_dir():
        return []
    prefix, suffix = f"{component}-", ".json.gz"
    return [
        entry.name[len(prefix) : -len(suffix)]
        for entry in folder.iterdir()
        if entry.name.startswith(prefix) and entry.name.endswith(suffix)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Derive one release's compact schemas from its CRD files into the package."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("component", help="upstream component, e.g. kuberay, prometheus-operator")
    p.add_argument("version", help="its release, e.g. 1.7.0")
    p.add_argument("files", nargs="+", type=Path, help="CRD YAML files or a directory of them")
    p.add_argument("--group", help="keep only CRDs of this API group (e.g. ray.io)")
    args = p.parse_args(argv)
    files: list[Path] = []
    for f in args.files:
        files.extend(sorted(f.glob("*.y*ml")) if f.is_dir() else [f])
    facts = derive(files, args.component, args.version)
    if args.group:
        facts["crds"] = [c for c in facts["crds"] if c["group"] == args.group]
    if not facts["crds"]:
        sys.stderr.write("no CustomResourceDefinition found\n")
        return 1
    out = Path(__file__).parent / _FOLDER / _file_name(args.component, args.version)
    out.parent.mkdir(exist_ok=True)
    data = json.dumps(facts, separators=(",", ":"), sort_keys=True).encode()
    out.write_bytes(gzip.compress(data, mtime=0))  # mtime 0: the same input, the same bytes
    kinds = ", ".join(c["kind"] for c in facts["crds"])
    sys.stdout.write(f"wrote {out} ({len(data)} bytes of JSON, {kinds})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
