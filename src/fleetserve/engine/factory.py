"""Pick the engine implementation named by an :class:`EngineConfig`."""

from __future__ import annotations

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.protocol import Engine


def create_engine(config: EngineConfig) -> Engine:
    """A new, not yet started engine for ``config`` (vLLM is imported only when used)."""
    # Imported here on purpose: importing vLLM costs seconds and needs the engine extra,
    # which the fake engine (and the ingress) must not pay for.
    if config.kind == "fake":
        from fleetserve.engine.fake_engine import FakeEngine  # noqa: PLC0415

        # In a replica the fake has an engine-core process, as vLLM has (reaper tests).
        return FakeEngine(config, core_process=True)
    if config.frontend == "process":
        from fleetserve.engine.vllm_process import VllmProcessEngine  # noqa: PLC0415

        return VllmProcessEngine(config)
    from fleetserve.engine.vllm_engine import VllmEngine  # noqa: PLC0415

    return VllmEngine(config)
