"""The example fleets load, fit a 2-CPU host, and default.yaml is the built-in fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.host import probe
from fleetserve.plan.local import local_deployment
from fleetserve.serve.control.resources import ClusterCapacity, fit_resources
from fleetserve.spec import default_fleet, load_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SERVE_EXAMPLES = ["default.yaml", "multi-model.yaml", "tenants.yaml"]


@pytest.mark.parametrize("name", SERVE_EXAMPLES)
def test_example_fits_a_two_cpu_host(name: str) -> None:
    spec = load_spec(EXAMPLES / name)
    fit_resources(spec, local_deployment(spec, probe()), ClusterCapacity(cpus=2, node_cpus=2))


def test_default_example_is_the_builtin_fleet() -> None:
    assert load_spec(EXAMPLES / "default.yaml") == default_fleet()


def test_multi_model_example_serves_one_source_under_two_names() -> None:
    spec = load_spec(EXAMPLES / "multi-model.yaml")
    assert len({m.name for m in spec.models}) == 2
    assert len({m.source for m in spec.models}) == 1
