"""Picking a free TCP port that stays free until the process that wanted it binds it.

Design note. The usual trick, ``bind(0)`` and close, returns a port from the kernel's
ephemeral range, and the kernel hands ports from that range to the next ``bind(0)`` or
outgoing connection on the host. Between our pick and the bind that uses it, Ray starts
processes that do exactly that (the driver's and each worker's gRPC servers, their
connections), so the picked port can be taken: seen in CI, where Ray's driver took the port
chosen for a server and its ingress found it in use. A port is therefore drawn at random
from a band nobody else draws from by default:

* above Ray's worker ports (``min_worker_port``..``max_worker_port``, 10002-19999);
* below Serve's direct-ingress HTTP ports (30000-31000 by default; ours are set
  explicitly, but another Serve application on the host keeps Ray's defaults);
* below the kernel's ephemeral range (``ip_local_port_range``, 32768 on Linux by default;
  where a host starts it lower, the band stops there).

A random draw, not a counter: two servers started at once on one host must not try the
same ports in the same order. The port is still only free *now*; what this removes is the
host's own busy allocators, not a deliberate squatter.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

from fleetserve.errors import ServeError

#: First port of the band (above Ray's default worker ports, 10002-19999).
BAND_START = 20000
#: End of the band, exclusive (Ray Serve's default direct-ingress HTTP ports start here).
BAND_END = 30000
#: Draws before giving up (a band of 10,000 ports with 500 draws misses only on a host
#: that has nearly all of them bound).
_DRAWS = 500
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def band(ephemeral_range: Path = _EPHEMERAL_RANGE) -> range:
    """The ports :func:`free_port` draws from on this host."""
    try:
        ephemeral_start = int(ephemeral_range.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 32768  # Linux's default; other systems start higher
    end = min(BAND_END, ephemeral_start)
    if end - BAND_START < 1000:
        # A host whose ephemeral range reaches into the band: nothing is safe from the
        # kernel there, so keep the whole band rather than a sliver of it.
        end = BAND_END
    return range(BAND_START, end)


def free_port(
    host: str = "127.0.0.1",
    *,
    avoid: Collection[int] = (),
    rng: random.Random | None = None,
) -> int:
    """A port on ``host`` that is free now, from :func:`band`, and not in ``avoid``.

    ``avoid``: ports promised to someone who has not bound them yet (the server's own port,
    when it lies in the band, is free until its ingress starts).
    Raises ServeError (naming the band) when no drawn port could be bound.
    """
    ports = band()
    draw = rng or random.Random()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(_DRAWS):
        port = draw.randrange(ports.start, ports.stop)
        if port in avoid:
            continue
        with socket.socket(family) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise ServeError(
        f"no free TCP port on {host} in {ports.start}-{ports.stop - 1} after {_DRAWS} "
        "random tries: nearly every port there is in use"
    )
