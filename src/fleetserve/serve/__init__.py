"""fleetserve.serve."""
