"""``fleetserve bench`` and ``fleetserve bench compare`` end to end against the fake server:
the files users get, the error messages they see, and exit codes (never a traceback)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetserve.bench.report import BenchReport
from fleetserve.cli import main

from .fake_openai import FakeOpenAIServer


def bench(url: str, *args: str) -> int:
    return main(["bench", "--base-url", url, "--model", "fake-model", "--no-progress", *args])


def test_sweep_writes_json_markdown_plots(fake_server: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_server.reset(fail_every=7)
    out, md, plots = tmp_path / "run.json", tmp_path / "run.md", tmp_path / "plots"
    rc = bench(
        fake_server.url,
        "--concurrency", "1,4",
        "--num-requests", "20",
        "--warmup", "2",
        "--input-len", "16",
        "--output-len", "5",
        "--slo", "ttft=5s",
        "--output", str(out),
        "--markdown", str(md),
        "--plots", str(plots),
    )  # fmt: skip
    assert rc == 0
    report = BenchReport.load(out)
    assert [p.label for p in report.points] == ["c=1", "c=4"]
    assert len(report.records) == 2 * 22  # every request, warm-up included and flagged
    assert sum(r["warmup"] for r in report.records) == 4
    for p in report.points:
        assert p.requests == 20
        assert p.succeeded + p.failed == 20
        assert p.failed >= 2
        assert set(p.errors_by_status) == {"500"}
        assert p.goodput is not None
    failed = [r for r in report.records if not r["ok"]]
    assert all(r["error_type"] == "http_error" and r["status"] == 500 for r in failed)
    ok = [r for r in report.records if r["ok"]]
    assert all(r["tokens_out"] == 5 and len(r["itl"]) == 4 for r in ok)
    assert all(set(r) >= {"start", "ttft", "itl", "e2e", "tokens_in", "tokens_out"} for r in ok)
    assert report.run.tokens_source == "server usage"
    assert report.run.ignore_eos is True
    assert report.run.prompt_lengths == "approximate"
    assert all(b.get("ignore_eos") for b in fake_server.bodies)
    text = md.read_text()
    assert "| c=4 |" in text
    assert "## Errors" in text
    assert (plots / "latency_cdf.png").read_bytes()[:4] == b"\x89PNG"
    assert (plots / "throughput.png").exists()


def test_results_file_matches_prompts(fake_server: FakeOpenAIServer, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    lines = ["what is ray serve", "explain kv cache paging", "why slice gpus"]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    results = tmp_path / "results.txt"
    rows = tmp_path / "results.jsonl"
    assert bench(fake_server.url, "--prompts", str(prompts), "--output-len", "3",
                 "--results", str(results)) == 0  # fmt: skip
    text = results.read_text()
    for line in lines:
        first3 = " ".join(line.split()[:3])
        assert f"Prompt: {line}\nResponse: {first3} \n" in text
    assert bench(fake_server.url, "--prompts", str(prompts), "--output-len", "2",
                 "--concurrency", "3", "--results", str(rows)) == 0  # fmt: skip
    got = [json.loads(x) for x in rows.read_text().splitlines()]
    assert sorted(r["prompt"] for r in got) == sorted(lines)
    for r in got:
        assert r["response"].split() == r["prompt"].split()[:2]


def test_tokenizer_counts_and_ignore_eos_rejected(
    fake_server: FakeOpenAIServer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    fake_server.reset(accept_ignore_eos=False)
    out = tmp_path / "run.json"
    assert bench(fake_server.url, "--tokenizer", str(tokenizer_dir), "--endpoint", "completions",
                 "--num-requests", "4", "--input-len", "20", "--output", str(out)) == 0  # fmt: skip
    report = BenchReport.load(out)
    assert report.run.tokens_source.startswith("tokenizer (")
    assert report.run.prompt_lengths == "exact (tokenizer)"
    assert report.run.ignore_eos is False
    assert "rejected" in report.run.ignore_eos_note
    assert all(r["tokens_in"] == 20 for r in report.records)
    assert all("ignore_eos" not in b for b in fake_server.bodies[-4:])


def test_rate_and_duration(fake_server: FakeOpenAIServer, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    assert bench(fake_server.url, "--rate", "50", "--duration", "0.5s", "--output-len", "2",
                 "--output", str(out)) == 0  # fmt: skip
    report = BenchReport.load(out)
    assert report.points[0].label == "rate=50"
    assert 5 <= report.points[0].requests <= 60


def test_the_report_records_the_sampling_every_request_set(
    fake_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    # what a replay of the run needs to price the engine's sampler (fleetserve.sampling)
    out = tmp_path / "run.json"
    extra = '{"temperature": 0, "top_p": 0.9, "seed": 7, "stop": ["x"]}'
    assert bench(fake_server.url, "--num-requests", "2", "--output-len", "2",
                 "--extra-body", extra, "--output", str(out)) == 0  # fmt: skip
    assert BenchReport.load(out).run.sampling == {"temperature": 0.0, "top_p": 0.9}
    assert all(b["temperature"] == 0 for b in fake_server.bodies[-2:])
    plain = tmp_path / "plain.json"
    assert bench(fake_server.url, "--num-requests", "2", "--output-len", "2",
                 "--output", str(plain)) == 0  # fmt: skip
    assert BenchReport.load(plain).run.sampling == {}


def test_compare(
    fake_server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cmp.md"
    assert (
        bench(fake_server.url, "--num-requests", "6", "--output-len", "4", "--output", str(a)) == 0
    )
    fake_server.reset(itl_s=0.02)
    assert bench(fake_server.url, "--num-requests", "6", "--output-len", "4", "--output", str(b),
                 "--label", "slower") == 0  # fmt: skip
    capsys.readouterr()
    assert main(["bench", "compare", str(a), str(b), "--markdown", str(md)]) == 0
    shown = capsys.readouterr().out
    assert "TPOT p50 ms" in shown
    assert "worse" in shown
    table = md.read_text()
    assert "| c=1 | TPOT p50 ms |" in table
    row = next(line for line in table.splitlines() if "| c=1 | TPOT p50 ms |" in line)
    assert row.endswith("| worse |")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_url_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench(f"http://127.0.0.1:{free_port()}")
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("fleetserve: error: cannot connect to http://127.0.0.1:")
    assert "Traceback" not in err


def test_wrong_model_lists_served_models(
    fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["bench", "--base-url", fake_server.url, "--model", "llama", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "model 'llama' is not served" in err
    assert "fake-model" in err


def test_wrong_model_without_models_route(
    fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_server.reset(models_route=False)
    rc = main(["bench", "--base-url", fake_server.url, "--model", "llama", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "HTTP 404" in err
    assert "does not exist" in err


def test_all_requests_failing_is_an_error_after_the_report(
    fake_server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_server.reset(stream_error_after=0)
    out = tmp_path / "run.json"
    rc = bench(fake_server.url, "--num-requests", "3", "--output", str(out))
    assert rc == 1
    assert "all 3 requests failed" in capsys.readouterr().err
    assert BenchReport.load(out).points[0].errors_by_type == {"stream_error": 3}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--model", "m"], "needs --base-url and --model"),
        (
            ["bench", "--base-url", "http://x", "--model", "m", "--concurrency", "0"],
            "--concurrency",
        ),
        (["bench", "--base-url", "http://x", "--model", "m", "--input-len", "u:1"], "--input-len"),
        (["bench", "--base-url", "http://x", "--model", "m", "--slo", "ttft"], "--slo"),
        (["bench", "--base-url", "http://x", "--model", "m", "--burst", "5"], "--burst"),
        (["bench", "--base-url", "http://x", "--model", "m", "--extra-body", "{"], "--extra-body"),
        (["bench", "--base-url", "http://x", "--model", "m", "--max-concurrency", "2"], "--rate"),
    ],
)
def test_bad_flags_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_compare_rejects_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.json"
    f.write_text('{"format": "other"}')
    assert main(["bench", "compare", str(f), str(f)]) == 2
    assert "not a fleetserve bench report" in capsys.readouterr().err


def test_ctrl_c_still_writes_the_report(fake_server: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_server.reset(ttft_s=0.02)
    out = tmp_path / "run.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetserve.cli", "bench", "--base-url", fake_server.url,
         "--model", "fake-model", "--no-progress", "--concurrency", "2",
         "--num-requests", "100000", "--output-len", "2", "--output", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(fake_server.bodies) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        # Generous: once, under the full suite's load on a 2-CPU CI host, the interrupted
        # run needed more than 60 s to exit (alone it takes a few seconds).
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "fleetserve: interrupted" in err
    assert "Traceback" not in err
    report = BenchReport.load(out)
    assert report.run.interrupted
    point = report.points[0]
    assert point.succeeded >= 5
    assert set(point.errors_by_type) <= {"interrupted"}
