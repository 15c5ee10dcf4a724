"""docs/spec.md is generated from the spec models and must not drift from them."""

from __future__ import annotations

from pathlib import Path

from fleetserve.specdoc import spec_reference

DOC = Path(__file__).resolve().parents[3] / "docs" / "spec.md"


def test_reference_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == spec_reference(), (
        "docs/spec.md is stale: run `.venv/bin/python -m fleetserve.specdoc > docs/spec.md`"
    )


def test_reference_documents_every_model_field() -> None:
    text = spec_reference()
    for field in ("max_model_len", "concurrency", "tensor_parallel", "api_keys", "isolation"):
        assert f"| `{field}` |" in text
