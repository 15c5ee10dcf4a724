"""serve-config-invalid: a serveConfigV2 Serve cannot read is a finding, not a clean report."""

from __future__ import annotations

from fleetserve.k8s.doctor.loader import load_paths
from fleetserve.k8s.doctor.registry import run_rules

from .conftest import FIXTURES


def test_unparseable_serve_config_points_at_the_bad_line() -> None:
    path = FIXTURES / "serve-config-invalid" / "trigger.yaml"
    (f,) = run_rules(load_paths([path]), {"serve-config-invalid"})
    assert f.severity == "error"
    assert f.line is not None
    assert path.read_text(encoding="utf-8").splitlines()[f.line - 1].strip() == "num_replicas: 1"
    assert "is not valid YAML" in f.message
