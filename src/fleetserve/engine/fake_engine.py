"""A model-free engine with the OpenAI HTTP surface, for fast tests of the serving stack.

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming or not, ``n``,
``stream_options.include_usage``, ``max_tokens``/``max_completion_tokens``) with
deterministic text ("tok0 tok1 ..."), one whitespace-separated word per token, and rejects
what vLLM rejects with vLLM's error shape: an unknown ``model`` (404; LoRA adapters are
known as vLLM knows them: static ones, and ``adapter_dir`` ones found on first request;
the response's ``model`` is the adapter id, as vLLM's is), an ``adapter_dir`` adapter that
does not fit the base (400, the real replica's check), a prompt plus
``max_tokens`` over ``max_model_len`` (400, ``param: max_tokens``), bad sampling values
(400). ``fake_token_delay_s`` slows generation so drain and disconnect can be observed.
It runs behind the same :class:`~fleetserve.engine.asgi_bridge.AsgiBridge` as vLLM.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fleetserve.adapters import base_config, base_weight_shapes, find_in, load_problem, refusal
from fleetserve.engine.asgi_bridge import AsgiBridge
from fleetserve.engine.config import EngineConfig
from fleetserve.engine.protocol import EngineRequest, EngineStats, ResponseHead
from fleetserve.engine.reaper import EngineProcesses
from fleetserve.errors import EngineError

#: The fake engine core's program: sleeps until killed (argv[1]: the model name).
FAKE_CORE = "import time\nwhile True:\n    time.sleep(3600)\n"


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> bytes:
    """An error in vLLM's OpenAI shape."""
    return json.dumps(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    ).encode()


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


