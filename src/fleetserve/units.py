"""Memory units: the one place a spec's ``memory_gb`` becomes bytes or MiB.

Every ``memory_gb`` field of the fleet spec (``pools[].memory_gb``, ``pools[].gpu.memory_gb``,
``models[].resources.memory_gb``) is in GiB (2^30 bytes): the unit Kubernetes (``Gi``),
HAMi (``gpumem`` in MiB) and nvidia-smi (MiB) use. Plan, render and serve convert through
these helpers so they can never disagree again (issue #12: plan read 10^9 bytes while render
read GiB, 7 % apart).

Rounding is part of the contract: a node's or card's capacity rounds *down* (never promise
memory that is not there), a replica's request rounds *up* (never ask for less than it needs).
"""

from __future__ import annotations

import math

MiB = 2**20
GiB = 2**30
MIB_PER_GIB = 1024


def gib_to_mib_floor(gib: float) -> int:
    """A capacity in GiB as whole MiB, rounded down (cards, nodes)."""
    return math.floor(gib * MIB_PER_GIB + 1e-9)


def gib_to_mib_ceil(gib: float) -> int:
    """A request in GiB as whole MiB, rounded up (what a replica reserves)."""
    return math.ceil(gib * MIB_PER_GIB - 1e-9)


def gib_to_bytes(gib: float) -> int:
    """A request in GiB as bytes, rounded up (Ray's ``memory`` resource is in bytes)."""
    return math.ceil(gib * GiB - 1e-6)


def bytes_to_gib(n: float) -> float:
    """Bytes as (fractional) GiB."""
    return n / GiB


def mib_to_gib(mib: float) -> float:
    """MiB as (fractional) GiB."""
    return mib / MIB_PER_GIB


def gib_ceil(gib: float) -> int:
    """A request in GiB as whole GiB, rounded up (Kubernetes ``<n>Gi`` of a pod)."""
    return math.ceil(gib - 1e-9)
