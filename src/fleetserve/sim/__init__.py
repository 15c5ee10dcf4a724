"""The fleet simulator: discrete events over engine steps, routing and autoscaling (pure:
no Ray, no vLLM). ``fleetserve simulate`` is its command (:mod:`fleetserve.sim.command`)."""
