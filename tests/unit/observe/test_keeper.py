"""GaugeKeeper: gauges set only on change are replayed, so Ray keeps exporting them."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve.engine import ray_stats
from fleetserve.observe.keeper import GaugeKeeper


class RayLikeGauge:
    """Records every set; refuses tag sets that are not its tag keys, as Ray's Gauge does."""

    def __init__(self, *tag_keys: str) -> None:
        self.tag_keys = set(tag_keys)
        self.sets: list[tuple[dict[str, str], float]] = []

    def set(self, value: float, tags: dict[str, str]) -> None:
        if set(tags) != self.tag_keys:
            raise ValueError(f"tags {sorted(tags)} are not {sorted(self.tag_keys)}")
        self.sets.append((dict(tags), value))


def test_refresh_replays_the_last_value_of_each_tag_set() -> None:
    keeper = GaugeKeeper(background=False)
    g = RayLikeGauge("model")
    keeper.set(g, 3.0, {"model": "a"})
    keeper.set(g, 0.0, {"model": "a"})
    keeper.set(g, 1.0, {"model": "b"})
    g.sets.clear()
    assert keeper.refresh() == 2
    assert sorted((t["model"], v) for t, v in g.sets) == [("a", 0.0), ("b", 1.0)]


def test_a_refused_set_raises_and_is_not_replayed() -> None:
    keeper = GaugeKeeper(background=False)
    g = RayLikeGauge("model")
    with pytest.raises(ValueError, match="tags"):
        keeper.set(g, 1.0, {"tenant": "x"})
    assert keeper.refresh() == 0
    assert g.sets == []


def test_one_failing_gauge_does_not_stop_the_others() -> None:
    keeper = GaugeKeeper(background=False)
    good, bad = RayLikeGauge("k"), RayLikeGauge("k")
    keeper.set(bad, 1.0, {"k": "v"})
    keeper.set(good, 2.0, {"k": "v"})
    bad.tag_keys = {"other"}  # from now on every set of ``bad`` fails
    good.sets.clear()
    assert keeper.refresh() == 2
    assert good.sets == [({"k": "v"}, 2.0)]


def test_vllm_gauges_of_our_ray_logger_go_through_the_keeper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's scheduler gauges (set only per engine step) are kept; a real Ray Gauge
    (no Ray cluster needed to record) receives the replays."""
    keeper = GaugeKeeper(background=False)
    monkeypatch.setattr(ray_stats, "KEEPER", keeper)
    assert ray_stats.KeptRayStatLogger._gauge_cls is ray_stats.KeptRayGauge
    gauge = ray_stats.KeptRayGauge("vllm:test_keeper_gauge", "t", labelnames=["model_name"])
    labelled = gauge.labels("m")
    assert isinstance(labelled, ray_stats.KeptRayGauge)
    labelled.set(0.25)
    assert keeper.refresh() == 1


def test_an_idle_engine_reports_nothing_running_waiting_or_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an aborted last request vLLM takes no step; record_idle zeroes what it set."""
    keeper = GaugeKeeper(background=False)
    monkeypatch.setattr(ray_stats, "KEEPER", keeper)

    def gauge(name: str) -> dict[int, Any]:  # vLLM annotates its own metric types
        g = ray_stats.KeptRayGauge(f"vllm:test_idle_{name}", "t", labelnames=["engine"])
        labelled = g.labels("0")
        assert isinstance(labelled, ray_stats.KeptRayGauge)
        return {0: labelled}

    # The attributes vLLM's PrometheusStatLogger.__init__ makes (its config is not needed).
    logger = object.__new__(ray_stats.KeptRayStatLogger)
    logger.engine_indexes = [0]
    logger.gauge_scheduler_waiting = gauge("waiting")
    logger.gauge_waiting_by_reason = {"capacity": gauge("capacity")}
    running, kv = gauge("running"), gauge("kv")
    logger.gauge_scheduler_running, logger.gauge_kv_cache_usage = running, kv
    for g in (running, kv):
        g[0].set(0.7)  # the busy values of the last step before the abort
    logger.record_idle()
    values = [value for _tags, value in keeper.last_values()]
    assert values == [0.0, 0.0, 0.0, 0.0], values

    class Manager:
        def __init__(self) -> None:
            self.stat_loggers = [object(), logger]

    class Engine:
        def __init__(self) -> None:
            self.logger_manager = Manager()

    assert ray_stats.kept_loggers(Engine()) == [logger]
    assert ray_stats.kept_loggers(object()) == []
