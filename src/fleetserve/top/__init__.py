"""``fleetserve top``: a live terminal view of a running fleet."""
