"""Ray's own tooling deploys the app from a Serve config (``import_path`` + ``args``), as a
RayService's ``serveConfigV2`` does: ``serve run config.yaml`` with the builder
``fleetserve.serve.control.app:build_app``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_serve_run_with_a_serve_config(tmp_path: Path, servers: Any) -> None:
    port = servers.free_port()
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "fleetserve",
                "route_prefix": "/",
                "import_path": "fleetserve.serve.control.app:build_app",
                "args": {
                    "spec": {
                        "models": [
                            {"name": "m1", "source": "fake", "resources": {"cpu": 0.5}},
                            {"name": "m2", "source": "fake", "resources": {"cpu": 0.5}},
                        ]
                    },
                    "engine": "fake",
                    "engine_settings": {
                        name: {
                            "gpu_memory_utilization": 0.1,
                            "max_num_seqs": 8,
                            "max_model_len": 256,
                            "max_num_batched_tokens": 256,
                        }
                        for name in ("m1", "m2")
                    },
                },
            }
        ],
    }
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    serve_cli = str(Path(sys.executable).parent / "serve")
    server = servers.Process("serve run", [serve_cli, "run", str(path)], tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(f"{url}/ready", timeout_s=600)
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["m1", "m2"]
        assert models["data"][0]["max_model_len"] == 256
        for name in ("m1", "m2"):
            r = httpx.post(
                f"{url}/v1/completions",
                json={"model": name, "prompt": "x", "max_tokens": 3},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            assert r.json()["model"] == name
        too_long = httpx.post(
            f"{url}/v1/completions",
            json={"model": "m1", "prompt": "x", "max_tokens": 1000},
            timeout=30,
        )
        assert too_long.status_code == 400
    finally:
        server.stop()
    log = server.log.read_text()
    assert "model-m1" in log
    assert "model-m2" in log
