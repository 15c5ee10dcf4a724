"""fleetserve.k8s."""
