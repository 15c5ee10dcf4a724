"""Checks before a run: is the endpoint reachable, is the model served, is ``ignore_eos``
accepted. Each failure becomes a :class:`BenchError` with a message a user can act on,
instead of N identical failed requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from fleetserve.bench.client import Endpoint, normalize_base_url
from fleetserve.errors import BenchError

_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    served_models: tuple[str, ...] | None
    """Model ids from ``/v1/models`` (``None`` when the server has no such route)."""
    ignore_eos: bool
    ignore_eos_note: str


class EndpointProbe:
    """Probes one OpenAI-compatible endpoint."""

    def __init__(
        self, base_url: str, model: str, endpoint: Endpoint, headers: dict[str, str]
    ) -> None:
        self.base = normalize_base_url(base_url)
        self.model = model
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/json", **headers}

    async def run(self, ignore_eos: str) -> ProbeResult:
        """``ignore_eos`` is ``auto`` (probe), ``on`` or ``off``."""
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            models = await self._models(session)
            if models is not None and self.model not in models:
                raise BenchError(
                    f"model {self.model!r} is not served at {self.base} "
                    f"(served: {', '.join(models) or 'none'})",
                    hint="pass one of the served ids with --model",
                )
            if ignore_eos == "off":
                return ProbeResult(models, False, "(--ignore-eos off)")
            if ignore_eos == "on":
                return ProbeResult(models, True, "(--ignore-eos on)")
            status, _ = await self._tiny_request(session, ignore_eos=True)
            if status == 200:
                return ProbeResult(models, True, "(accepted by the server)")
            status2, detail2 = await self._tiny_request(session, ignore_eos=False)
            if status2 == 200:
                return ProbeResult(
                    models,
                    False,
                    f"(rejected by the server with HTTP {status}; output lengths may be short)",
                )
            raise BenchError(f"a test request to {self.base} failed: HTTP {status2}: {detail2}")

    async def _models(self, session: aiohttp.ClientSession) -> tuple[str, ...] | None:
        url = f"{self.base}/v1/models"
        try:
            async with session.get(url, headers=self.headers) as resp:
                if resp.status in (401, 403):
                    raise BenchError(
                        f"{url}: HTTP {resp.status} (not authorised)",
                        hint="pass --api-key (or set OPENAI_API_KEY)",
                    )
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except aiohttp.InvalidURL as e:
            raise BenchError(f"--base-url {self.base}: not a valid URL") from e
        except aiohttp.ClientConnectorError as e:
            raise BenchError(
                f"cannot connect to {self.base}: {e.os_error.strerror or e.os_error}",
                hint="is the server running and is --base-url right?",
            ) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise BenchError(f"{url}: {type(e).__name__}: {e}") from e
        except ValueError:
            return None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return None
        return tuple(str(m.get("id")) for m in data if isinstance(m, dict))

    async def _tiny_request(
        self, session: aiohttp.ClientSession, *, ignore_eos: bool
    ) -> tuple[int, str]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": 1, "stream": False}
        if self.endpoint == "chat":
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": "Hi"}]
        else:
            path = "/v1/completions"
            body["prompt"] = "Hi"
        if ignore_eos:
            body["ignore_eos"] = True
        try:
            async with session.post(self.base + path, json=body, headers=self.headers) as resp:
                text = await resp.text()
                return resp.status, _message(text)
        except aiohttp.ClientConnectorError as e:
            raise BenchError(f"cannot connect to {self.base}: {e.os_error}") from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise BenchError(f"test request to {self.base}{path}: {type(e).__name__}: {e}") from e


def _message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
    return text[:300]
