"""Ray Serve LLM's ``PrefixCacheAffinityRouter`` made to read fleetserve's requests.

Its text extraction looks for ``.messages`` / ``.prompt`` attributes on the request
arguments (Ray Serve LLM's parsed request objects); a fleetserve model deployment receives
an ``EngineRequest`` carrying the raw JSON body. This subclass only parses that body and
hands the messages to the router's own normaliser - everything else (prefix tree actor,
matching, thresholds) is Ray's. Used by ``benchmarks/routing.py`` (loaded by Serve from
``PYTHONPATH=benchmarks``).
"""

from __future__ import annotations

import json
from typing import Any

from ray.serve.llm.request_router import PrefixCacheAffinityRouter


class RayLLMPrefixRouter(PrefixCacheAffinityRouter):
    def _extract_text_from_request(self, pending_request: Any) -> str:
        for arg in pending_request.args:
            body = getattr(arg, "body", None)
            if isinstance(body, bytes | bytearray):
                payload = json.loads(body)
                prompt = payload.get("messages") or payload.get("prompt")
                return str(self._normalize_prompt_to_string(prompt))
        raise ValueError("no EngineRequest body among the request arguments")
