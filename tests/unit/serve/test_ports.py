"""Side ports come from a band that Ray's workers and the kernel's ephemeral ports stay out of."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from fleetserve.errors import ServeError
from fleetserve.serve.control import ports


def _range_file(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "ip_local_port_range"
    f.write_text(text)
    return f


def test_the_band_lies_above_rays_worker_ports_and_below_serve_and_the_kernel(
    tmp_path: Path,
) -> None:
    band = ports.band(_range_file(tmp_path, "32768\t60999\n"))
    assert band == range(20000, 30000)
    assert band.start > 19999  # Ray's default max_worker_port
    assert band.stop <= 30000  # Ray Serve's default direct-ingress HTTP ports start here


def test_a_lower_ephemeral_range_cuts_the_band(tmp_path: Path) -> None:
    assert ports.band(_range_file(tmp_path, "25000 60999")) == range(20000, 25000)


def test_an_ephemeral_range_inside_the_band_keeps_the_band(tmp_path: Path) -> None:
    # Nothing is safe from the kernel there; a sliver of the band would only add collisions.
    assert ports.band(_range_file(tmp_path, "20100 60999")) == range(20000, 30000)


def test_an_unreadable_range_falls_back_to_linuxs_default(tmp_path: Path) -> None:
    assert ports.band(tmp_path / "missing") == range(20000, 30000)
    assert ports.band(_range_file(tmp_path, "garbage")) == range(20000, 30000)


def test_the_port_is_in_the_band_and_bindable() -> None:
    port = ports.free_port("127.0.0.1")
    assert port in ports.band()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_busy_port_is_skipped() -> None:
    first = random.Random(7).randrange(ports.band().start, ports.band().stop)
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", first))
        except OSError:
            pytest.skip(f"port {first} is already taken on this host")
        busy.listen()
        port = ports.free_port("127.0.0.1", rng=random.Random(7))
    assert port != first
    assert port in ports.band()


def test_no_free_port_is_a_message_naming_the_band(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "band", lambda: range(taken, taken + 1))
        with pytest.raises(ServeError, match=rf"no free TCP port on 127.0.0.1 in {taken}-{taken}"):
            ports.free_port("127.0.0.1")


def test_a_promised_port_is_never_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's own port is free until its ingress binds it; the side port must differ.
    monkeypatch.setattr(ports, "band", lambda: range(24000, 24002))
    rng = random.Random(0)
    draws = [ports.free_port("127.0.0.1", avoid={24000}, rng=rng) for _ in range(20)]
    assert set(draws) == {24001}
