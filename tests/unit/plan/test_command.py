"""`fleetserve plan` end to end through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plan"


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLES / "seed-004.yaml"), "--time-limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "feasible" in out
    assert "llama-3-70b#0" in out
    assert "RTX-A6000" in out


def test_json_output_is_exactly_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLES / "seed-004.yaml"), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"feasible", "gpus_used", "nodes", "optimality_gap", "replicas", "unplaced"} <= set(data)
    assert data["feasible"] is True
    assert data["nodes"]["a6000"] >= 1
    first = data["replicas"][0]
    assert isinstance(first["gpus"], list)
    assert 0 < first["engine"]["gpu_memory_utilization"] <= 1


def test_max_scenario_infeasible_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", str(EXAMPLES / "seed-004.yaml"), "--scenario", "max", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if data["feasible"] else 1)


def _spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def test_bad_yaml_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _spec(tmp_path, "models: [\n  - name: x\n   bad")
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err
    assert "invalid YAML" in err
    assert "Traceback" not in err


def test_unknown_gpu_type_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _spec(
        tmp_path,
        "models: [{name: q, source: x, config: qwen2.5-0.5b}]\n"
        "pools: [{name: p, gpu: {type: GTX-9999, count: 1}}]\n",
    )
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetserve: error: unknown GPU type 'GTX-9999'")


def test_unknown_model_config_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _spec(
        tmp_path,
        "models: [{name: q, source: x, config: does-not-exist}]\n"
        "pools: [{name: p, gpu: {type: L4, count: 1}}]\n",
    )
    assert main(["plan", path]) == 2
    assert "model 'q': config 'does-not-exist'" in capsys.readouterr().err


def test_bad_time_limit_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", str(EXAMPLES / "seed-004.yaml"), "--time-limit", "-1"])
    assert info.value.code == 2


_TRAFFIC_FLEET = """
pools: [{name: a100, gpu: {type: A100-80GB, count: 8}, cpu: 96, memory_gb: 1024}]
models:
  - name: chat
    config: gemma-3-12b
    max_model_len: 8192
    tensor_parallel: 1
    max_num_seqs: 64
    traffic:
      rate: 40
      prompt_tokens: {mean: 1000, p99: 4000}
      output_tokens: {mean: 250, p99: 1000}
    slo: {ttft_ms: {p99: 2000}, tpot_ms: {p50: 60}}
"""


def _traffic_plan(
    args: list[str], path: str, capsys: pytest.CaptureFixture[str]
) -> dict[str, object]:
    assert main(["plan", path, "--format", "json", *args]) == 0
    (chat,) = json.loads(capsys.readouterr().out)["traffic"]
    assert isinstance(chat, dict)
    return chat


def test_calibration_sets_the_capacity_traffic_is_planned_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plan --calibration`` reads the file ``plan calibrate`` writes (the loader
    ``simulate`` uses) and the roofline sizes traffic with it: a card reaching half the
    bandwidth the defaults assume serves less per replica, so the rate needs more."""
    from fleetserve.perf.calibration import Calibration  # noqa: PLC0415

    path = _spec(tmp_path, _TRAFFIC_FLEET)
    default = _traffic_plan([], path, capsys)
    slow = Calibration.default(cpu=False).model_copy(
        update={"bandwidth_efficiency": 0.35, "compute_efficiency": 0.3}
    )
    slow.save(tmp_path / "cal.json")
    calibrated = _traffic_plan(["--calibration", str(tmp_path / "cal.json")], path, capsys)
    assert calibrated["goodput_per_replica"] < default["goodput_per_replica"]  # type: ignore[operator]
    assert calibrated["replicas"] > default["replicas"]  # type: ignore[operator]
    # the table says what load a fitted calibration saw (a default one: nothing to say)
    assert main(["plan", path, "--calibration", str(tmp_path / "cal.json")]) == 0
    assert "requests in flight" not in capsys.readouterr().out
    fitted = slow.model_copy(update={"fit": slow.fit.model_copy(update={"load_range": (1, 3.9)})})
    fitted.save(tmp_path / "fitted.json")
    assert main(["plan", path, "--calibration", str(tmp_path / "fitted.json")]) == 0
    assert "1.0 to 3.9 requests in flight" in " ".join(capsys.readouterr().out.split())


def test_a_cpu_calibration_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetserve.perf.calibration import Calibration  # noqa: PLC0415

    Calibration.default(cpu=True).save(tmp_path / "cal.json")
    path = _spec(tmp_path, _TRAFFIC_FLEET)
    assert main(["plan", path, "--calibration", str(tmp_path / "cal.json")]) == 2
    err = capsys.readouterr().err
    assert "a cpu calibration" in err
    assert "Traceback" not in err


def test_an_unreadable_calibration_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec(tmp_path, _TRAFFIC_FLEET)
    assert main(["plan", path, "--calibration", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def _two_chats(tmp_path: Path, cards: int, tpot_ms: float) -> str:
    """Two 7B chats at 1 req/s on one node of ``cards`` A6000s (two fit one card)."""
    model = """
  - name: {name}
    config: qwen2.5-7b
    max_model_len: 4096
    traffic:
      rate: 1
      prompt_tokens: {{mean: 300, p99: 1000}}
      output_tokens: {{mean: 100, p99: 300}}
    slo: {{ttft_ms: {{p99: 3000}}, tpot_ms: {{p50: {tpot}}}}}"""
    text = (
        f"pools: [{{name: one, gpu: {{type: RTX-A6000, count: {cards}}}, cpu: 32, "
        "memory_gb: 256, max_nodes: 1}]\nmodels:"
        + model.format(name="a", tpot=tpot_ms)
        + model.format(name="b", tpot=tpot_ms)
        + "\n"
    )
    return _spec(tmp_path, text)


def test_the_table_says_when_a_replica_shares_its_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 7B chats fill one A6000 between them: each row says so, and the JSON counts it."""
    path = _two_chats(tmp_path, cards=1, tpot_ms=80)
    assert main(["plan", path]) == 0
    out = capsys.readouterr().out
    assert out.count("(+1 on card)") == 2
    assert main(["plan", path, "--format", "json"]) == 0
    traffic = json.loads(capsys.readouterr().out)["traffic"]
    assert [t["beside"] for t in traffic] == [1, 1]


def test_the_table_says_when_a_model_was_moved_to_cards_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 7B chats whose TPOT target breaks while they share an A6000 (55.6 ms against
    55): with a second card, the first gets a whole card and the row says why."""
    path = _two_chats(tmp_path, cards=2, tpot_ms=55)
    assert main(["plan", path]) == 0
    out = capsys.readouterr().out
    assert out.count("100 (own cards)") == 1
    assert "on whole cards because on shared ones TPOT p50" in out
    assert main(["plan", path, "--format", "json"]) == 0
    traffic = json.loads(capsys.readouterr().out)["traffic"]
    assert [t["own_cards"] for t in traffic] == [True, False]
    assert all(t["met"] for t in traffic)
