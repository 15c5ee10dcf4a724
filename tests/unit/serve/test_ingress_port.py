"""A replacement ingress replica can bind the port its killed predecessor served on.

Through Ray Serve's own ``start_asgi_http_server`` (what a direct-ingress replica runs),
on a port whose last connections are still in TIME_WAIT - what SIGKILLing an ingress
replica with connected clients leaves behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import pytest
from ray.serve._private import http_util
from ray.serve.config import HTTPOptions
from starlette.types import Receive, Scope, Send

from fleetserve.serve.ingress.ingress import install_address_reuse


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    return None


def port_in_time_wait() -> int:
    """A port nothing listens on whose server side closed a connection first."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = int(listener.getsockname()[1])
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server closes first: its side goes to TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    return port


async def bind_like_a_replica(port: int) -> None:
    task, server = await http_util.start_asgi_http_server(
        app, HTTPOptions(host="127.0.0.1", port=port), event_loop=asyncio.get_running_loop()
    )
    server.should_exit = True
    await task


@pytest.fixture
def restore_http_util() -> Iterator[None]:
    original = http_util.socket
    yield
    http_util.socket = original


@pytest.mark.usefixtures("restore_http_util")
def test_a_replacement_replica_binds_a_port_left_in_time_wait() -> None:
    port = port_in_time_wait()
    # Serve alone cannot (it would then block the port for good: NoAvailablePortError).
    with pytest.raises(RuntimeError, match="Failed to bind"):
        asyncio.run(bind_like_a_replica(port))
    assert install_address_reuse()
    asyncio.run(bind_like_a_replica(port))


@pytest.mark.usefixtures("restore_http_util")
def test_a_port_another_server_listens_on_is_still_refused() -> None:
    assert install_address_reuse()
    assert install_address_reuse()  # idempotent
    with contextlib.closing(socket.socket()) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(RuntimeError, match="Failed to bind"):
            asyncio.run(bind_like_a_replica(int(other.getsockname()[1])))
