"""HandleModelClient: how the ingress's handles to model deployments are configured."""

from __future__ import annotations

from typing import Any

from fleetserve.serve.model_client import HandleModelClient


class RecordingHandle:
    def __init__(self) -> None:
        self.options_seen: dict[str, Any] = {}

    def options(self, **kwargs: Any) -> RecordingHandle:
        self.options_seen = kwargs
        return self


def test_streams_use_serves_grpc_transport_on_any_cluster() -> None:
    # Not by reference: items go over the replicas' gRPC server instead of becoming Ray
    # objects (benchmarks/serve_path.py); this must hold on clusters fleetserve did not
    # start, where the fast-path environment flags are absent.
    handle = RecordingHandle()
    HandleModelClient({"m": handle})
    assert handle.options_seen == {"stream": True, "_by_reference": False}
