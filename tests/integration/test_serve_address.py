"""`fleetserve serve --address ...` joins a running Ray cluster: the fit is checked against
that cluster, and on SIGTERM only the application is removed - the cluster keeps running."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# A driver that owns a local Ray cluster with 3 logical CPUs and prints its GCS address.
HEAD = """
import sys, time, ray
ray.init(num_cpus=3, include_dashboard=False)
print("GCS", ray.get_runtime_context().gcs_address, flush=True)
while True:
    time.sleep(1)
"""


# Ray enables token auth on a local ray.init() cluster; a driver joining it by explicit
# address must opt in (the token itself is in ~/.ray/auth_token).
JOIN_ENV = {"RAY_AUTH_MODE": "token"}


def test_join_existing_cluster_and_leave_it_running(tmp_path: Path, servers: Any) -> None:
    head = servers.Process("ray head", [sys.executable, "-c", HEAD], tmp_path / "head.log")
    try:
        line = wait_until(
            lambda: next((ln for ln in head.tail().splitlines() if ln.startswith("GCS ")), None),
            300,
            "the Ray head",
        )
        address = line.split()[1]

        # Too big for this 3-CPU cluster: refused with the cluster's arithmetic, exit 2.
        spec = tmp_path / "big.yaml"
        spec.write_text(
            "models:\n"
            "  - {name: m, source: fake, resources: {cpu: 2}, replicas: {min: 2, max: 2}}\n"
        )
        big = servers.Process(
            "fleetserve big",
            servers.fleetserve_argv(str(spec), "--address", address, "--engine", "fake"),
            tmp_path / "big.log",
            env=JOIN_ENV,
        )
        assert big.proc.wait(300) == 2
        big.close()
        assert "the Ray cluster (1 node) has 3" in big.log.read_text()

        port = servers.free_port()
        serve = servers.Process(
            "fleetserve joined",
            servers.fleetserve_argv("--address", address, "--engine", "fake", "--port", str(port)),
            tmp_path / "serve.log",
            env=JOIN_ENV,
        )
        url = f"http://127.0.0.1:{port}"
        serve.wait_ready(f"{url}/ready", timeout_s=600, log_line=servers.ready_line)
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": "gemma-3-270m", "prompt": "x", "max_tokens": 2},
            timeout=30,
        )
        assert r.status_code == 200
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(120) == 0
        serve.close()
        assert head.proc.poll() is None, "the joined cluster must survive fleetserve"
    finally:
        head.stop()
