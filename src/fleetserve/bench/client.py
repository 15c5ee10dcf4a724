"""The streaming HTTP client that sends benchmark requests and timestamps every chunk.

Design: one aiohttp session (keep-alive pool, no client-side connection limit: the load
shape alone decides concurrency). The request body is serialised *before* the start
timestamp; each network read is timestamped as soon as the coroutine resumes, *before*
its events are parsed, and every content event of that read gets that time. So parsing cost
never shifts a timestamp, and the only client-side timing error left is event-loop delay,
which ``benchmarks/client_capacity.py`` measures.

Why aiohttp and not httpx: on this project's 2-core test machine httpx 0.28 streamed SSE
responses at ~0.5 k req/s (~20-80 ms TTFT error at 16-64 concurrent streams), aiohttp at
~5 k req/s (see docs/decisions.md, "Bench"); the client must never be the bottleneck.

What must stay true: a request never raises out of :meth:`StreamingClient.send`; every
failure becomes an ``error_type`` on the record (connection, HTTP status, stream error).
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from types import TracebackType
from typing import Any, Literal

import aiohttp
import msgspec

from fleetserve.bench.record import RequestRecord
from fleetserve.bench.sse import SseParser
from fleetserve.bench.workload.base import BenchRequest

Endpoint = Literal["chat", "completions"]
_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_MAX_ERROR_CHARS = 500


# Typed views of a streamed chunk: msgspec decodes only these fields, ~10x faster than
# json.loads into dicts, and per-event decode cost is what bounds streamed tokens/s.
class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def normalize_base_url(url: str) -> str:
    """``http://h:8000/v1/`` -> ``http://h:8000`` (paths are added per endpoint)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class StreamingClient:
    """Sends :class:`BenchRequest` s as streaming OpenAI requests; fills records."""

    def __init__(
        self,
        base_url: str,
        model: str,
        endpoint: Endpoint = "chat",
        *,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        ignore_eos: bool = False,
        extra_body: dict[str, Any] | None = None,
        timeout_s: float = 600.0,
        origin: float | None = None,
        keep_text: bool = True,
    ) -> None:
        self.url = normalize_base_url(base_url) + _PATHS[endpoint]
        self.model = model
        self.endpoint = endpoint
        self.ignore_eos = ignore_eos
        self.extra_body = dict(extra_body or {})
        self.origin = perf_counter() if origin is None else origin
        self.keep_text = keep_text
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 30))
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamingClient:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300)
        # Headers live on the session: merging per-request headers costs event-loop time.
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def payload(self, request: BenchRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``."""
        body: dict[str, Any] = {"model": self.model}
        if self.endpoint == "chat":
            messages = [{"role": "user", "content": request.prompt}]
            if request.system:
                messages.insert(0, {"role": "system", "content": request.system})
            body["messages"] = messages
        else:
            body["prompt"] = (request.system or "") + request.prompt
        body["max_tokens"] = request.max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra_body)
        return body

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        """Send ``request`` and fill ``record``'s timings, usage and outcome. Never raises
        (except cancellation)."""
        session = self._session
        if session is None:
            raise RuntimeError("StreamingClient used outside 'async with'")
        body = json.dumps(self.payload(request)).encode()
        chat = self.endpoint == "chat"
        decode = _decode_chunk
        start = perf_counter()
        record.start = start - self.origin
        last_read = start
        first = 0.0
        last = 0.0
        chunks = 0
        pieces: list[str] = []
        itl = record.itl
        try:
            async with session.post(self.url, data=body) as resp:
                record.status = resp.status
                if resp.status != 200:
                    raw = await resp.read()
                    record.e2e = perf_counter() - start
                    record.error_type = "http_error"
                    record.error = _http_error_message(resp.status, resp.reason, raw)
                    return
                parser = SseParser()
                done = False
                async for data in resp.content.iter_any():
                    now = perf_counter()
                    last_read = now
                    for payload in parser.feed(data):
                        if payload == b"[DONE]":
                            done = True
                            continue
                        event = decode(payload)
                        choices = event.choices
                        if choices:
                            choice = choices[0]
                            if chat:
                                delta = choice.delta
                                piece = (
                                    None
                                    if delta is None
                                    else delta.content or delta.reasoning_content or delta.reasoning
                                )
                            else:
                                piece = choice.text
                            if piece:
                                if chunks:
                                    itl.append(now - last)
                                else:
                                    first = now
                                last = now
                                chunks += 1
                                pieces.append(piece)
                            reason = choice.finish_reason
                            if reason:
                                record.finish_reason = reason
                        usage = event.usage
                        if usage is not None:
                            record.usage_in = usage.prompt_tokens
                            record.usage_out = usage.completion_tokens
                        error = event.error
                        if error:
                            record.error_type = "stream_error"
                            record.error = _truncate(_error_text(error))
                for payload in parser.flush():
                    done = done or payload == b"[DONE]"
                record.e2e = last_read - start
                if chunks:
                    record.ttft = first - start
                record.chunks = chunks
                if record.error_type is None:
                    if chunks:
                        record.ok = True
                    else:
                        record.error_type = "empty_response"
                        record.error = "the stream ended without a generated token" + (
                            "" if done else " (and without [DONE])"
                        )
        except aiohttp.InvalidURL as e:
            _fail(record, start, "client_error", f"invalid URL {self.url}: {e}")
        except msgspec.MsgspecError as e:
            _fail(record, start, "invalid_response", f"unparseable SSE event: {e}")
        except aiohttp.ClientConnectorError as e:
            message = f"cannot connect to {self.url}: {e.os_error}"
            _fail(record, start, "connection_refused", message)
        except aiohttp.ConnectionTimeoutError as e:
            _fail(record, start, "connect_timeout", f"connecting to {self.url} timed out: {e}")
        except (TimeoutError, aiohttp.ServerTimeoutError):
            _fail(record, start, "timeout", f"no complete answer within {self._timeout.total:g} s")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as e:
            _fail(record, start, "server_disconnected", f"connection closed mid-response: {e}")
        except aiohttp.ClientOSError as e:
            _fail(record, start, "server_disconnected", f"connection error: {e}")
        except aiohttp.ClientError as e:
            _fail(record, start, "client_error", f"{type(e).__name__}: {e}")
        if record.ttft is None and chunks:
            record.ttft = first - start
            record.chunks = chunks
        if self.keep_text:
            record.text = "".join(pieces)


def _fail(record: RequestRecord, start: float, error_type: str, message: str) -> None:
    record.e2e = perf_counter() - start
    record.ok = False
    record.error_type = error_type
    record.error = _truncate(message)


def _http_error_message(status: int, reason: str | None, raw: bytes) -> str:
    """``HTTP 404 Not Found: The model `x` does not exist.`` from an OpenAI error body."""
    detail = raw.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(detail)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        detail = _error_text(parsed.get("error", parsed.get("detail", parsed)))
    head = f"HTTP {status} {reason or ''}".rstrip()
    return _truncate(f"{head}: {detail}" if detail else head)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or json.dumps(error)
        return str(message)
    return str(error)


def _truncate(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


async def drain(tasks: set[asyncio.Task[None]]) -> None:
    """Wait for in-flight request tasks (used when a run ends)."""
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
