"""API keys: resolved from the environment at start, only digests kept, tenant rules."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fleetserve.errors import SpecError
from fleetserve.serve.guard.api_keys import KEY_FILE_CHECK_S, ApiKeyTable, AuthError, parse_key_file
from fleetserve.spec import parse_spec


def spec(**tenant_b: object) -> object:
    return parse_spec(
        {
            "models": [
                {"name": "open", "source": "x"},
                {"name": "mine", "source": "x", "tenant": "a"},
            ],
            "tenants": [
                {"name": "a", "api_keys": ["${KEY_A}", {"secret": "s", "key": "k"}]},
                {"name": "b", **tenant_b},
            ],
        }
    )


ENV = {"KEY_A": "sk-a", "FLEETSERVE_SECRET_S_K": "sk-a2"}


def test_no_keys_means_auth_off() -> None:
    table = ApiKeyTable.from_spec(parse_spec({"models": [{"name": "m", "source": "x"}]}), {})
    assert not table.enabled
    assert table.tenant(None) is None
    assert table.visible(None, "m")
    assert not table.visible(None, "other")


def test_keys_from_env_and_secret_refs_identify_the_tenant() -> None:
    table = ApiKeyTable.from_spec(spec(), ENV)  # type: ignore[arg-type]
    assert table.tenant("Bearer sk-a") == "a"
    assert table.tenant("bearer  sk-a2") == "a"
    for bad in (None, "", "Bearer", "Token sk-a", "Bearer sk-zzz"):
        with pytest.raises(AuthError):
            table.tenant(bad)


def test_only_digests_travel_in_the_serve_args() -> None:
    args = ApiKeyTable.from_spec(spec(), ENV).to_args()  # type: ignore[arg-type]
    assert "sk-a" not in repr(args)
    again = ApiKeyTable.from_args(args)
    assert again.tenant("Bearer sk-a") == "a"


def test_visibility_tenant_models_and_untagged_models() -> None:
    table = ApiKeyTable.from_spec(spec(), ENV)  # type: ignore[arg-type]
    assert table.visible("a", "mine")
    assert table.visible("a", "open")
    assert table.visible("b", "open")
    assert not table.visible("b", "mine")


def test_missing_variable_refuses_to_start_and_names_it() -> None:
    with pytest.raises(SpecError, match=r"tenants\[0\]\.api_keys\[1\].*FLEETSERVE_SECRET_S_K"):
        ApiKeyTable.from_spec(spec(), {"KEY_A": "sk-a"})  # type: ignore[arg-type]


def test_one_key_for_two_tenants_is_refused() -> None:
    env = {**ENV, "KEY_B": "sk-a"}
    with pytest.raises(SpecError, match="also a key of tenant 'a'"):
        ApiKeyTable.from_spec(spec(api_keys=["${KEY_B}"]), env)  # type: ignore[arg-type]


def test_key_hashes_in_the_spec_identify_the_tenant() -> None:
    hashed = "sha256:" + hashlib.sha256(b"sk-hashed").hexdigest()
    table = ApiKeyTable.from_spec(spec(api_key_hashes=[hashed]), ENV)  # type: ignore[arg-type]
    assert table.tenant("Bearer sk-hashed") == "b"
    assert "sk-hashed" not in repr(table.to_args())
    with pytest.raises(SpecError, match=r"api_key_hashes\.0|api_key_hashes\[0\]"):
        spec(api_key_hashes=["sha256:nothex"])
    with pytest.raises(SpecError, match="key digests go in a tenant's api_key_hashes"):
        spec(api_keys=[hashed])


def test_a_key_file_rotates_keys_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team b\nsk-old\n")
    table = ApiKeyTable.from_spec(spec(api_keys_file=str(keys)), ENV)  # type: ignore[arg-type]
    # The ingress gets the table through Serve's arguments: paths travel, keys do not.
    table = ApiKeyTable.from_args(table.to_args())
    clock = [1000.0]
    monkeypatch.setattr("fleetserve.serve.guard.api_keys.time.monotonic", lambda: clock[0])
    assert "sk-old" not in repr(table.to_args())
    assert table.tenant("Bearer sk-old") == "b"
    assert "b" in table.tenants
    # Rotate the way a mounted Secret does: write a new file, rename it over the old one.
    new = tmp_path / "keys.new"
    new.write_text("sk-new\nsha256:" + hashlib.sha256(b"sk-other").hexdigest() + "\n")
    new.replace(keys)
    clock[0] += KEY_FILE_CHECK_S + 0.1
    assert table.tenant("Bearer sk-new") == "b"
    assert table.tenant("Bearer sk-other") == "b"
    with pytest.raises(AuthError):
        table.tenant("Bearer sk-old")
    # A broken file keeps the keys it had (no lock-out while a file is half-written).
    keys.write_text("sha256:zz\n")
    clock[0] += KEY_FILE_CHECK_S + 0.1
    assert table.tenant("Bearer sk-new") == "b"


def test_a_missing_key_file_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="api_keys_file"):
        ApiKeyTable.from_spec(spec(api_keys_file=str(tmp_path / "none")), ENV)  # type: ignore[arg-type]


def test_key_file_lines() -> None:
    digest = hashlib.sha256(b"k1").hexdigest()
    assert parse_key_file(f"k1 # comment\n\n  sha256:{digest.upper()}\n") == [digest, digest]
    with pytest.raises(ValueError, match="line 2"):
        parse_key_file("ok\nsha256:abc\n")
