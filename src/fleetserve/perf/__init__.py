"""The performance model: how fast one vLLM engine runs a model on a card, a slice or CPU
cores (pure: no Ray, no vLLM).

Public API (stable; changes are noted in commit messages):

* :func:`engine_perf` (model config + card + calibration -> :class:`EnginePerf`), whose
  :meth:`EnginePerf.step_time` / :meth:`EnginePerf.terms` give one step's time from its
  :class:`StepLoad` (built by :meth:`EnginePerf.load` from prefill chunks and decode
  contexts; :meth:`EnginePerf.step_seconds` the same from the load's sums,
  :attr:`StepLoad.sums`) and :meth:`EnginePerf.decode_step_time` a pure-decode step;
* :func:`estimate` (engine + :class:`Traffic` + :class:`EngineLimits` -> :class:`Estimate`):
  steady-state capacity, throughput, TTFT and TPOT at a request rate, without simulating;
* :class:`Calibration`: the fitted constants (``fleetserve plan calibrate`` writes them,
  :meth:`Calibration.load` reads them, :meth:`Calibration.default` without a file).

The GPU facts live in :mod:`fleetserve.plan.gpus`, the model facts in
:mod:`fleetserve.plan.architecture` / :mod:`fleetserve.plan.memory`.
"""

from fleetserve.perf.calibration import Calibration, FitInfo
from fleetserve.perf.model import (
    EnginePerf,
    Hardware,
    ModelCost,
    StepLoad,
    StepTerms,
    engine_perf,
    model_cost,
)
from fleetserve.perf.steady import EngineLimits, Estimate, Traffic, estimate

__all__ = [
    "Calibration",
    "EngineLimits",
    "EnginePerf",
    "Estimate",
    "FitInfo",
    "Hardware",
    "ModelCost",
    "StepLoad",
    "StepTerms",
    "Traffic",
    "engine_perf",
    "estimate",
    "model_cost",
]
