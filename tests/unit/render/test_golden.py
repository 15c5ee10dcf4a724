"""Golden files and determinism: the same spec and plans always give the same bytes.

Regenerate after an intended change with ``FLEETSERVE_UPDATE_GOLDEN=1 pytest
tests/unit/render/test_golden.py`` and review the diff like any other code change.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.errors import RenderError
from fleetserve.k8s.render import RenderOptions, manifest_files, render, write_manifests
from fleetserve.k8s.render.writer import HEADER

_UPDATE = os.environ.get("FLEETSERVE_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("fleet", ["sliced", "whole-tp", "lora"])
def test_render_matches_golden_files(kit: Any, fleet: str) -> None:
    files = manifest_files(render(*kit.FLEETS[fleet](), RenderOptions(with_nodepools=True)))
    golden: Path = kit.GOLDEN / fleet
    if _UPDATE:
        golden.mkdir(parents=True, exist_ok=True)
        for old in golden.glob("*.yaml"):
            old.unlink()
        for name, text in files.items():
            (golden / name).write_text(text, encoding="utf-8")
    expected = {p.name: p.read_text(encoding="utf-8") for p in sorted(golden.glob("*.yaml"))}
    assert sorted(files) == sorted(expected), "rendered file set differs from the golden files"
    for name, text in files.items():
        assert text == expected[name], f"{fleet}/{name} differs from its golden file"


def test_rendering_twice_writes_identical_bytes(kit: Any, tmp_path: Path) -> None:
    for i in (1, 2):
        write_manifests(render(*kit.sliced_fleet()), tmp_path / str(i))
    first = {p.name: p.read_bytes() for p in (tmp_path / "1").iterdir()}
    second = {p.name: p.read_bytes() for p in (tmp_path / "2").iterdir()}
    assert first == second
    assert len(first) > 5


def test_kustomization_lists_every_object_file(kit: Any) -> None:
    files = manifest_files(render(*kit.sliced_fleet()))
    kustomization = yaml.safe_load(files["kustomization.yaml"])
    assert kustomization["resources"] == sorted(n for n in files if n != "kustomization.yaml")
    for name, text in files.items():
        assert text.startswith(HEADER)
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 1, f"{name} holds {len(docs)} objects"


def test_rerender_removes_stale_generated_files_but_keeps_foreign_ones(
    kit: Any, tmp_path: Path
) -> None:
    write_manifests(render(*kit.sliced_fleet(), RenderOptions(with_nodepools=True)), tmp_path)
    (tmp_path / "my-extra.yaml").write_text("kind: ConfigMap\n")
    assert (tmp_path / "nodepool-t4.yaml").exists()
    write_manifests(render(*kit.sliced_fleet()), tmp_path)
    assert not (tmp_path / "nodepool-t4.yaml").exists()
    assert (tmp_path / "my-extra.yaml").exists()


def test_an_unwritable_directory_is_a_render_error(kit: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RenderError, match="cannot write manifests"):
        write_manifests(render(*kit.whole_fleet()), blocker / "out")
