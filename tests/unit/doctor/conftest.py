"""Shared paths and helpers for the doctor tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_paths
from fleetserve.k8s.doctor.registry import run_rules

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared"
CRDS = SHARED / "k8s" / "crds"
PITFALLS = SHARED / "docs" / "pitfalls.md"
FIXTURES = REPO / "tests" / "fixtures" / "doctor"
SEEDS = REPO / "tests" / "fixtures" / "seeds"


def findings_for(path: Path | str, only: set[str] | None = None) -> list[Finding]:
    """Run the rules over a fixture file or directory."""
    return run_rules(load_paths([path]), only)


@pytest.fixture
def crds_dir() -> Path:
    if not CRDS.is_dir():
        pytest.skip(f"CRDs not found at {CRDS}")
    return CRDS