class FakeEngine:
    """Deterministic echo engine (the :class:`Engine` Protocol)."""

    def __init__(self, config: EngineConfig, *, core_process: bool = False) -> None:
        self._config = config
        self.running = 0
        self._bridge: AsgiBridge | None = None
        self._healthy = True
        self._core_process = core_process
        self._core: subprocess.Popen[bytes] | None = None
        self._processes: EngineProcesses | None = None
        # Adapters "loaded", oldest first: static ones at start, then by use (see _hold).
        self._held: dict[str, None] = {}

    async def start(self) -> None:
        if self._config.lora is not None:  # vLLM loads static adapters at start
            for name in sorted(self._config.lora.modules):
                self._hold(name)
        if self._core_process:
            # Like vLLM's engine core: a child process that does not watch its parent,
            # so only the reaper's watchdog stops it when the replica dies uncleanly.
            self._processes = EngineProcesses()
            self._core = subprocess.Popen(
                [sys.executable, "-c", FAKE_CORE, self._config.name],
                stdin=subprocess.DEVNULL,
            )
            self._processes.guard()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )
        self._bridge = AsgiBridge(app)

    def handle(self, request: EngineRequest) -> AsyncIterator[ResponseHead | bytes]:
        if self._bridge is None:
            raise EngineError(f"model '{self._config.name}': engine not started")
        if not self._alive():
            # as VllmEngine refuses a request once its engine core died
            raise EngineError(f"model '{self._config.name}': its engine stopped; retry later")
        return self._bridge.handle(request)

    def mark_unhealthy(self) -> None:
        """Fail health checks and refuse requests from now on, as a vLLM engine whose core
        died does."""
        self._healthy = False

    def _alive(self) -> bool:
        """Neither marked unhealthy nor (with ``core_process``) its core process gone."""
        return self._healthy and (self._core is None or self._core.poll() is None)

    async def check_health(self) -> None:
        if not self._alive():
            raise EngineError(f"model '{self._config.name}': fake engine marked unhealthy")

    def stats(self) -> EngineStats:
        b = self._bridge
        if b is None:
            return EngineStats()
        return EngineStats(
            running=self.running,
            in_flight=b.in_flight,
            aborted=b.aborted,
            completed=b.completed,
            alive=self._alive(),
        )

    async def shutdown(self) -> None:
        self._bridge = None
        if self._core is not None:
            self._core.terminate()
            self._core.wait(10)
            self._core = None
        if self._processes is not None:
            self._processes.stop()
            self._processes = None

    # ------------------------------------------------------------------ HTTP handlers

    async def _health(self, _request: Request) -> Response:
        return Response(status_code=200)

    async def _chat(self, request: Request) -> Response:
        return await _with_cancellation(request, self._generate(request, chat=True))

    async def _completions(self, request: Request) -> Response:
        return await _with_cancellation(request, self._generate(request, chat=False))

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise _BadRequest(
                    400, "request body must be a JSON object", "BadRequestError", None
                )
            params = self._validate(body, chat=chat)
        except json.JSONDecodeError as e:
            return _error(400, f"invalid JSON body: {e}", "BadRequestError", None)
        except _BadRequest as e:
            return _error(e.status, e.message, e.err_type, e.param)
        except (TypeError, AttributeError, ValueError) as e:
            # A field of the wrong type: vLLM's pydantic request models answer 400.
            return _error(400, f"invalid request: {e}", "BadRequestError", None)
        if params["stream"]:
            return StreamingResponse(
                self._stream(params, chat=chat), media_type="text/event-stream"
            )
        choices = []
        for index in range(params["n"]):
            text = await self._text(params["max_tokens"])
            if chat:
                choices.append(
                    {
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length",
                    }
                )
            else:
                choices.append({"index": index, "text": text, "finish_reason": "length"})
        return JSONResponse(
            {
                "id": _id(chat),
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": params["model"],
                "choices": choices,
                "usage": _usage(params["prompt_tokens"], params["max_tokens"] * params["n"]),
            }
        )

    def _validate(self, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        model = body.get("model")
        if model is not None and not self._serves(model):  # vLLM: absent = served model
            raise _BadRequest(404, f"The model `{model}` does not exist.", "NotFoundError", None)
        problem = self._adapter_problem(model)
        if problem is not None:  # as the real replica's check_before_load answers
            raise _BadRequest(400, problem, "BadRequestError", "model")
        self._hold(model)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest(400, "messages: Field required", "BadRequestError", "messages")
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            if "prompt" not in body:
                raise _BadRequest(400, "prompt: Field required", "BadRequestError", "prompt")
            prompt = str(body["prompt"])
        prompt_tokens = len(prompt.split()) + 1
        limit = self._config.settings.max_model_len
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = max(1, min(16, limit - prompt_tokens))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _BadRequest(
                400,
                "max_tokens must be at least 1, got {max_tokens}.",
                "BadRequestError",
                "max_tokens",
            )
        if prompt_tokens + max_tokens > limit:
            raise _BadRequest(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {max_tokens} in the completion).",
                "BadRequestError",
                "max_tokens",
            )
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise _BadRequest(
                400,
                f"temperature must be in [0, 2], got {temperature}.",
                "BadRequestError",
                "temperature",
            )
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1:
            raise _BadRequest(400, f"n must be at least 1, got {n}.", "BadRequestError", "n")
        stream_options = body.get("stream_options") or {}
        return {
            "model": model or self._config.name,
            "stream": bool(body.get("stream", False)),
            "include_usage": bool(stream_options.get("include_usage", False)),
            "max_tokens": max_tokens,
            "prompt_tokens": prompt_tokens,
            "n": n,
        }

    def _serves(self, model: object) -> bool:
        """The base model, a static adapter, or one present in the adapter directory."""
        lora = self._config.lora
        if model == self._config.name:
            return True
        if lora is None or not isinstance(model, str):
            return False
        if model in lora.modules:
            return True
        return lora.adapter_dir is not None and find_in(Path(lora.adapter_dir), model) is not None

    def _hold(self, model: object) -> None:
        """Note an adapter as loaded, LRU within max_cpu_loras (as vLLM's cache keeps it)."""
        lora = self._config.lora
        if lora is None or not isinstance(model, str) or model == self._config.name:
            return
        self._held.pop(model, None)
        self._held[model] = None
        while len(self._held) > (lora.max_cpu_loras or lora.max_loras):
            del self._held[next(iter(self._held))]

    async def adapters(self) -> tuple[str, ...]:
        return tuple(sorted(self._held))

    def _adapter_problem(self, model: object) -> str | None:
        """Why an ``adapter_dir`` adapter does not fit the base (the real engine's check,
        :func:`fleetserve.engine.lora.check_before_load`, with the same message)."""
        lora = self._config.lora
        if lora is None or lora.adapter_dir is None or not isinstance(model, str):
            return None
        if model == self._config.name or model in lora.modules:
            return None
        path = find_in(Path(lora.adapter_dir), model)
        if path is None:
            return None
        weights = Path(self._config.model_path)
        problem = load_problem(
            path,
            max_lora_rank=lora.max_lora_rank,
            served_config=base_config(weights),
            base_shapes=base_weight_shapes(weights),
            target_modules=lora.target_modules,
        )
        return None if problem is None else refusal(model, self._config.name, problem)

    async def _text(self, max_tokens: int) -> str:
        words = []
        self.running += 1
        try:
            for i in range(max_tokens):
                if self._config.fake_token_delay_s:
                    await asyncio.sleep(self._config.fake_token_delay_s)
                words.append(f"tok{i}")
        finally:
            self.running -= 1
        return " ".join(words)

    async def _stream(self, params: dict[str, Any], *, chat: bool) -> AsyncIterator[bytes]:
        rid, created, name = _id(chat), int(time.time()), params["model"]
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            chunk: dict[str, Any] = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": name,
                "choices": choices,
            }
            if usage is not None:
                chunk["usage"] = usage
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        self.running += 1
        try:
            for index in range(params["n"]):
                if chat:
                    yield event([{"index": index, "delta": {"role": "assistant", "content": ""}}])
                for i in range(params["max_tokens"]):
                    if self._config.fake_token_delay_s:
                        await asyncio.sleep(self._config.fake_token_delay_s)
                    piece = f"tok{i}" if i == 0 else f" tok{i}"
                    last = i == params["max_tokens"] - 1
                    if chat:
                        choice: dict[str, Any] = {"index": index, "delta": {"content": piece}}
                    else:
                        choice = {"index": index, "text": piece}
                    choice["finish_reason"] = "length" if last else None
                    yield event([choice])
            if params["include_usage"]:
                yield event([], _usage(params["prompt_tokens"], params["max_tokens"] * params["n"]))
            yield b"data: [DONE]\n\n"
        finally:
            self.running -= 1


async def _with_cancellation(request: Request, handler: Coroutine[Any, Any, Response]) -> Response:
    """Run ``handler`` until it ends or the client disconnects, as vLLM's routes do.

    The same shape as ``vllm.entrypoints.utils.with_cancellation``: the handler runs in a
    task of its own, raced against a task that watches ``receive()`` for
    ``http.disconnect``; the loser is cancelled. Like vLLM's, the handler task is not
    cancelled when the *caller* is cancelled - so the fake fails the way vLLM does if the
    bridge cancels the app before the watcher sees the disconnect.
    """
    await request.body()  # parsed before the route runs, as FastAPI does for vLLM
    work = asyncio.create_task(handler)
    watch = asyncio.create_task(_listen_for_disconnect(request))
    done, pending = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if work in done:
        return work.result()
    return Response(status_code=499)


async def _listen_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _error(status: int, message: str, err_type: str, param: str | None) -> Response:
    return Response(
        error_body(status, message, err_type, param),
        status_code=status,
        media_type="application/json",
    )


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
