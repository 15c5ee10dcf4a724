"""API keys: resolved from the environment at start, only digests kept, tenant rules."""

from __future__ import annotations

import pytest

from fleetserve.errors import SpecError
from fleetserve.serve.api_keys import ApiKeyTable, AuthError
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
