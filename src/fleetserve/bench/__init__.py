"""fleetserve.bench: load generator and report for any OpenAI-compatible endpoint.

Pipeline: a :mod:`workload <fleetserve.bench.workload>` yields requests, a
:class:`~fleetserve.bench.load.LoadPoint` decides when each is sent, the
:class:`~fleetserve.bench.client.StreamingClient` sends it and timestamps every streamed chunk
into a :class:`~fleetserve.bench.record.RequestRecord`, :mod:`~fleetserve.bench.metrics` reduces
records to a summary, and :mod:`~fleetserve.bench.report` writes JSON / Markdown / PNG.
"""
