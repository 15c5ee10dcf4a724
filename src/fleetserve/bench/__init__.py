"""fleetserve.bench."""
