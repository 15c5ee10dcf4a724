"""The front door: the ingress Serve deployment, the gateway (auth, ``model``, errors,
deadlines, drain), request limits, LoRA adapter ids, probes, the gateway's metrics, and the
client that reaches model replicas (with its scale-from-zero wait)."""
