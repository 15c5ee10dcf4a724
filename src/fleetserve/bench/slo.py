"""Service-level objective for goodput: ``--slo ttft=500ms,tpot=50ms,e2e=10s``.

A request counts toward goodput when it succeeded and meets every given bound. Values take
``ms`` or ``s`` (bare numbers are milliseconds, as in vLLM's ``--goodput``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.bench.record import RequestRecord
from fleetserve.errors import UsageError

_KEYS = ("ttft", "tpot", "itl", "e2e")


class Slo(BaseModel):
    """Upper bounds in seconds; ``None`` means unconstrained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft: float | None = Field(default=None, gt=0, le=3600, description="Max TTFT (s).")
    tpot: float | None = Field(default=None, gt=0, le=3600, description="Max TPOT (s).")
    itl: float | None = Field(
        default=None, gt=0, le=3600, description="Max single inter-token gap (s)."
    )
    e2e: float | None = Field(default=None, gt=0, le=86400, description="Max latency (s).")

    @classmethod
    def parse(cls, text: str) -> Slo:
        """Parse ``key=value[,key=value...]`` with keys ttft, tpot, itl, e2e."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in _KEYS:
                raise UsageError(
                    f"--slo: cannot read {part!r}",
                    hint="write e.g. --slo ttft=500ms,tpot=50ms (keys: ttft, tpot, itl, e2e)",
                )
            values[key] = parse_duration(raw, flag=f"--slo {key}", default_unit="ms")
        if not values:
            raise UsageError("--slo: no bound given", hint="e.g. --slo ttft=500ms,tpot=50ms")
        return cls(**values)

    @property
    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in _KEYS)

    def met_by(self, record: RequestRecord) -> bool:
        """True when ``record`` succeeded and meets every bound."""
        if not record.ok:
            return False
        if self.ttft is not None and (record.ttft is None or record.ttft > self.ttft):
            return False
        if self.tpot is not None:
            tpot = record.tpot
            if tpot is not None and tpot > self.tpot:
                return False
        if self.itl is not None and record.itl and max(record.itl) > self.itl:
            return False
        return not (self.e2e is not None and (record.e2e is None or record.e2e > self.e2e))

    def describe(self) -> str:
        parts = [f"{k}<={getattr(self, k) * 1e3:g}ms" for k in _KEYS if getattr(self, k)]
        return ", ".join(parts) or "none"


def parse_duration(text: str, *, flag: str, default_unit: str = "s") -> float:
    """``250ms`` / ``1.5s`` / ``2m`` / bare number in ``default_unit`` -> seconds."""
    raw = text.strip().lower()
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if raw.endswith(unit):
            number, factor = raw[: -len(unit)], scale[unit]
            break
    else:
        number, factor = raw, scale[default_unit]
    try:
        value = float(number) * factor
    except ValueError as e:
        raise UsageError(f"{flag}: cannot read duration {text!r}", hint="e.g. 500ms, 2s, 1m") from e
    if not value > 0:
        raise UsageError(f"{flag}: duration must be > 0, got {text!r}")
    return value
