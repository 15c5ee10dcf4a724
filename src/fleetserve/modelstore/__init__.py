"""fleetserve.modelstore: locate, assemble and convert model weights (offline)."""
