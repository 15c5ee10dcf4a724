"""Tenants' API keys: who may call, and which models each key may use.

Design note. Keys are resolved from their secret references once, where the app is
built (``${ENV}`` from the environment; ``{secret, key}`` from the env var that
Kubernetes mounts it as, ``FLEETSERVE_SECRET_<SECRET>_<KEY>``), and only their SHA-256
digests travel to the ingress: the Serve config, the dashboard and the replica's
arguments never hold a usable key. A missing or empty variable refuses the start - a
fleet whose spec asks for keys is never silently served open.

Rules (what must stay true):

* no tenant has keys -> auth is off, every model open;
* otherwise every model request needs ``Authorization: Bearer <key>`` (401 otherwise);
* a key may use its tenant's models and untagged models; any other model answers exactly
  like an unknown one (404), so model names do not leak across tenants.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetserve.engine.config import secret_env_name
from fleetserve.errors import SpecError
from fleetserve.spec import FleetSpec


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class AuthError(Exception):
    """The request carries no valid API key (maps to 401)."""


@dataclass(frozen=True)
class ApiKeyTable:
    """Digest -> tenant, and model -> owning tenant (None: open to every tenant)."""

    key_tenants: dict[str, str] = field(default_factory=dict)
    model_tenants: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: FleetSpec, environ: Mapping[str, str] | None = None) -> ApiKeyTable:
        """Resolve every tenant's keys now; SpecError names a missing variable."""
        env = os.environ if environ is None else environ
        keys: dict[str, str] = {}
        for ti, tenant in enumerate(spec.tenants):
            for ki, ref in enumerate(tenant.api_keys):
                var = secret_env_name(ref)
                value = env.get(var, "")
                if not value.strip():
                    raise SpecError(
                        f"tenants[{ti}].api_keys[{ki}] (tenant '{tenant.name}'): environment "
                        f"variable {var} is not set or empty; export it before serving"
                    )
                digest = _digest(value.strip())
                other = keys.get(digest)
                if other is not None and other != tenant.name:
                    raise SpecError(
                        f"tenants[{ti}].api_keys[{ki}]: the same key is also a key of "
                        f"tenant '{other}'; a key must identify one tenant"
                    )
                keys[digest] = tenant.name
        return cls(key_tenants=keys, model_tenants={m.name: m.tenant for m in spec.models})

    @property
    def enabled(self) -> bool:
        return bool(self.key_tenants)

    def tenant(self, authorization: str | None) -> str | None:
        """The caller's tenant (None when auth is off); AuthError when the key is bad."""
        if not self.enabled:
            return None
        if not authorization:
            raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("malformed Authorization header: expected 'Bearer <key>'")
        digest = _digest(token.strip())
        for known, tenant in self.key_tenants.items():
            if hmac.compare_digest(known, digest):
                return tenant
        raise AuthError("invalid API key")

    def visible(self, tenant: str | None, model: str) -> bool:
        """Whether the caller may see and use ``model`` (False for unknown models)."""
        if model not in self.model_tenants:
            return False
        if tenant is None:
            return True
        owner = self.model_tenants[model]
        return owner is None or owner == tenant

    def to_args(self) -> dict[str, dict[str, str | None]]:
        """Plain-data form for Serve deployment arguments (digests only)."""
        return {"key_tenants": dict(self.key_tenants), "model_tenants": dict(self.model_tenants)}

    @classmethod
    def from_args(cls, data: Mapping[str, Mapping[str, str | None]]) -> ApiKeyTable:
        keys = {k: str(v) for k, v in data.get("key_tenants", {}).items()}
        return cls(key_tenants=keys, model_tenants=dict(data.get("model_tenants", {})))


__all__ = ["ApiKeyTable", "AuthError", "secret_env_name"]
