"""Tenants' API keys: who may call, and which models each key may use.

Design note. Keys enter in three ways, and only their SHA-256 digests reach the ingress
(the Serve config, the dashboard and the replica's arguments never hold a usable key):

* ``api_keys``: secret references, resolved once where the app is built (``${ENV}`` from
  the environment; ``{secret, key}`` from the env var Kubernetes mounts it as,
  ``FLEETSERVE_SECRET_<SECRET>_<KEY>``). A missing or empty variable refuses the start - a
  fleet whose spec asks for keys is never silently served open;
* ``api_key_hashes``: ``sha256:<hex>`` digests written in the spec itself;
* ``api_keys_file``: a file of keys or digests, one per line, re-read by the ingress when
  it changes (checked at most every :data:`KEY_FILE_CHECK_S`): keys rotate without a
  restart. A file that cannot be read or parsed keeps the keys it had (a half-written
  file must not lock every caller out); a missing file refuses the start.

Rules (what must stay true):

* no tenant has keys -> auth is off, every model open;
* otherwise every model request needs ``Authorization: Bearer <key>`` (401 otherwise);
* the presented key's digest is compared with every known digest in constant time;
* a key may use its tenant's models and untagged models; any other model answers exactly
  like an unknown one (404), so model names do not leak across tenants.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetserve.errors import SpecError
from fleetserve.spec import FleetSpec

#: Seconds between checks of a key file for changes.
KEY_FILE_CHECK_S = 1.0
#: Hex digits of a key's digest that name it in quota scopes (not enough to find the key).
KEY_ID_HEX = 12

_HASH_PREFIX = "sha256:"
_log = logging.getLogger(__name__)


def digest(key: str) -> str:
    """The hex SHA-256 of a key (what ``sha256:<hex>`` entries hold)."""
    return hashlib.sha256(key.encode()).hexdigest()


class AuthError(Exception):
    """The request carries no valid API key (maps to 401)."""


def parse_key_file(text: str) -> list[str]:
    """Digests of a key file: one key or ``sha256:<hex>`` per line; ``#`` comments.

    ValueError names the line of a malformed digest."""
    out: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(_HASH_PREFIX):
            hexpart = line[len(_HASH_PREFIX) :].lower()
            if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
                raise ValueError(f"line {number}: 'sha256:' needs 64 hex digits")
            out.append(hexpart)
        else:
            out.append(digest(line))
    return out


@dataclass
class _KeyFile:
    """One tenant's key file and the digests last read from it."""

    path: str
    tenant: str
    digests: tuple[str, ...] = ()
    stamp: tuple[int, int, int] | None = None
    checked: float = 0.0

    def refresh(self, now: float, *, strict: bool = False) -> None:
        if not strict and now - self.checked < KEY_FILE_CHECK_S:
            return
        self.checked = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self.stamp:
                return
            with open(self.path, encoding="utf-8") as f:
                digests = tuple(parse_key_file(f.read()))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            if strict:
                raise SpecError(f"tenant '{self.tenant}': api_keys_file {self.path}: {e}") from e
            _log.warning("api_keys_file %s: %s; keeping its previous keys", self.path, e)
            return
        self.stamp, self.digests = stamp, digests


