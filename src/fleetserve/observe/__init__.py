"""fleetserve.observe."""
