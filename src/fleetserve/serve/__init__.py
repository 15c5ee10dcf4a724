"""fleetserve.serve: the OpenAI endpoint on Ray Serve, split by where a request goes.

Request path (data plane): ``ingress`` (HTTP: limits, the gateway, errors, probes,
metrics, the client that reaches replicas) -> ``guard`` (API keys, tenant quotas, exact
per-model admission with fair queuing) -> ``routing`` (Serve's request router: which
replica) -> ``replica`` (the model deployment running the engine, and the stream relay that
carries its answers back). ``control`` (control plane) is ``fleetserve serve``: the
command, the lifecycle, the application builder, autoscaling, the resource fit. Every
number a deployment runs with comes from the plan (``fleetserve.plan.deployment``).
``tests/unit/test_layers.py`` keeps the parts depending only down this path.
"""
