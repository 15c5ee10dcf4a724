"""fleetserve.engine."""
