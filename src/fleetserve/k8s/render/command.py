"""``fleetserve render fleet.yaml -o DIR``: plan the fleet twice (min and max replicas) and
write its KubeRay/HAMi/monitoring manifests as a GitOps directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleetserve.errors import InputFileError, UsageError
from fleetserve.inputfile import first_problem, read_text
from fleetserve.k8s.render.groups import plan_worker_groups, tenant_warnings
from fleetserve.k8s.render.options import RenderOptions
from fleetserve.k8s.render.renderer import render, use_hami
from fleetserve.k8s.render.writer import write_manifests
from fleetserve.plan import plan_fleet
from fleetserve.plan.deployment import planned_spec
from fleetserve.plan.result import PlanResult
from fleetserve.spec import load_spec


def _read_plan(path: str) -> PlanResult:
    """A plan saved by ``fleetserve plan --format json`` (reviewed, then rendered as is)."""
    text = read_text(Path(path))
    try:
        return PlanResult.model_validate_json(text)
    except ValidationError as e:
        raise InputFileError(f"{path}: not a fleetserve plan: {first_problem(e)}") from e


def _labels(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(
                f"--monitoring-label {pair!r}: expected KEY=VALUE (e.g. release=prometheus)"
            )
        out[key] = value
    return out


def _handle(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    spec.require_weights("render")  # the rendered app loads the weights from source
    try:
        options = RenderOptions(
            monitoring_labels=_labels(args.monitoring_label),
            prometheus_namespace=args.prometheus_namespace,
            kuberay_namespace=args.kuberay_namespace,
            hami_namespace=args.hami_namespace,
            with_nodepools=args.with_nodepools,
            node_class=args.node_class,
            head_pool=args.head_pool,
            gpu_sharing=args.gpu_sharing,
            runtime_env_pip=args.runtime_env_pip,
        )
    except ValueError as e:
        raise UsageError(f"render options: {e}") from e
    if (args.plan_min is None) != (args.plan_max is None):
        raise UsageError("give both --plan-min and --plan-max, or neither (then render plans)")
    if args.plan_min is not None:
        plan_min, plan_max = _read_plan(args.plan_min), _read_plan(args.plan_max)
    else:
        plan_min = plan_fleet(spec, scenario="min")
        plan_max = plan_fleet(spec, scenario="max")
    objects = render(spec, plan_min, plan_max, options)
    paths = write_manifests(objects, args.output)
    hami = use_hami(plan_max, options)
    spec = planned_spec(spec, plan_max)  # as render read it: the plan's traffic choices
    groups = plan_worker_groups(spec, plan_min, plan_max)
    for warning in tenant_warnings(spec, groups, hami=hami):
        print(f"fleetserve: warning: {warning}", file=sys.stderr)
    for group in groups:
        shape = group.shape
        gpu = (
            f"{shape.gpus} x {shape.memory_mb} MiB/{shape.cores_percent}% (HAMi)"
            if hami and shape.sliced
            else f"{shape.gpus} whole card(s)"
        )
        print(
            f"  group {group.name}: model {group.model.name} on {group.pool.name}, "
            f"{group.min_replicas}..{group.max_replicas} pods, {gpu}, "
            f"{group.cpu} CPU, {group.memory_gib} GiB"
        )
    print(f"wrote {len(paths)} files to {args.output}", file=sys.stderr)
    return 0


def register(subparsers: Any) -> None:
    """Add ``render`` to the CLI."""
    parser = subparsers.add_parser(
        "render",
        help="write the fleet's Kubernetes manifests (RayService, monitors, policy)",
        description=__doc__,
    )
    parser.add_argument("spec", help="fleet spec (YAML)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--with-nodepools",
        action="store_true",
        help="also write one Karpenter NodePool per pool",
    )
    parser.add_argument(
        "--monitoring-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label the Prometheus CR selects monitors and rules by (repeatable; default "
        "kubernetes.monitoring_labels of the spec)",
    )
    parser.add_argument(
        "--prometheus-namespace",
        default=RenderOptions.model_fields["prometheus_namespace"].default,
        help="namespace of Prometheus (allowed to scrape the metrics port)",
    )
    parser.add_argument(
        "--kuberay-namespace",
        default=RenderOptions.model_fields["kuberay_namespace"].default,
        help="namespace of the KubeRay operator (allowed to reach the dashboard port)",
    )
    parser.add_argument(
        "--hami-namespace",
        default=RenderOptions.model_fields["hami_namespace"].default,
        help="namespace of HAMi's device plugin (its vGPU monitor is scraped with HAMi slices)",
    )
    parser.add_argument(
        "--node-class",
        default=RenderOptions.model_fields["node_class"].default,
        help="EC2NodeClass of the rendered NodePools",
    )
    parser.add_argument("--head-pool", default=None, help="pool the Ray head runs on")
    parser.add_argument(
        "--plan-min",
        metavar="FILE",
        default=None,
        help="render this saved min plan (`fleetserve plan --format json`) instead of planning",
    )
    parser.add_argument(
        "--plan-max", metavar="FILE", default=None, help="the saved max plan (with --plan-min)"
    )
    parser.add_argument(
        "--runtime-env-pip",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="pip requirement the Serve app installs at start (repeatable), e.g. a fleetserve "
        "wheel URL, when kubernetes.image does not contain fleetserve",
    )
    parser.add_argument(
        "--gpu-sharing",
        choices=["auto", "hami", "none"],
        default="auto",
        help="HAMi vGPU slices, whole cards only, or auto: HAMi when the plan shares a card",
    )
    parser.set_defaults(handler=_handle)
