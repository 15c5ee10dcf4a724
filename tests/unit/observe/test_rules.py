"""Alert rules checked and unit-tested by Prometheus's own promtool.

``promtool check rules`` validates every expression and annotation template; ``promtool test
rules`` replays synthetic series (named as Ray exports them) and asserts which alerts fire
and which stay silent on a healthy fleet.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.observe.alerts import AlertThresholds, alert_rules, rule_groups
from fleetserve.observe.dashboard import dashboard_queries
from fleetserve.observe.metrics import exported_series_names

PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(
        PROMTOOL is None,
        reason="promtool not found: install Debian's 'prometheus' package (.ci/run does)",
    ),
]
NS = {"namespace": "llm"}
L = 'namespace="llm"'


def _promtool(*args: str, cwd: Path) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(NS)))
    out = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    # promtool has no "check expression"; recording rules make it parse each query.
    queries = dashboard_queries(NS)
    rules = [
        {"record": f"fleetserve:dashboard_query_{i}", "expr": q.replace("$model", ".*")}
        for i, q in enumerate(queries)
    ]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    _promtool("check", "rules", "q.yaml", cwd=tmp_path)


def test_queries_only_name_exported_metrics() -> None:
    known = exported_series_names()
    exprs = [r.expr for r in alert_rules(NS)] + dashboard_queries(NS)
    for expr in exprs:
        for name in set(re.findall(r"\b(ray_[a-z0-9_]+)", expr)):
            assert name in known, f"{name} in {expr!r} is not a metric of observe.metrics"


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    tags = ",".join([L, *(f'{k}="{v}"' for k, v in sorted(labels.items()))])
    return {"series": f"{name}{{{tags}}}", "values": values}


def _alert(name: str, at: str, labels: list[dict[str, str]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": x} for x in labels]}


GIB = 1024**3
#: Thresholds of the promtool tests: slice sizing judged over 10m instead of 1h.
THRESHOLDS = AlertThresholds(for_sizing="10m")


def _slice(pod: str, limit_gib: float, used_gib: float, cores: float) -> list[dict[str, str]]:
    ctr = {"pod": pod, "container": "ray-worker", "vdevice_index": "0", "device_uuid": "GPU-1"}
    return [
        _series("hami_vgpu_memory_limit_bytes", f"{limit_gib * GIB:.0f}x40", **ctr),
        _series("hami_vgpu_memory_used_bytes", f"{used_gib * GIB:.0f}x40", **ctr),
        _series("hami_container_device_utilization_ratio", f"{cores:g}x40", **ctr),
    ]


def _engine_pod(pod: str, kv: float, waiting: int) -> list[dict[str, str]]:
    labels = {"pod": pod, "model_name": "m", "ReplicaId": f"r-{pod}"}
    return [
        _series("ray_vllm_kv_cache_usage_perc", f"{kv:g}x40", **labels),
        _series("ray_vllm_num_requests_waiting", f"{waiting}x40", **labels),
    ]


def _sick_fleet() -> list[dict[str, str]]:
    ttft = "ray_vllm_time_to_first_token_seconds_bucket"
    http = "ray_fleetserve_gateway_requests_total"
    gw = {"model": "m", "tenant": "t", "endpoint": "/v1/completions"}
    return [
        # p1: slice 18 GiB, engine uses 11 GiB, KV cache 30 % full: over-provisioned.
        *_slice("p1", 18, 11, 40),
        *_engine_pod("p1", 0.3, 0),
        # p2: slice nearly full and cores pinned with requests waiting.
        *_slice("p2", 8, 7.9, 97),
        *_engine_pod("p2", 0.9, 3),
        _series(
            "ray_fleetserve_gateway_rejections_total",
            "0+5x40",
            model="m",
            tenant="t",
            reason="overload",
        ),
        _series(ttft, "0+0x40", le="1.0", model_name="m", ReplicaId="r1"),
        _series(ttft, "0+10x40", le="5.0", model_name="m", ReplicaId="r1"),
        _series(ttft, "0+10x40", le="+Inf", model_name="m", ReplicaId="r1"),
        _series("ray_vllm_kv_cache_usage_perc", "0.99x40", model_name="m", ReplicaId="r1"),
        _series("ray_vllm_kv_cache_usage_perc", "0.10x40", model_name="m", ReplicaId="r2"),
        _series("ray_vllm_num_requests_waiting", "7x40", model_name="m", ReplicaId="r1"),
        _series(http, "0+100x40", status_code="200", **gw),
        _series(http, "0+20x40", status_code="503", **gw),
        _series(
            "ray_serve_deployment_status", "2x40", application="fleetserve", deployment="model-m"
        ),
        _series("ray_serve_application_status", "1x40", application="fleetserve"),
        _series(
            "ray_serve_deployment_replica_healthy",
            "1x40",
            application="fleetserve",
            deployment="model-m",
        ),
        _series(
            "ray_serve_autoscaling_target_replicas",
            "3x40",
            application="fleetserve",
            deployment="model-m",
        ),
        _series(
            "ray_serve_health_check_failures_total",
            "0+1x40",
            application="fleetserve",
            deployment="model-m",
        ),
        _series(
            "ray_serve_health_check_failures_total",
            "_x30 1x10",
            application="fleetserve",
            deployment="model-n",
            replica="r9",
        ),
    ]


def _healthy_fleet() -> list[dict[str, str]]:
    ttft = "ray_vllm_time_to_first_token_seconds_bucket"
    http = "ray_fleetserve_gateway_requests_total"
    gw = {"model": "m", "tenant": "t", "endpoint": "/v1/completions"}
    return [
        *_slice("p1", 18, 16, 50),
        *_engine_pod("p1", 0.6, 0),
        _series(ttft, "0+10x40", le="1.0", model_name="m", ReplicaId="r1"),
        _series(ttft, "0+10x40", le="5.0", model_name="m", ReplicaId="r1"),
        _series(ttft, "0+10x40", le="+Inf", model_name="m", ReplicaId="r1"),
        _series("ray_vllm_kv_cache_usage_perc", "0.5x40", model_name="m", ReplicaId="r1"),
        _series("ray_vllm_num_requests_waiting", "0x40", model_name="m", ReplicaId="r1"),
        _series(http, "0+100x40", status_code="200", **gw),
        _series(http, "0+1x40", status_code="500", **gw),
        _series(
            "ray_serve_deployment_status", "6x40", application="fleetserve", deployment="model-m"
        ),
        _series("ray_serve_application_status", "6x40", application="fleetserve"),
        _series(
            "ray_serve_deployment_replica_healthy",
            "3x40",
            application="fleetserve",
            deployment="model-m",
        ),
        _series(
            "ray_serve_autoscaling_target_replicas",
            "3x40",
            application="fleetserve",
            deployment="model-m",
        ),
        _series(
            "ray_serve_health_check_failures_total",
            "4x40",
            application="fleetserve",
            deployment="model-m",
        ),
        # Another fleet's namespace must not page this one.
        {
            "series": 'ray_serve_deployment_status{namespace="other",application="x"}',
            "values": "1x40",
        },
    ]


def test_alerts_fire_on_a_sick_fleet_and_stay_silent_on_a_healthy_one(tmp_path: Path) -> None:
    groups = rule_groups(NS, THRESHOLDS)
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # templates are checked by `check rules`; compare labels
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    dep = {"application": "fleetserve", "deployment": "model-m"}
    sick = [
        _alert(
            "FleetServeHighTimeToFirstToken", "20m", [{"severity": "warning", "model_name": "m"}]
        ),
        _alert("FleetServeKVCacheNearlyFull", "20m", [{"severity": "warning", "model_name": "m"}]),
        _alert("FleetServeRequestsWaiting", "20m", [{"severity": "warning", "model_name": "m"}]),
        _alert("FleetServeHigh5xxRate", "20m", [{"severity": "critical", "model": "m"}]),
        _alert(
            "FleetServeRequestsRejected",
            "20m",
            [{"severity": "warning", "model": "m", "reason": "overload"}],
        ),
        _alert(
            "FleetServeSliceOverProvisioned",
            "20m",
            [{"severity": "info", "namespace": "llm", "pod": "p1", "model_name": "m"}],
        ),
        _alert(
            "FleetServeSliceMemoryFull",
            "20m",
            [{"severity": "warning", "namespace": "llm", "pod": "p2", "model_name": "m"}],
        ),
        _alert(
            "FleetServeSliceCoresSaturated",
            "20m",
            [{"severity": "warning", "namespace": "llm", "pod": "p2", "model_name": "m"}],
        ),
        _alert(
            "FleetServeDeploymentUnhealthy",
            "20m",
            [{"severity": "critical", **dep, **{"namespace": "llm"}}],
        ),
        _alert(
            "FleetServeApplicationUnhealthy",
            "20m",
            [{"severity": "critical", "application": "fleetserve", "namespace": "llm"}],
        ),
        _alert("FleetServeReplicasBelowTarget", "20m", [{"severity": "warning", **dep}]),
        _alert("FleetServeReplicaHealthChecksFailing", "20m", [{"severity": "warning", **dep}]),
        # A replica that crashed once: its failure counter is a new series at 1.
        _alert(
            "FleetServeReplicaHealthChecksFailing",
            "33m",
            [
                {"severity": "warning", **dep},
                {"severity": "warning", "application": "fleetserve", "deployment": "model-n"},
            ],
        ),
        # Before its `for:` has elapsed, a saturation alert is still pending.
        _alert("FleetServeKVCacheNearlyFull", "5m", []),
    ]
    names = {rule.alert for rule in alert_rules()}
    assert {t["alertname"] for t in sick} == names
    healthy = [_alert(name, "20m", []) for name in sorted(names)]
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": _sick_fleet(), "alert_rule_test": sick},
            {"interval": "1m", "input_series": _healthy_fleet(), "alert_rule_test": healthy},
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    out = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert "SUCCESS" in out
