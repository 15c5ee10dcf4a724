"""fleetserve.plan."""
