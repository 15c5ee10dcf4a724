"""The CLI shell: lazy sub-commands, one-line errors, exit codes."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from fleetserve.cli import COMMANDS, build_parser, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_module_registers_its_name(name: str) -> None:
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    module.register(sub)
    assert name in sub.choices
    assert sub.choices[name].get_default("handler") is not None or name in {"model", "bench"}


def test_light_commands_do_not_import_the_engine() -> None:
    """`fleetserve doctor/plan --help` must not pay for Ray or vLLM (seconds each)."""
    code = (
        "import sys\n"
        "from fleetserve.cli import build_parser\n"
        "for cmd in ('doctor', 'render', 'plan', 'bench', 'observe', 'model'):\n"
        "    build_parser([cmd])\n"
        "heavy = sorted(m for m in ('vllm', 'ray', 'torch') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.strip() == ""


def test_top_level_help_lists_commands_without_importing_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser(["--help"]).parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
