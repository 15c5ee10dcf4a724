"""Where ``fleetserve top`` reads metrics: a Ray metrics endpoint or a Prometheus server.

Both give a :class:`~fleetserve.top.model.Snapshot` of the same raw series (counters,
gauges, histogram buckets, as the exposition names them), so the view model does not know
which one it reads:

* :class:`ExpositionSource` - ``GET`` a Prometheus exposition (a Ray node's metrics-export
  port: ``fleetserve serve --metrics-export-port P``, KubeRay's 8080), parsed with
  prometheus-client's parser;
* :class:`PrometheusSource` - one instant query for exactly the series the view reads
  (``{__name__=~"..."}``, optionally scoped by a selector), through Prometheus's HTTP API.

Failures raise :class:`MetricsSourceError` with a message for the user (unreachable, HTTP status,
not an exposition / not a Prometheus API answer).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.errors import MetricsSourceError
from fleetserve.observe.promql import matchers
from fleetserve.top.model import Sample, Snapshot, wanted_series

TIMEOUT_S = 5.0


class MetricsSource(Protocol):
    """Gives the current snapshot of the fleet's series."""

    description: str

    def fetch(self) -> Snapshot:
        """Read the series now (MetricsSourceError when it cannot)."""


def _get(client: httpx.Client, url: str, params: Mapping[str, str] | None = None) -> str:
    try:
        response = client.get(url, params=params, timeout=TIMEOUT_S)
    except httpx.HTTPError as e:
        raise MetricsSourceError(f"cannot read {url}: {e}") from e
    if response.status_code != 200:
        raise MetricsSourceError(f"{url} answered HTTP {response.status_code}")
    return response.text


class ExpositionSource:
    """A Prometheus exposition endpoint (Ray's metrics-export port)."""

    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        self.url = url
        self.description = url
        self._client = client or httpx.Client()
        self._wanted = frozenset(wanted_series())

    def fetch(self) -> Snapshot:
        text = _get(self._client, self.url)
        samples = []
        try:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name in self._wanted:
                        samples.append(Sample(s.name, dict(s.labels), float(s.value)))
        except ValueError as e:
            raise MetricsSourceError(f"{self.url} is not a Prometheus exposition: {e}") from e
        return Snapshot(at=time.monotonic(), samples=tuple(samples))


class PrometheusSource:
    """A Prometheus server's HTTP API (``/api/v1/query``)."""

    def __init__(
        self,
        url: str,
        selector: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.description = url + (matchers(selector) if selector else "")
        self._client = client or httpx.Client()
        names = "|".join(re.escape(n) for n in wanted_series())
        self.query = matchers(selector, f'__name__=~"{names}"')

    def fetch(self) -> Snapshot:
        text = _get(self._client, f"{self.url}/api/v1/query", {"query": self.query})
        try:
            data = httpx.Response(200, text=text).json()
            results = data["data"]["result"]
            at = float(results[0]["value"][0]) if results else time.time()
            samples = tuple(
                Sample(
                    r["metric"]["__name__"],
                    {k: v for k, v in r["metric"].items() if k != "__name__"},
                    float(r["value"][1]),
                )
                for r in results
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise MetricsSourceError(f"{self.url} did not answer like Prometheus's API: {e}") from e
        # Prometheus stamps the evaluation time: rates use it, not the local clock.
        return Snapshot(at=at if results else time.time(), samples=samples)
