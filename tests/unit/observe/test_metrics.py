"""The metric names in fleetserve.observe are the ones Ray really exports.

Two checks: (1) each recorded name and kind is what the installed vLLM / Ray Serve code
records (read from their sources, so an upstream rename fails here); (2) recording through
the real Ray metrics pipeline (vLLM's Ray wrappers, ``ray.util.metrics``) and scraping Ray's
Prometheus endpoint yields exactly the exported series names the dashboards and alerts use.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import ray.serve
import vllm.v1.metrics.loggers
from vllm.v1.metrics.ray_wrappers import RayPrometheusMetric

from fleetserve.observe import metrics as m

_KIND = {"gauge": "Gauge", "counter": "Counter", "histogram": "Histogram"}


def _vllm_recorded() -> dict[str, str]:
    source = Path(vllm.v1.metrics.loggers.__file__).read_text()
    found = re.findall(
        r"self\._(gauge|counter|histogram)_cls\(\s*name=\"(vllm:[a-z0-9_]+)\"", source
    )
    return {name: kind for kind, name in found}


def _serve_recorded() -> dict[str, str]:
    pattern = re.compile(
        r"metrics\.(Counter|Gauge|Histogram)\(\s*(?:name=)?f?\"(serve_[a-z_{}]+)\""
    )
    found: dict[str, str] = {}
    for path in Path(ray.serve.__file__).parent.joinpath("_private").glob("*.py"):
        for kind, name in pattern.findall(path.read_text()):
            found[name.replace("{protocol_name}", "http")] = kind.lower()
    return found


def test_vllm_metrics_exist_in_vllm_with_their_kind() -> None:
    recorded = _vllm_recorded()
    for metric in m.ALL_METRICS:
        if metric.source == "vllm":
            assert recorded.get(metric.recorded) == metric.kind, metric.recorded


def test_serve_metrics_exist_in_ray_serve_with_their_kind() -> None:
    recorded = _serve_recorded()
    for metric in m.ALL_METRICS:
        if metric.source == "serve":
            assert recorded.get(metric.recorded) == metric.kind, metric.recorded


def _through_ray() -> list[m.PromMetric]:
    return [x for x in m.ALL_METRICS if x.source != "hami"]


def test_name_translation_matches_vllms_ray_wrapper() -> None:
    for metric in _through_ray():
        sanitized = RayPrometheusMetric._get_sanitized_opentelemetry_name(metric.recorded)
        base = metric.name.removesuffix("_total") if metric.kind == "counter" else metric.name
        if metric.recorded.endswith("_total"):
            base = metric.name
        assert base == f"ray_{sanitized}"


_SCRAPE = r"""
import json, socket, sys, time, urllib.request
import ray
from ray.util import metrics as ray_metrics

if __name__ == "__main__":
    wanted = json.loads(sys.argv[1])
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ray.init(num_cpus=1, include_dashboard=False, _metrics_export_port=port,
             configure_logging=False, log_to_driver=False)

    @ray.remote
    def record(wanted):
        from vllm.v1.metrics.ray_wrappers import (
            RayCounterWrapper, RayGaugeWrapper, RayHistogramWrapper)
        vllm_cls = {"counter": RayCounterWrapper, "gauge": RayGaugeWrapper,
                    "histogram": RayHistogramWrapper}
        keep = []
        for name, kind, source in wanted:
            if source == "vllm":
                kw = {"buckets": [0.1, 1.0]} if kind == "histogram" else {}
                metric = vllm_cls[kind](name, "t", labelnames=["model_name"], **kw)
                labeled = metric.labels("m")
            else:
                cls = {"counter": ray_metrics.Counter, "gauge": ray_metrics.Gauge,
                       "histogram": ray_metrics.Histogram}[kind]
                kw = {"boundaries": [1.0, 10.0]} if kind == "histogram" else {}
                labeled = cls(name, description="t", tag_keys=("application",), **kw)
                labeled.set_default_tags({"application": "a"})
            {"counter": lambda x: x.inc(1), "gauge": lambda x: x.set(1),
             "histogram": lambda x: x.observe(0.5)}[kind](labeled)
            keep.append(labeled)
        time.sleep(30)
        return len(keep)

    ref = record.remote(wanted)
    names = set()
    deadline = time.time() + 90
    while time.time() < deadline:
        time.sleep(2)
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        except OSError:
            continue
        names = {line.split("{")[0].split(" ")[0] for line in text.decode().splitlines()
                 if line.startswith(("ray_vllm_", "ray_serve_", "ray_fleetserve_"))}
        if len(names) >= len(wanted):
            break
    print("NAMES=" + json.dumps(sorted(names)))
    ray.cancel(ref, force=True)
    ray.shutdown()
"""


@pytest.mark.usefixtures("own_ray")  # a Ray cluster of its own, in a subprocess
@pytest.mark.timeout(300)
def test_ray_exports_exactly_these_series(tmp_path: Path) -> None:
    script = tmp_path / "scrape.py"
    script.write_text(_SCRAPE)
    wanted = [[x.recorded, x.kind, x.source] for x in _through_ray()]
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("NAMES=")]
    assert lines, f"scrape failed (rc {done.returncode}): {done.stderr[-2000:]}"
    exported = set(json.loads(lines[0][len("NAMES=") :]))
    hami = {x.name for x in m.ALL_METRICS if x.source == "hami"}
    missing = m.exported_series_names() - exported - hami
    assert not missing, f"not exported by Ray: {sorted(missing)}; got {sorted(exported)}"
