"""Token-length distributions for synthetic prompts and outputs.

Written on the command line as ``128`` / ``fixed:128``, ``uniform:64-256`` (inclusive) or
``normal:128,32`` (mean, standard deviation; rounded and clipped to ``[min, max]``). Samples
come from the caller's seeded generator, so a seed makes every length repeatable.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetserve.errors import UsageError


class LengthDistribution(BaseModel):
    """A distribution of token counts (>= 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed", "uniform", "normal"] = Field(description="Shape of the distribution.")
    low: int = Field(ge=1, le=1_000_000, description="Fixed value, or the lower bound.")
    high: int = Field(ge=1, le=1_000_000, description="Upper bound (== low when fixed).")
    mean: float = Field(default=0.0, ge=0, description="Mean (normal only).")
    std: float = Field(default=0.0, ge=0, description="Standard deviation (normal only).")

    @model_validator(mode="after")
    def _check(self) -> LengthDistribution:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        if self.kind == "fixed" and self.low != self.high:
            raise ValueError(f"fixed length needs low == high, got {self.low} and {self.high}")
        return self

    @classmethod
    def parse(cls, text: str, *, flag: str = "length") -> LengthDistribution:
        """Parse ``N``, ``fixed:N``, ``uniform:LO-HI`` or ``normal:MEAN,STD``."""
        kind, _, arg = text.strip().partition(":")
        if not arg:
            kind, arg = "fixed", kind
        try:
            if kind == "fixed":
                n = int(arg)
                return cls(kind="fixed", low=n, high=n, mean=n)
            if kind == "uniform":
                lo, _, hi = arg.partition("-")
                return cls(kind="uniform", low=int(lo), high=int(hi), mean=(int(lo) + int(hi)) / 2)
            if kind == "normal":
                mean_s, _, std_s = arg.partition(",")
                mean, std = float(mean_s), float(std_s)
                high = max(1, round(mean + 4 * std))
                return cls(kind="normal", low=1, high=high, mean=mean, std=std)
        except ValueError as e:
            raise UsageError(
                f"{flag}: cannot read {text!r}: {_first_line(e)}",
                hint="use N, fixed:N, uniform:LO-HI or normal:MEAN,STD",
            ) from e
        raise UsageError(
            f"{flag}: unknown distribution {kind!r} in {text!r}",
            hint="use N, fixed:N, uniform:LO-HI or normal:MEAN,STD",
        )

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one length."""
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return int(rng.integers(self.low, self.high + 1))
        return int(min(self.high, max(self.low, round(rng.normal(self.mean, self.std)))))

    def describe(self) -> str:
        """Back to the command-line form (used in reports)."""
        if self.kind == "fixed":
            return str(self.low)
        if self.kind == "uniform":
            return f"uniform:{self.low}-{self.high}"
        return f"normal:{self.mean:g},{self.std:g}"


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
