"""``fleetserve top``'s view model: metric snapshots -> the rows it shows (pure).

Snapshots come from exposition text shaped like a real `fleetserve serve` scrape (the
``ray_exposition`` fixture), read through the real :class:`ExpositionSource` parser.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest
from rich.console import Console

from fleetserve.errors import MetricsSourceError
from fleetserve.top.model import Snapshot, build_view, quantile
from fleetserve.top.source import ExpositionSource, PrometheusSource
from fleetserve.top.view import render

Snap = Callable[..., Snapshot]


@pytest.fixture
def snapshot(ray_exposition: Callable[..., str]) -> Snap:
    def make(step: int, at: float, **kwargs: bool) -> Snapshot:
        text = ray_exposition(step, **kwargs)
        client = httpx.Client(
            transport=httpx.MockTransport(lambda _: httpx.Response(200, text=text))
        )
        got = ExpositionSource("http://ray:8080/metrics", client).fetch()
        return Snapshot(at, got.samples)

    return make


def test_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.05: 16.0, 0.1: 20.0, math.inf: 20.0}
    assert quantile(0.5, buckets) == pytest.approx(0.05 * 10 / 16)
    assert quantile(0.99, buckets) == pytest.approx(0.05 + 0.05 * (19.8 - 16) / 4)
    assert quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None  # nothing observed
    assert quantile(0.5, {0.1: 1.0}) is None  # no +Inf bucket: not a histogram
    assert quantile(0.99, {0.1: 1.0, math.inf: 10.0}) == 0.1  # above the last bound


def test_rates_and_quantiles_over_the_interval(snapshot: Snap) -> None:
    view = build_view(snapshot(1, 100.0), snapshot(3, 102.0))
    assert view.interval_s == 2.0
    (alpha,) = view.models
    assert alpha.model == "alpha"  # "unknown" (401s) is not a model
    assert alpha.healthy == 2
    assert alpha.in_flight == 3
    assert alpha.queued == 4
    assert alpha.tokens_per_s == 80  # the engines' generation tokens/s
    assert alpha.errors_per_s == 1  # 5xx/s
    assert alpha.ttft_p50 == pytest.approx(0.03125)
    assert alpha.kv_cache == 0.5
    r1, r2 = alpha.replicas
    assert (r1.replica, r1.state, r1.processing, r1.waiting) == ("r1", "healthy", 2, 1)
    assert r1.tokens_per_s == 40
    assert (r1.kv_cache, r2.kv_cache) == (0.25, 0.5)
    tenants = {t.tenant: t for t in view.tenants}
    assert tenants["team-a"].requests_per_s == 11
    assert tenants["team-a"].tokens_per_s == 150
    assert tenants["team-a"].rejections == {"overload": 1}
    assert tenants["unknown"].rejections == {"auth": 2}


def test_first_frame_shows_gauges_only_and_fake_engines_show_dashes(snapshot: Snap) -> None:
    view = build_view(None, snapshot(3, 0.0, engine=False, kill=True))
    (alpha,) = view.models
    assert alpha.in_flight == 3
    assert alpha.tokens_per_s is None  # no previous snapshot: no rate, not zero
    assert alpha.errors_per_s is None
    assert alpha.healthy == 1
    r1, r2 = alpha.replicas
    assert r2.state == "unhealthy"
    assert r1.kv_cache is None  # the fake engine records no vLLM metrics
    assert r1.waiting is None
    out = Console(record=True, width=140)
    out.print(render(view, "http://ray:8080/metrics"))
    text = out.export_text()
    assert "alpha" in text
    assert "1/2 up" in text
    assert "unhealthy" in text
    assert "first sample" in text
    assert " - " in text


def test_gateway_tokens_when_no_engine_metrics(snapshot: Snap) -> None:
    view = build_view(snapshot(1, 0.0, engine=False), snapshot(2, 1.0, engine=False))
    assert view.models[0].tokens_per_s == 100  # completion tokens/s seen by the gateway


def test_counter_reset_counts_from_zero(snapshot: Snap) -> None:
    view = build_view(snapshot(5, 0.0), snapshot(1, 1.0))  # server restarted
    assert {t.tenant: t.requests_per_s for t in view.tenants}["team-a"] == 11


def test_sources_report_failures_as_messages() -> None:
    down = httpx.Client(
        transport=httpx.MockTransport(lambda r: (_ for _ in ()).throw(httpx.ConnectError("no")))
    )
    with pytest.raises(MetricsSourceError, match="cannot read"):
        ExpositionSource("http://127.0.0.1:9/metrics", down).fetch()
    teapot = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(418)))
    with pytest.raises(MetricsSourceError, match="HTTP 418"):
        ExpositionSource("http://x/metrics", teapot).fetch()
    html = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, text="{}")))
    with pytest.raises(MetricsSourceError, match="like Prometheus"):
        PrometheusSource("http://prom:9090", None, html).fetch()


def test_prometheus_source_asks_for_exactly_the_series_it_reads() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params["query"])
        result = [
            {
                "metric": {
                    "__name__": "ray_fleetserve_gateway_requests_in_flight",
                    "model": "alpha",
                    "namespace": "llm",
                },
                "value": [1700000000.5, "7"],
            }
        ]
        return httpx.Response(200, json={"status": "success", "data": {"result": result}})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    snap = PrometheusSource("http://prom:9090/", {"namespace": "llm"}, client).fetch()
    assert seen[0].startswith('{namespace="llm",__name__=~"')
    assert "ray_vllm_kv_cache_usage_perc" in seen[0]
    assert snap.at == 1700000000.5
    (sample,) = snap.samples
    assert sample.name == "ray_fleetserve_gateway_requests_in_flight"
    assert sample.labels == {"model": "alpha", "namespace": "llm"}
    assert build_view(None, snap).models[0].in_flight == 7
