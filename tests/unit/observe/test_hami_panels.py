"""The GPU-slice panels answer from HAMi's own exposition: every query, evaluated by promtool.

No HAMi runs here (no GPUs, no Kubernetes), so the live test cannot give these panels data.
Instead promtool evaluates each ``kubernetes-hami`` panel query over the series of our
exposition sample of HAMi's vGPU monitor (``tests/fixtures/observe/hami_vgpu_monitor.prom``,
names and labels from HAMi's ``cmd/vGPUmonitor/metrics.go``; checked in ``test_hami.py``),
beside vLLM series of the same engine pods with the target labels the worker PodMonitor adds
(namespace, pod). Each query must return exactly the slice arithmetic the sample implies:
a name or label that does not match HAMi's makes a query return nothing and fails here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.observe import metrics as m
from fleetserve.observe.dashboard import dashboard_panels

PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (.ci/run installs it)"),
]
SAMPLE = Path(__file__).parents[2] / "fixtures" / "observe" / "hami_vgpu_monitor.prom"
MODEL = "gemma"
#: Engine side of each slice's pod: (KV-cache usage, generated tokens per second).
ENGINES = {"x7k2p": (0.3, 10.0), "q9m4z": (0.5, 4.0)}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _hami() -> dict[str, dict[str, dict[str, float]]]:
    """Metric name -> pod -> {"value": ...} of the sample's per-container series."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for family in text_string_to_metric_families(SAMPLE.read_text()):
        for s in family.samples:
            if "pod" in s.labels:
                out.setdefault(s.name, {})[s.labels["pod"]] = {"value": s.value}
    return out


def _input_series() -> tuple[list[dict[str, str]], str]:
    series = []
    namespace = ""
    for family in text_string_to_metric_families(SAMPLE.read_text()):
        for s in family.samples:
            namespace = s.labels.get("namespace", namespace)
            series.append({"series": f"{s.name}{_labels(s.labels)}", "values": f"{s.value}x20"})
    for short, (kv, tokens_per_s) in ENGINES.items():
        pod = next(p for p in _hami()[m.HAMI_VGPU_MEMORY_LIMIT.name] if p.endswith(short))
        engine = {
            "namespace": namespace,
            "pod": pod,
            "model_name": MODEL,
            "engine": "0",
            "ReplicaId": f"r-{short}",
        }
        series.append(
            {"series": f"{m.VLLM_KV_CACHE_USAGE.name}{_labels(engine)}", "values": f"{kv}x20"}
        )
        series.append(
            {
                "series": f"{m.VLLM_GENERATION_TOKENS.name}{_labels(engine)}",
                "values": f"0+{tokens_per_s * 60:g}x20",
            }
        )
    return series, namespace


#: What a target shows, by the first word of its legend found (the bare KV-cache panel has none).
_SHOWS = ("unused", "slice", "used", "KV cache", "cores", "tokens/s")


def _shows(title: str, legend: str) -> str:
    return next((k for k in _SHOWS if k in legend), "KV cache" if "KV cache" in title else "?")


def _expected(shows: str, namespace: str) -> list[dict[str, Any]]:
    """What a slice panel's target must return per engine pod, from the sample's numbers."""
    hami = _hami()
    out = []
    for short, (kv, tokens_per_s) in ENGINES.items():
        pod = next(p for p in hami[m.HAMI_VGPU_MEMORY_LIMIT.name] if p.endswith(short))
        limit = hami[m.HAMI_VGPU_MEMORY_LIMIT.name][pod]["value"]
        used = hami[m.HAMI_VGPU_MEMORY_USED.name][pod]["value"]
        cores = hami[m.HAMI_CONTAINER_CORE_UTILIZATION.name][pod]["value"]
        value = {
            "slice": limit,
            "used": used,
            "unused": limit - used,
            "KV cache": kv,
            "cores": cores,
            "tokens/s": tokens_per_s,
        }[shows]
        labels = {"namespace": namespace, "pod": pod, "model_name": MODEL}
        out.append({"labels": _labels(labels), "value": value})
    return out


def test_every_slice_panel_query_answers_from_hamis_exposition(tmp_path: Path) -> None:
    series, namespace = _input_series()
    panels = [p for p in dashboard_panels() if p.needs == "kubernetes-hami"]
    assert len(panels) >= 4
    tests = []
    for panel in panels:
        for target in panel.targets:
            tests.append(
                {
                    "expr": target.expr.replace("$model", ".*"),
                    "eval_time": "10m",
                    "exp_samples": _expected(_shows(panel.title, target.legend), namespace),
                }
            )
    (tmp_path / "empty.yaml").write_text(yaml.safe_dump({"groups": []}))
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["empty.yaml"],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
            }
        )
    )
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "t.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
