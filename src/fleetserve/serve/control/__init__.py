"""The control plane of ``fleetserve serve``: the command, the server's lifecycle (check,
start Ray, deploy, drain, stop), the Serve application builder, the autoscaling policy,
the resource fit and port picking. Reads the plan's deployments; decides none of them."""
