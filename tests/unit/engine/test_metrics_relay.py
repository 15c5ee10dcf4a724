"""The relay of a ``vllm serve``'s engine metrics to Ray's (``frontend: process``): the pure
core over Prometheus text of the server's shape. The whole path - the real server's text,
``ray.util.metrics`` in the replica, Ray's exporter - is in
tests/integration/test_serve_frontend_process.py."""

from __future__ import annotations

import logging

import pytest

from fleetserve.engine.metrics_relay import MetricsRelay, Record, place
from fleetserve.observe.metrics import (
    VLLM_PROMPT_TOKENS,
    VLLM_REQUESTS_RUNNING,
    VLLM_TTFT,
    ray_exported_name,
    ray_metric_name,
)


def exposition(
    running: float, prompt: float, buckets: tuple[float, float, float], total: float
) -> str:
    """A ``vllm serve``'s /metrics as prometheus_client writes it (HELP, TYPE, counters
    with ``_created``, a histogram's cumulative buckets), plus the server's own series."""
    low, mid, inf = buckets
    lab = 'engine="0",model_name="m"'
    return f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 512.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{lab}}} {running}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{lab}}} {prompt}
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{{lab}}} 1.7650e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{{lab}}} {total}
vllm:time_to_first_token_seconds_bucket{{{lab},le="0.1"}} {low}
vllm:time_to_first_token_seconds_bucket{{{lab},le="1.0"}} {mid}
vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {inf}
vllm:time_to_first_token_seconds_count{{{lab}}} {inf}
"""


def by_name(records: list[Record]) -> dict[str, Record]:
    return {r.series.name: r for r in records}


def test_each_kind_is_recorded_as_vllms_ray_logger_records_it() -> None:
    relay = MetricsRelay("replica-1")
    first = by_name(relay.read(exposition(2, 120, (1, 2, 2), 0.5)))
    # only vLLM's families, under the names Ray exports as the dashboards read them
    names = {"vllm_num_requests_running", "vllm_prompt_tokens", "vllm_time_to_first_token_seconds"}
    assert set(first) == names
    for metric in (VLLM_REQUESTS_RUNNING, VLLM_PROMPT_TOKENS, VLLM_TTFT):
        assert ray_exported_name(
            first[ray_metric_name(metric.recorded)].series.name, metric.kind
        ) == (metric.name)
    gauge = first["vllm_num_requests_running"]
    assert gauge.series.kind == "gauge"
    assert gauge.value == 2
    assert dict(gauge.tags) == {"engine": "0", "model_name": "m", "ReplicaId": "replica-1"}
    assert gauge.series.tag_keys == ("engine", "model_name", "ReplicaId")
    assert first["vllm_prompt_tokens"].value == 120  # all of it is new at the first read
    ttft = first["vllm_time_to_first_token_seconds"]
    assert ttft.series.boundaries == (0.1, 1.0)
    assert sum(n for _, n in ttft.observations) == 2
    assert sum(v * n for v, n in ttft.observations) == pytest.approx(0.5)
    # the next read: increases only; a gauge is set again even when unchanged
    second = by_name(relay.read(exposition(2, 200, (1, 3, 4), 3.5)))
    assert second["vllm_num_requests_running"].value == 2
    assert second["vllm_prompt_tokens"].value == 80
    obs = second["vllm_time_to_first_token_seconds"].observations
    assert [n for _, n in obs] == [1, 1]  # one more in (0.1, 1], one beyond 1 s
    assert 0.1 < obs[0][0] <= 1.0
    assert obs[1][0] >= 1.0
    assert sum(v * n for v, n in obs) == pytest.approx(3.0)
    # nothing new: no counter or histogram record
    third = by_name(relay.read(exposition(0, 200, (1, 3, 4), 3.5)))
    assert set(third) == {"vllm_num_requests_running"}
    assert third["vllm_num_requests_running"].value == 0


def test_a_server_that_started_again_counts_from_zero() -> None:
    relay = MetricsRelay()
    relay.read(exposition(0, 500, (5, 5, 5), 0.2))
    again = by_name(relay.read(exposition(0, 30, (1, 1, 1), 0.05)))
    assert again["vllm_prompt_tokens"].value == 30
    assert again["vllm_time_to_first_token_seconds"].observations == ((0.05, 1),)


def test_observations_sit_in_their_buckets_and_add_up_to_the_sum() -> None:
    bounds = (0.01, 0.1, 1.0)
    # two in (0, 0.01], three in (0.1, 1]: a sum of 1.5 puts each at 0.3 of its bucket
    obs = place(bounds, (2, 0, 3, 0), 0.006 + 1.5 - 0.006)
    assert [n for _, n in obs] == [2, 3]
    assert obs[0][0] <= 0.01
    assert 0.1 < obs[1][0] <= 1.0
    assert sum(v * n for v, n in obs) == pytest.approx(1.5)
    # a sum the buckets cannot give (rounded on the server) stays inside them
    low = place(bounds, (0, 0, 3, 0), 0.0)
    assert all(0.1 < v <= 1.0 for v, _ in low)
    high = place(bounds, (0, 0, 3, 0), 99.0)
    assert all(v == 1.0 for v, _ in high)


def test_a_family_whose_labels_change_is_no_longer_relayed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = MetricsRelay()
    relay.read(exposition(1, 1, (0, 0, 0), 0))
    changed = exposition(1, 2, (0, 0, 0), 0).replace(
        'vllm:num_requests_running{engine="0",model_name="m"}',
        'vllm:num_requests_running{engine="0",model_name="m",lora="a"}',
    )
    with caplog.at_level(logging.WARNING):
        got = by_name(relay.read(changed))
        relay.read(changed)
    assert "vllm_num_requests_running" not in got  # Ray fixed its tag keys when it was made
    assert got["vllm_prompt_tokens"].value == 1
    assert caplog.text.count("vllm:num_requests_running changed its labels") == 1


def test_text_that_is_not_prometheus_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert MetricsRelay().read("vllm:x{engine=0 1\n") == []
    assert "could not be parsed" in caplog.text


def test_a_family_without_samples_yet_is_made_when_its_first_child_appears() -> None:
    """prometheus_client writes a labelled metric with no child as its HELP and TYPE only:
    its labels are unknown until a child appears, so the series is made then."""
    empty = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
"""
    relay = MetricsRelay("r")
    assert relay.read(empty) == []
    child = (
        empty + 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0\n'
    )
    [record] = relay.read(child)
    assert record.series.tag_keys == ("engine", "finished_reason", "model_name", "ReplicaId")
    assert record.value == 2
