"""Replica counts seen by this process's routers: for waiting out a scale from zero, and
the probes' replica counts (``model_client.HandleModelClient.health``).

A model at ``replicas.min: 0`` may have no replica when a request arrives; Ray Serve then
keeps the request queued in the handle (which is what makes the autoscaler start one) but
would wait forever. The ingress needs to know, without a remote call, whether a model
has a replica at all so it can bound that wait: every :class:`FleetRouter` publishes its
deployment's replica count here. Routers may run on Serve's router thread, so access is
locked; values are plain ints.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_replicas: dict[str, int] = {}


def publish(deployment: str, replicas: int) -> None:
    """A router of ``deployment`` now sees ``replicas`` replicas."""
    with _lock:
        _replicas[deployment] = replicas


def replicas(deployment: str) -> int | None:
    """Replicas the routers of ``deployment`` see (``None``: no router yet)."""
    with _lock:
        return _replicas.get(deployment)
