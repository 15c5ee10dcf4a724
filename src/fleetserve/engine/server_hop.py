"""One HTTP hop to a model's own ``vllm serve`` on a Unix socket (``frontend: process``).

Both ends of a process-frontend request use it: the replica, which forwards a request to
the server beside it (engine/vllm_process.py), and the ingress, which reads a stream from
that server itself when the replica hands the stream over (serve/replica/relay.py,
``HANDOFF``). One forwarding rule for both, so a request reads the same whichever end
carried it: the request's own headers but the hop's, the response's status, media type and
headers but the hop's (the ingress frames the body itself), the body as it arrives.

What must stay true: a stream left before its end closes its connection - that is the
client's disconnect vLLM aborts on - and never returns it to the pool half-read.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import aiohttp

from fleetserve.engine.protocol import EngineRequest, ResponseHead

#: Response headers the ingress writes itself (the body is re-framed there).
HOP_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)
#: Request headers the hop to the server sets itself.
REQUEST_SKIPPED = frozenset({"host", "content-length", "connection", "transfer-encoding"})
#: The host part of every URL on the hop (the socket decides where it goes).
BASE_URL = "http://engine"


def open_session(socket_path: str) -> aiohttp.ClientSession:
    """A connection pool to the server on ``socket_path`` (no limit: vLLM's server takes
    as many connections as the replica admits requests; no timeout: a stream lasts as long
    as its generation)."""
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=socket_path, limit=0),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
    )


async def forward(
    session: aiohttp.ClientSession, request: EngineRequest
) -> AsyncGenerator[ResponseHead | bytes, None]:
    """``request`` on the server: its :class:`ResponseHead`, then its body as it arrives.

    Raises aiohttp's errors (or OSError) as they come: the caller decides what a server
    that cannot be reached means at its end."""
    url = BASE_URL + request.path
    if request.query_string:
        url += "?" + request.query_string
    headers = [(k, v) for k, v in request.headers if k.lower() not in REQUEST_SKIPPED]
    finished = False
    response: aiohttp.ClientResponse | None = None
    try:
        response = await session.request(
            request.method,
            url,
            data=request.body or None,
            headers=headers,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Accept"),
        )
        yield response_head(response)
        async for chunk in response.content.iter_any():
            if chunk:
                yield chunk
        finished = True
    finally:
        if response is not None:
            if finished:
                response.release()
            else:
                # closing the connection is the client's disconnect: vLLM aborts
                response.close()


def response_head(response: aiohttp.ClientResponse) -> ResponseHead:
    headers: list[tuple[str, str]] = []
    media_type = "application/octet-stream"
    for name, value in response.headers.items():
        key = name.lower()
        if key == "content-type":
            media_type = value
        elif key not in HOP_HEADERS:
            headers.append((key, value))
    return ResponseHead(status=response.status, headers=tuple(headers), media_type=media_type)
