"""A local fake OpenAI streaming server for bench tests, with controlled delays and faults.

aiohttp.web on its own event loop in a background thread, bound to 127.0.0.1 on a free
port. Streams ``/v1/completions`` and ``/v1/chat/completions`` the way vLLM does (one token
per SSE event, a usage event, ``[DONE]``), sleeping ``ttft_s`` before the first token and
``itl_s`` between tokens. Each generated token is the next word of the prompt (cycled), so
a response can be checked against its prompt.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeBehavior:
    """What the fake does; tests change fields before a run."""

    model: str = "fake-model"
    ttft_s: float = 0.0
    itl_s: float = 0.0
    default_tokens: int = 8
    accept_ignore_eos: bool = True
    send_usage: bool = True
    fail_every: int = 0
    """Every k-th generation request gets ``fail_status`` (0: never)."""
    fail_status: int = 500
    stream_error_after: int | None = None
    """Send an SSE error event after this many tokens."""
    disconnect_after: int | None = None
    """Drop the connection after this many tokens."""
    garbage_after: int | None = None
    """Send a non-JSON data line after this many tokens."""
    models_route: bool = True


@dataclass
class FakeOpenAIServer:
    behavior: FakeBehavior = field(default_factory=FakeBehavior)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    sent: list[list[float]] = field(default_factory=list)
    """Per streamed request: when its handler began, then when each token was written
    (``perf_counter``, the client's clock): what the server really did, sleeps overshot
    on a loaded host included."""
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _count: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOpenAIServer:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_post("/v1/completions", self._generate)
            app.router.add_post("/v1/chat/completions", self._generate)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True, name="fake-openai")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def reset(self, **changes: Any) -> FakeBehavior:
        self.behavior = FakeBehavior(**changes)
        self.bodies.clear()
        self.headers.clear()
        self.sent.clear()
        self._count = 0
        return self.behavior

    # ------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.Response:
        if not self.behavior.models_route:
            raise web.HTTPNotFound()
        return web.json_response(
            {"object": "list", "data": [{"id": self.behavior.model, "object": "model"}]}
        )

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response(
            {"error": {"message": message, "type": "BadRequestError", "code": status}},
            status=status,
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        began = time.perf_counter()
        b = self.behavior
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        chat = request.path.endswith("/chat/completions")
        if body.get("model") != b.model:
            return self._error(404, f"The model `{body.get('model')}` does not exist.")
        if "ignore_eos" in body and not b.accept_ignore_eos:
            return self._error(400, "Unrecognized request argument supplied: ignore_eos")
        self._count += 1
        if b.fail_every and self._count % b.fail_every == 0:
            return self._error(b.fail_status, "injected failure")
        prompt = " ".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
        words = prompt.split() or ["x"]
        n = int(body.get("max_tokens") or b.default_tokens)
        tokens = [words[i % len(words)] + " " for i in range(n)]
        if not body.get("stream"):
            text = "".join(tokens)
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            return web.json_response({"id": "x", "choices": [choice]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = [began]
        self.sent.append(sent)

        async def event(data: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")

        if chat:  # vLLM sends the role first, content-free
            await event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(b.ttft_s)
        for i, tok in enumerate(tokens):
            if i:
                await asyncio.sleep(b.itl_s)
            if b.disconnect_after is not None and i == b.disconnect_after:
                assert request.transport is not None
                request.transport.close()
                return resp
            if b.garbage_after is not None and i == b.garbage_after:
                await resp.write(b"data: {not json\n\n")
            if b.stream_error_after is not None and i == b.stream_error_after:
                await event({"error": {"message": "engine died", "code": 500}})
                break
            last = i == n - 1
            if chat:
                choice = {"index": 0, "delta": {"content": tok}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": tok, "finish_reason": None}
            if last:
                choice["finish_reason"] = "length"
            await event({"choices": [choice]})
            sent.append(time.perf_counter())
        opts = body.get("stream_options") or {}
        if b.send_usage and opts.get("include_usage"):
            usage = {"prompt_tokens": len(words), "completion_tokens": n}
            await event({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
