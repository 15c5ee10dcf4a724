"""vLLM's own CLI parser takes the options fleetserve builds (imports vLLM: slow)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.settings import EngineSettings
from fleetserve.engine.vllm_engine import parse_vllm_args
from fleetserve.errors import EngineError
from fleetserve.spec import ModelSpec

pytestmark = pytest.mark.vllm

SETTINGS = EngineSettings(
    gpu_memory_utilization=0.17,
    max_num_seqs=16,
    max_model_len=2048,
    max_num_batched_tokens=2048,
)


def config(**model: object) -> EngineConfig:
    spec = ModelSpec.model_validate({"name": "m", "source": "org/m", **model})
    return EngineConfig.from_spec(spec, model_path="/models/m", settings=SETTINGS)


@pytest.mark.slow
def test_vllms_own_parser_accepts_the_options() -> None:
    """The replica parses these with vLLM's CLI parser, exactly as `vllm serve` would."""
    args = parse_vllm_args(config(engine_args={"enable_prefix_caching": False, "seed": 3}))
    assert args.model == "/models/m"
    assert args.served_model_name == ["m"]
    assert args.max_num_seqs == 16
    assert args.gpu_memory_utilization == pytest.approx(0.17)
    assert args.enable_prefix_caching is False
    assert args.seed == 3


@pytest.mark.slow
def test_unknown_engine_arg_is_an_engine_error_naming_the_model() -> None:
    with pytest.raises(EngineError, match="model 'm': vLLM rejected its arguments"):
        parse_vllm_args(config(engine_args={"no_such_vllm_option": 1}))


@pytest.mark.slow
def test_a_cpu_engine_is_pinned_to_its_own_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fleetserve.engine import cpu_binding, vllm_engine  # noqa: PLC0415

    monkeypatch.setattr(cpu_binding, "lock_dir", lambda: tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    # claim_engine_cores writes the binding into os.environ; on a copy, so it cannot reach the
    # fleets later tests start from this process (they would read it as the user's choice
    # and keep vLLM's own binding: tests/integration/test_serve_engine_cores.py).
    monkeypatch.setattr(os, "environ", os.environ.copy())
    os.environ.pop(cpu_binding.BIND_ENV, None)
    monkeypatch.setattr(vllm_engine, "_SET_BY_US", set())
    first = vllm_engine.claim_engine_cores(config())
    second = vllm_engine.claim_engine_cores(config())
    assert first is not None
    assert second is not None
    # Not in Ray: one core each, and the environment the engine's processes inherit.
    assert (first.cores, second.cores) == ([0], [1])
    assert os.environ[cpu_binding.BIND_ENV] == "1"


@pytest.mark.slow
def test_a_users_binding_and_multi_process_engines_keep_vllms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetserve.engine import cpu_binding, vllm_engine  # noqa: PLC0415

    monkeypatch.setenv(cpu_binding.BIND_ENV, "4-7")
    assert vllm_engine.claim_engine_cores(config()) is None
    monkeypatch.delenv(cpu_binding.BIND_ENV)
    assert vllm_engine.claim_engine_cores(config(tensor_parallel=2)) is None


def test_a_replica_whose_engine_core_died_refuses_requests() -> None:
    """vLLM's app answers 500 to every request once its engine core is dead; the replica
    refuses them instead, so the ingress answers 503 + Retry-After as for a dead replica
    (issue #32's failover run). AsyncLLM says so through ``errored``."""
    import types  # noqa: PLC0415

    from fleetserve.engine.asgi_bridge import AsgiBridge  # noqa: PLC0415
    from fleetserve.engine.protocol import EngineRequest  # noqa: PLC0415
    from fleetserve.engine.vllm_engine import VllmEngine  # noqa: PLC0415

    async def app(scope: object, receive: object, send: object) -> None:  # never reached
        raise AssertionError("the request reached vLLM's app")

    engine = VllmEngine(config())
    engine._bridge = AsgiBridge(app)  # started, as far as handle() is concerned
    request = EngineRequest(method="POST", path="/v1/completions", body=b"{}")
    engine._engine = types.SimpleNamespace(errored=False)
    assert engine.handle(request) is not None
    engine._engine = types.SimpleNamespace(errored=True)
    with pytest.raises(EngineError, match="its engine stopped"):
        engine.handle(request)
