"""Secret references of the spec as container environment variables (never literal values).

Design: every :class:`~fleetserve.spec.SecretRef` becomes one env var whose value comes from
a Kubernetes Secret through ``secretKeyRef``:

* ``{secret: NAME, key: KEY}`` reads that Secret; the env var is ``env`` when the spec
  names one, else ``FLEETSERVE_SECRET_<NAME>_<KEY>`` (upper case, ``[A-Z0-9_]``);
* ``${VAR}`` (an env var at local serve time) reads key ``VAR`` of the fleet's own Secret
  ``<fleet>-env``, which the operator creates (``kubectl create secret generic``).

The spec handed to the Serve app is rewritten so every reference is just the ``env`` it
will find at run time: the app resolves secrets from its environment only, on a laptop and
in the cluster alike. What must stay true: no secret value ever enters a rendered file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetserve.errors import RenderError
from fleetserve.spec import FleetSpec, SecretRef


@dataclass(frozen=True, order=True)
class SecretEnv:
    """One env var of the Ray containers, read from a Secret key."""

    env: str
    secret: str
    key: str

    def to_env(self) -> dict[str, Any]:
        return {
            "name": self.env,
            "valueFrom": {"secretKeyRef": {"name": self.secret, "key": self.key}},
        }


def env_secret_name(instance: str) -> str:
    """The Secret holding the ``${VAR}`` references of fleet ``instance``."""
    return f"{instance}-env"


def secret_env(ref: SecretRef, instance: str) -> SecretEnv:
    """Where one reference is read from in the cluster."""
    if ref.secret is not None and ref.key is not None:
        return SecretEnv(env=ref.env_name, secret=ref.secret, key=ref.key)
    assert ref.env is not None  # SecretRef guarantees env or secret
    return SecretEnv(env=ref.env, secret=env_secret_name(instance), key=ref.env)


def fleet_secret_envs(spec: FleetSpec) -> list[SecretEnv]:
    """Every distinct secret env var of the fleet, sorted (env name is unique)."""
    instance = spec.kubernetes.name
    refs: list[SecretRef] = [m.hf_token for m in spec.models if m.hf_token is not None]
    refs += [key for t in spec.tenants for key in t.api_keys]
    found: dict[str, SecretEnv] = {}
    for ref in refs:
        item = secret_env(ref, instance)
        other = found.get(item.env)
        if other is not None and other != item:
            raise RenderError(
                f"env var {item.env} would be read from two secrets "
                f"({other.secret}/{other.key} and {item.secret}/{item.key})",
                hint="give one of the references its own 'env' name",
            )
        found[item.env] = item
    return sorted(found.values())


def spec_for_cluster(spec: FleetSpec) -> dict[str, Any]:
    """The spec as the Serve app receives it: JSON-able, each secret ref with its env var."""
    instance = spec.kubernetes.name
    data = spec.model_dump(mode="json", exclude_none=True)
    if not spec.kubernetes.volumes:
        # An empty list says nothing to the app; leaving it out keeps the serve config
        # of a fleet without volumes as it was before volumes existed.
        data["kubernetes"].pop("volumes", None)

    def ref_dict(ref: SecretRef) -> dict[str, Any]:
        # Only the env var: in the cluster the pod env is the one source (the Secret is
        # already wired to it by secretKeyRef), and the Serve config - shown by the Ray
        # dashboard - names no secret at all.
        return {"env": secret_env(ref, instance).env}

    for i, model in enumerate(spec.models):
        if model.hf_token is not None:
            data["models"][i]["hf_token"] = ref_dict(model.hf_token)
    for i, tenant in enumerate(spec.tenants):
        data["tenants"][i]["api_keys"] = [ref_dict(k) for k in tenant.api_keys]
    return data