@dataclass(frozen=True)
class ApiKeyTable:
    """Digest -> tenant, key files by tenant, model -> owning tenant (None: open)."""

    key_tenants: dict[str, str] = field(default_factory=dict)
    model_tenants: dict[str, str | None] = field(default_factory=dict)
    key_files: dict[str, str] = field(default_factory=dict)  # path -> tenant
    _files: list[_KeyFile] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self._files:
            self._files.extend(_KeyFile(path, tenant) for path, tenant in self.key_files.items())

    @classmethod
    def from_spec(cls, spec: FleetSpec, environ: Mapping[str, str] | None = None) -> ApiKeyTable:
        """Resolve every tenant's keys now; SpecError names a missing variable or file."""
        env = os.environ if environ is None else environ
        keys: dict[str, str] = {}

        def add(hexdigest: str, tenant: str, where: str) -> None:
            other = keys.get(hexdigest)
            if other is not None and other != tenant:
                raise SpecError(
                    f"{where}: the same key is also a key of tenant '{other}'; "
                    "a key must identify one tenant"
                )
            keys[hexdigest] = tenant

        files: dict[str, str] = {}
        for ti, tenant in enumerate(spec.tenants):
            for ki, ref in enumerate(tenant.api_keys):
                var = ref.env_name
                value = env.get(var, "")
                if not value.strip():
                    raise SpecError(
                        f"tenants[{ti}].api_keys[{ki}] (tenant '{tenant.name}'): environment "
                        f"variable {var} is not set or empty; export it before serving"
                    )
                add(digest(value.strip()), tenant.name, f"tenants[{ti}].api_keys[{ki}]")
            for hi, hashed in enumerate(tenant.api_key_hashes):
                add(hashed[len(_HASH_PREFIX) :], tenant.name, f"tenants[{ti}].api_key_hashes[{hi}]")
            if tenant.api_keys_file is not None:
                path = os.path.abspath(tenant.api_keys_file)
                if files.get(path, tenant.name) != tenant.name:
                    raise SpecError(
                        f"tenants[{ti}].api_keys_file: {path} is also the key file of "
                        f"tenant '{files[path]}'"
                    )
                _KeyFile(path, tenant.name).refresh(time.monotonic(), strict=True)
                files[path] = tenant.name
        return cls(
            key_tenants=keys,
            model_tenants={
                **{m.name: m.tenant for m in spec.models},
                # a LoRA adapter of the spec: its own tenant, else its base model's
                **{a.name: a.tenant or m.tenant for m in spec.models for a in m.adapters},
            },
            key_files=files,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.key_tenants) or bool(self.key_files)

    @property
    def tenants(self) -> frozenset[str]:
        """Every tenant that has keys (in the spec or in a key file)."""
        return frozenset(self.key_tenants.values()) | frozenset(self.key_files.values())

    def identify(self, authorization: str | None) -> tuple[str, str] | None:
        """``(tenant, key id)`` of the caller (None when auth is off); AuthError when the
        key is bad. The key id is a prefix of the key's digest (for per-key quotas)."""
        if not self.enabled:
            return None
        if not authorization:
            raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("malformed Authorization header: expected 'Bearer <key>'")
        presented = digest(token.strip())
        found: str | None = None
        # Every comparison runs (no early exit): the time does not depend on which key.
        for known, tenant in self.key_tenants.items():
            if hmac.compare_digest(known, presented):
                found = tenant
        if self._files:
            now = time.monotonic()
            for kf in self._files:
                kf.refresh(now)
                for known in kf.digests:
                    if hmac.compare_digest(known, presented):
                        found = kf.tenant
        if found is None:
            raise AuthError("invalid API key")
        return found, presented[:KEY_ID_HEX]

    def tenant(self, authorization: str | None) -> str | None:
        """The caller's tenant (None when auth is off); AuthError when the key is bad."""
        caller = self.identify(authorization)
        return None if caller is None else caller[0]

    def visible(self, tenant: str | None, model: str) -> bool:
        """Whether the caller may see and use ``model`` (False for unknown models)."""
        if model not in self.model_tenants:
            return False
        if tenant is None:
            return True
        owner = self.model_tenants[model]
        return owner is None or owner == tenant

    def to_args(self) -> dict[str, Any]:
        """Plain-data form for Serve deployment arguments (digests and paths only)."""
        args: dict[str, Any] = {
            "key_tenants": dict(self.key_tenants),
            "model_tenants": dict(self.model_tenants),
        }
        if self.key_files:
            args["key_files"] = dict(self.key_files)
        return args

    @classmethod
    def from_args(cls, data: Mapping[str, Any]) -> ApiKeyTable:
        keys = {k: str(v) for k, v in data.get("key_tenants", {}).items()}
        return cls(
            key_tenants=keys,
            model_tenants=dict(data.get("model_tenants", {})),
            key_files={str(k): str(v) for k, v in data.get("key_files", {}).items()},
        )


__all__ = ["ApiKeyTable", "AuthError", "digest", "parse_key_file"]
