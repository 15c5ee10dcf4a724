"""Request routers the routing benchmark loads into Serve (``PYTHONPATH=benchmarks``).

``RayLLMPrefixRouter``: Ray Serve LLM's ``PrefixCacheAffinityRouter`` made to read
fleetserve's requests. Its text extraction looks for ``.messages`` / ``.prompt`` attributes
on the request arguments (Ray Serve LLM's parsed request objects); a fleetserve model
deployment receives an ``EngineRequest`` carrying the raw JSON body. This subclass only
parses that body and hands the messages to the router's own normaliser - everything else
(prefix tree actor, matching, thresholds) is Ray's.

``ArmRouter``: all arms in one router, so one pair of engines serves every arm and the
benchmark can interleave them (phases of arm A, B, C, A, B, C ... on the same replicas,
minutes of host noise shared instead of compared). Each request names its arm in the
OpenAI ``user`` field (``arm=<name>;...``): ``fleetserve`` is ``FleetRouter``'s own
``choose_replicas`` with the knobs it was configured with, ``pow2`` Serve's
power-of-two choice, ``rayllm`` Ray Serve LLM's router (the same unbound methods those
classes run, over this router's state). Every routed request updates both routers' state
(fleetserve's index, Ray Serve LLM's prefix tree), as each would see the deployment's whole
traffic in production. When ``FLEETSERVE_ROUTING_LOG`` names a file, every routed request
appends one JSON line: arm, tag, chosen replica, and per replica the load and the prompt
blocks fleetserve's index believed it held at that moment (the benchmark's diagnosis).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.llm.request_router import PrefixCacheAffinityRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

from fleetserve.serve.routing.router import FleetRouter, _body


class RayLLMPrefixRouter(PrefixCacheAffinityRouter):
    def _extract_text_from_request(self, pending_request: Any) -> str:
        for arg in pending_request.args:
            body = getattr(arg, "body", None)
            if isinstance(body, bytes | bytearray):
                payload = json.loads(body)
                prompt = payload.get("messages") or payload.get("prompt")
                return str(self._normalize_prompt_to_string(prompt))
        raise ValueError("no EngineRequest body among the request arguments")


def request_tag(pending_request: PendingRequest | None) -> str:
    """The benchmark's ``user`` field of a request ("" when absent)."""
    if pending_request is None:
        return ""
    body = _body(pending_request)
    if not body:
        return ""
    try:
        user = json.loads(body).get("user")
    except ValueError:
        return ""
    return user if isinstance(user, str) else ""


def request_arm(tag: str) -> str:
    for part in tag.split(";"):
        if part.startswith("arm="):
            return part[4:]
    return "fleetserve"


class ArmRouter(FleetRouter, RayLLMPrefixRouter):
    """fleetserve | pow2 | rayllm per request, on one deployment's replicas."""

    def initialize_state(self, **kwargs: Any) -> None:  # type: ignore[override]
        FleetRouter.initialize_state(self, **kwargs)
        PrefixCacheAffinityRouter.initialize_state(self)
        path = os.environ.get("FLEETSERVE_ROUTING_LOG")
        self._log = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._depth: dict[str, dict[str, int]] = {}

    async def choose_replicas(  # type: ignore[override]
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        arm = request_arm(request_tag(pending_request))
        if self._log is not None and pending_request is not None:
            # What the index believed before this choice (fleetserve's adds its own at once).
            blocks = self._key(pending_request).blocks
            ids = [r.replica_id.unique_id for r in candidate_replicas]
            request_id = pending_request.metadata.internal_request_id
            self._depth[request_id] = self._index.match(blocks, ids)
        ranked: list[list[RunningReplica]]
        if arm == "rayllm":
            # Ray annotates it as a flat list; it returns ranks like every router.
            ranked = await PrefixCacheAffinityRouter.choose_replicas(  # type: ignore[assignment]
                self, candidate_replicas, pending_request
            )
        elif arm == "pow2":
            ranked = await PowerOfTwoChoicesRequestRouter.choose_replicas(
                self,  # type: ignore[arg-type]
                candidate_replicas,
                pending_request,
            )
        elif arm == "fleetserve-bound":
            # The pre-cost-model default: a hard bound of 1.25 x the mean load.
            own = self._params
            self._params = dataclasses.replace(own, load_factor=1.25)
            try:
                ranked = await FleetRouter.choose_replicas(
                    self, candidate_replicas, pending_request
                )
            finally:
                self._params = own
        else:
            ranked = await FleetRouter.choose_replicas(self, candidate_replicas, pending_request)
        return ranked

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        # fleetserve's index learns every arm's traffic (the replicas' caches hold it all)
        blocks = self._key(pending_request).blocks
        if self._log is not None:
            tag = request_tag(pending_request)
            replicas = list(self._replicas)
            request_id = pending_request.metadata.internal_request_id
            # The view before the choice; an empty one (nothing cached) is a view too.
            depth = self._depth.pop(request_id, None)
            if depth is None:
                depth = self._index.match(blocks, [r.unique_id for r in replicas])
            record = {
                "t": time.time(),
                "arm": request_arm(tag),
                "tag": tag,
                "replica": replica_id.unique_id,
                "blocks": len(blocks),
                "depth": depth,
                "load": {r.unique_id: self._load(self._replicas[r]) for r in replicas},
            }
            self._log.write(json.dumps(record) + "\n")
        FleetRouter.on_request_routed(self, pending_request, replica_id, result)
        PrefixCacheAffinityRouter.on_request_routed(self, pending_request, replica_id, result)
