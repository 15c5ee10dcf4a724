"""HAMi's metric names and labels, checked against an exposition sample of its vGPU monitor.

The sample (``tests/fixtures/observe/hami_vgpu_monitor.prom``) is written from HAMi's own
descriptors (cmd/vGPUmonitor/metrics.go); the test reads it with prometheus-client's parser
and ``promtool check metrics``, so a rename on our side, or a wrong label the slice join
depends on (namespace, pod, container), fails here. The rendered monitor for HAMi keeps
those labels (``honorLabels``), and the worker pods carry the model label.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.k8s.render.monitoring import HAMI_MONITOR_PORT_NAME, hami_service_monitor
from fleetserve.observe import metrics as m
from fleetserve.observe.dashboard import ENGINE_CONTAINER
from fleetserve.spec import parse_spec

SAMPLE = Path(__file__).parents[2] / "fixtures" / "observe" / "hami_vgpu_monitor.prom"
HAMI = [x for x in m.ALL_METRICS if x.source == "hami"]


def _families() -> dict[str, tuple[str, list[dict[str, str]]]]:
    return {
        f.name: (f.type, [s.labels for s in f.samples])
        for f in text_string_to_metric_families(SAMPLE.read_text())
    }


def test_every_hami_metric_we_query_is_in_the_sample_with_its_labels() -> None:
    families = _families()
    assert HAMI
    for metric in HAMI:
        assert metric.name in families, metric.name
        kind, samples = families[metric.name]
        assert kind == metric.kind
        for labels in samples:
            assert set(labels) == set(metric.labels), (metric.name, labels)


def test_container_series_name_the_engine_pod_and_container() -> None:
    _kind, samples = _families()[m.HAMI_VGPU_MEMORY_LIMIT.name]
    assert {s["container"] for s in samples} == {ENGINE_CONTAINER}
    assert all(s["namespace"] and s["pod"] for s in samples)


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_sample_is_valid_exposition() -> None:
    done = subprocess.run(
        ["promtool", "check", "metrics"],
        input=SAMPLE.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # promtool exits 3 for lint findings only (e.g. naming advice); 1 for parse errors.
    assert done.returncode in (0, 3), done.stdout + done.stderr
    assert "error" not in (done.stdout + done.stderr).lower()


def test_hami_service_monitor_keeps_the_engine_pod_labels() -> None:
    spec = parse_spec({"models": [{"name": "m", "source": "fake"}]})
    monitor = hami_service_monitor(spec, {"release": "kps"}, hami_namespace="kube-system")
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    endpoint = monitor["spec"]["endpoints"][0]
    # Without honorLabels Prometheus renames HAMi's namespace/pod to exported_*: no join.
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == HAMI_MONITOR_PORT_NAME
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kube-system"]}
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/component": "hami-device-plugin"
    }
    # Only this fleet's engine pods' series are kept (a shared HAMi serves many namespaces).
    keep = endpoint["metricRelabelings"][0]
    assert keep["action"] == "keep"
    assert keep["sourceLabels"] == ["namespace"]
    assert keep["regex"] == spec.kubernetes.namespace
