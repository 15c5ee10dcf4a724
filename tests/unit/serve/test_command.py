"""`fleetserve serve` refuses bad input before starting anything: one line, exit 2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetserve.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["serve", *argv])
    err = capsys.readouterr().err
    return code, err


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def test_bad_yaml_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "models:\n  - name: a\n    source: [unclosed\n")
    code, err = run(capsys, spec)
    assert code == 2
    assert f"{spec}:" in err
    assert "invalid YAML" in err
    assert "Traceback" not in err


def test_unknown_key_names_the_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(tmp_path, "models:\n  - name: a\n    source: x\n    replicaz: 2\n")
    code, err = run(capsys, spec)
    assert code == 2
    assert "models[0].replicaz: unknown key" in err


def test_missing_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "no such file" in err


def test_impossible_resources_are_refused_with_the_arithmetic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(
        tmp_path,
        "models:\n  - name: huge\n    source: x\n    resources: {cpu: 1024}\n"
        "    replicas: {min: 1000, max: 1000}\n",
    )
    code, err = run(capsys, spec, "--engine", "fake", "--port", str(_free_port()))
    assert code == 2
    assert "logical CPUs at min replicas" in err
    assert "huge 1024 x 1000" in err
    assert "Traceback" not in err


def test_unset_api_key_variable_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEETSERVE_TEST_UNSET_KEY", raising=False)
    spec = write(
        tmp_path,
        "models:\n  - name: m\n    source: x\n    resources: {cpu: 0.5}\n"
        "tenants:\n  - name: t\n    api_keys: ['${FLEETSERVE_TEST_UNSET_KEY}']\n",
    )
    code, err = run(capsys, spec, "--engine", "fake", "--port", str(_free_port()))
    assert code == 2
    assert "FLEETSERVE_TEST_UNSET_KEY is not set" in err


def test_port_in_use_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(capsys, "--engine", "fake", "--port", str(port))
    assert code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in err


def test_metrics_export_port_in_use_is_refused_before_ray_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Ray's node agent exports on every interface; taken, the node timed out starting
    # (76 s, both tries) with nothing naming the port.
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        args = ("--engine", "fake", "--port", str(_free_port()))
        code, err = run(capsys, *args, "--metrics-export-port", str(taken))
    assert code == 2
    assert f"port {taken} on 0.0.0.0 is already in use" in err
    assert "--metrics-export-port" in err
    assert "Traceback" not in err
    code, err = run(capsys, *args, "--metrics-export-port", "70000")
    assert code == 2
    assert "--metrics-export-port 70000: must be in 1..65535" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
