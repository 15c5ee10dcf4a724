"""Shared paths and helpers for the doctor tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.k8s.doctor.crds import MIRROR_ENV, OFFLINE_ENV, UPSTREAMS
from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.loader import load_paths
from fleetserve.k8s.doctor.registry import run_rules
from fleetserve.modelstore.store import CACHE_ENV

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared"
CRDS = SHARED / "k8s" / "crds"
FIXTURES = REPO / "tests" / "fixtures" / "doctor"
SEEDS = REPO / "tests" / "fixtures" / "seeds"


def findings_for(path: Path | str, only: set[str] | None = None) -> list[Finding]:
    """Run the rules over a fixture file or directory."""
    return run_rules(load_paths([path]), only)


#: The versions of the upstream CRD files in ../shared/k8s/crds (see its README).
SHARED_CRD_VERSIONS = {"kuberay": "1.7.0", "prometheus-operator": "0.93.0"}


def build_crd_cache(root: Path) -> Path:
    """A CRD cache (``<root>/crds/<component>/<version>/``) linking ../shared/k8s/crds' files;
    empty when ../shared is not beside the clone. Returns ``root``."""
    if CRDS.is_dir():
        for up in UPSTREAMS:
            folder = root / "crds" / up.component / SHARED_CRD_VERSIONS[up.component]
            for name in up.files.values():
                if (CRDS / name).is_file():
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / name).symlink_to(CRDS / name)
    return root


@pytest.fixture(scope="session")
def shared_crd_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_crd_cache(tmp_path_factory.mktemp("fleetserve-cache"))


@pytest.fixture(autouse=True)
def _offline_crd_cache(shared_crd_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema validation stays on by default in tests, served by the offline cache: never a
    download, never the developer's own ~/.cache."""
    monkeypatch.setenv(CACHE_ENV, str(shared_crd_cache))
    monkeypatch.setenv(OFFLINE_ENV, "1")
    monkeypatch.delenv(MIRROR_ENV, raising=False)


@pytest.fixture
def crds_dir() -> Path:
    if not CRDS.is_dir():
        pytest.skip(f"CRDs not found at {CRDS}")
    return CRDS
