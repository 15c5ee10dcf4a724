"""The fleet spec reference (docs/spec.md), generated from the pydantic models.

Generated rather than hand-written so the reference cannot drift from what the validator
accepts: a test compares docs/spec.md with :func:`spec_reference`.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fleetserve import spec as S

#: Sections in reading order: (heading, model, YAML path prefix).
_SECTIONS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("Fleet (root)", S.FleetSpec, ""),
    ("Model", S.ModelSpec, "models[]"),
    ("Replicas", S.ReplicaSpec, "models[].replicas"),
    ("Replica resources", S.ResourceSpec, "models[].resources"),
    ("Traffic", S.TrafficSpec, "models[].traffic"),
    ("Token lengths", S.LengthSpec, "models[].traffic.prompt_tokens, .output_tokens"),
    ("SLO", S.SloSpec, "models[].slo"),
    ("Latency targets", S.PercentileTargets, "models[].slo.ttft_ms, models[].slo.tpot_ms"),
    ("Routing", S.RoutingSpec, "models[].routing"),
    ("LoRA adapter", S.AdapterSpec, "models[].adapters[]"),
    ("Pool", S.PoolSpec, "pools[]"),
    ("Pool GPU", S.GpuSpec, "pools[].gpu"),
    ("Taint", S.Taint, "pools[].taints[]"),
    ("Tenant", S.TenantSpec, "tenants[]"),
    ("Tenant quota", S.QuotaSpec, "tenants[].quota, tenants[].quota_per_key"),
    ("Secret reference", S.SecretRef, "(any secret field)"),
    ("Policy", S.Policy, "policy"),
    ("Server", S.ServerSpec, "server"),
    ("Kubernetes", S.KubernetesSpec, "kubernetes"),
    ("Pod volume", S.VolumeSpec, "kubernetes.volumes[]"),
)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a).replace("'", "") for a in args)
    if origin in (types.UnionType, typing.Union):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map {_type_name(args[0])} → {_type_name(args[1])}"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.__name__
    return getattr(tp, "__name__", str(tp))


def _constraints(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        if isinstance(m, Ge):
            parts.append(f"≥ {m.ge}")
        elif isinstance(m, Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, Le):
            parts.append(f"≤ {m.le}")
        elif isinstance(m, Lt):
            parts.append(f"< {m.lt}")
        elif isinstance(m, MinLen):
            parts.append(f"min length {m.min_length}")
        elif isinstance(m, MaxLen):
            parts.append(f"max length {m.max_length}")
        elif getattr(m, "pattern", None):
            parts.append(f"pattern `{m.pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(defaults)"
        return f"`{value!r}`" if value else "empty"
    if info.default is PydanticUndefined or info.default is None:
        return "—"
    describe = getattr(info.default, "describe", None)
    if isinstance(info.default, BaseModel) and callable(describe):
        return f"`{describe()}`"  # written as the file writes it (a token length: `128`)
    return f"`{info.default!r}`"


def _workload_sections() -> tuple[tuple[str, type[BaseModel], str], ...]:
    """The workload file's sections (``fleetserve simulate --workload``)."""
    from fleetserve.bench.load import LoadPoint  # noqa: PLC0415
    from fleetserve.sim.workload import StreamSpec, WorkloadSpec  # noqa: PLC0415

    return (
        ("Workload (root)", WorkloadSpec, ""),
        ("Stream", StreamSpec, "streams[]"),
        ("Load", LoadPoint, "streams[].load"),
    )


def spec_reference() -> str:
    """Markdown reference of every spec field: type, default, constraints, meaning; then
    the same of the workload file ``fleetserve simulate --workload`` reads."""
    out = [
        "# Fleet spec reference",
        "",
        "Generated from `src/fleetserve/spec.py` by `python -m fleetserve.specdoc`; do not edit.",
        "Unknown keys are errors everywhere; errors name the field path "
        "(`models[0].replicas.min`).",
        "",
    ]
    out += _sections(_SECTIONS)
    out += [
        "# Workload file reference",
        "",
        "What `fleetserve simulate fleet.yaml --workload W.yaml` reads "
        "(`src/fleetserve/sim/workload.py`): request streams, each for one model of the "
        "fleet, all run at once. Token lengths (`input_len`, `output_len`) are written as "
        "`N`, `uniform:LO-HI` or `normal:M,S`. Example: `examples/workloads/multi-model.yaml`.",
        "",
    ]
    out += _sections(_workload_sections())
    return "\n".join(out)


def _sections(sections: tuple[tuple[str, type[BaseModel], str], ...]) -> list[str]:
    out: list[str] = []
    for heading, model, prefix in sections:
        out += [f"## {heading}", "", f"Path: `{prefix or '(root)'}`", ""]
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        if doc:
            out += [doc, ""]
        out += ["| field | type | default | constraints | meaning |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            out.append(
                f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} | "
                f"{_constraints(info)} | {info.description or ''} |"
            )
        out.append("")
    return out


if __name__ == "__main__":
    print(spec_reference(), end="")
