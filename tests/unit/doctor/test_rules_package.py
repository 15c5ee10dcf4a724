"""The rules package imports every rule module, and a missing one fails loudly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import fleetserve.k8s.doctor.rules as rules_pkg
from fleetserve.k8s.doctor.registry import load_rules


def test_every_rule_module_is_imported_by_the_package() -> None:
    load_rules()
    folder = Path(rules_pkg.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert modules  # the glob found the package
    missing = [m for m in sorted(modules) if f"{rules_pkg.__name__}.{m}" not in sys.modules]
    assert missing == []


def test_a_missing_rule_module_fails_the_import_instead_of_dropping_its_rules() -> None:
    # A fresh interpreter: the registry refuses a rule registered twice, so the package
    # cannot be re-imported in this one. ``sys.modules[name] = None`` makes importing that
    # one module raise ModuleNotFoundError(name=...), as a file left out of a wheel would.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["fleetserve.k8s.doctor.rules.lora"] = None
        try:
            import fleetserve.k8s.doctor.rules
        except ModuleNotFoundError as e:
            print("raised", e.name)
        else:
            print("imported")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "raised fleetserve.k8s.doctor.rules.lora"
