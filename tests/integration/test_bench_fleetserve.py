"""``fleetserve bench`` against fleetserve itself with the real engine (Gemma 3 270M).

Runs the CLI as users do (a subprocess) against the session's fleetserve server
(``fleetserve_url`` fixture from tests/integration/conftest.py, owned by serve).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

MODEL = "gemma-3-270m"
MODEL_DIR = Path.home() / ".cache" / "fleetserve" / "models" / MODEL


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetserve.cli", "bench", "--no-progress", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_against_fleetserve(fleetserve_url: str, tmp_path: Path) -> None:
    out, results = tmp_path / "run.json", tmp_path / "results.jsonl"
    tokenizer = ["--tokenizer", str(MODEL_DIR)] if (MODEL_DIR / "tokenizer.json").exists() else []
    proc = bench(
        "--base-url", fleetserve_url,
        "--model", MODEL,
        "--concurrency", "1,2",
        "--num-requests", "4",
        "--warmup", "1",
        "--input-len", "32",
        "--output-len", "8",
        "--output", str(out),
        "--results", str(results),
        *tokenizer,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "c=2" in proc.stdout  # the summary table
    report = json.loads(out.read_text())
    assert [p["label"] for p in report["points"]] == ["c=1", "c=2"]
    for point in report["points"]:
        assert point["succeeded"] == 4, point["error_examples"]
        assert point["ttft"]["p50"] > 0
        assert point["output_throughput"] > 0
    records = [r for r in report["records"] if not r["warmup"]]
    assert all(r["ok"] and r["ttft"] <= r["e2e"] for r in records)
    if report["run"]["ignore_eos"]:  # vLLM honours it: every output has the asked length
        assert all(r["usage_out"] == 8 for r in records)
    if tokenizer:
        assert report["run"]["tokens_source"].startswith("tokenizer")
        assert report["run"]["prompt_lengths"] == "exact (tokenizer)"
    else:
        assert report["run"]["tokens_source"] == "server usage"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 10
    assert all(row["response"] for row in rows if row["ok"])


def test_wrong_model_against_fleetserve(fleetserve_url: str) -> None:
    proc = bench("--base-url", fleetserve_url, "--model", "no-such-model", "--num-requests", "1")
    assert proc.returncode == 1
    assert "no-such-model" in proc.stderr
    assert "Traceback" not in proc.stderr
