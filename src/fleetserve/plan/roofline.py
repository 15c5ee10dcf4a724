"""The planner's performance model: :mod:`fleetserve.perf`'s roofline behind the
:class:`~fleetserve.plan.capacity.PerfModel` seam.

Design note. One candidate replica is :func:`fleetserve.perf.engine_perf` of its model on
its card with its HAMi ``gpucores`` share and the calibration given (``fleetserve plan
--calibration``; else the backend's defaults). The share caps the replica's time on the
card (``Hardware.share``), so it scales compute and memory bandwidth alike: a plan packs
cards full and sizes for the busy hour, when each replica gets about its cap. Engines that
share a card also wait on each other's turns (:meth:`EnginePerf.time_sliced`);
:meth:`EngineSteps.beside` is this replica among others, which the planner applies once
it knows the cards (``planner._traffic_report``). A step of ``p`` prefill tokens (one
chunk, no cached prefix) beside ``n`` decodes of mean context ``c`` is the sum of
:meth:`EnginePerf.load` of the chunk and ``n`` decodes as
:meth:`EnginePerf.decode_step_time` counts them (``n`` may be fractional: the steady
state's mean batch).
"""

from __future__ import annotations

import math

from fleetserve.perf import Calibration, EnginePerf, StepLoad, StepTerms, engine_perf
from fleetserve.plan.capacity import ReplicaShape, StepCost


def _rate(value: float) -> str:
    """A peak for a reason: whole units for a card's, three digits for a CPU core's
    (0.4 TFLOP/s, not 0)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


class EngineSteps:
    """:class:`~fleetserve.plan.capacity.StepModel` of one engine (see the module note)."""

    def __init__(self, perf: EnginePerf, others_s: float = 0.0) -> None:
        self.perf = perf
        self.share = perf.hardware.share
        self.others_s = others_s
        """Seconds of other engines' turns per round on its card (0: alone)."""

    @property
    def turn_s(self) -> float:
        return 0.0 if self.perf.hardware.cpu else self.perf.calibration.time_slice_s

    def turn(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        if self.perf.hardware.cpu:
            return 0.0
        load = self.load(prefill_tokens, decode_seqs, context_tokens)
        return self.perf.time_sliced(load.sums, 0.0)[1]

    def beside(self, others_s: float) -> EngineSteps:
        """This replica on a card where other engines hold ``others_s`` seconds of turns a
        round."""
        return EngineSteps(self.perf, others_s)

    def load(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> StepLoad:
        n = max(0.0, decode_seqs)
        c = context_tokens / n if n > 0 else 0.0
        w = self.perf.cost.window
        win = c if w is None else min(c, float(w))
        chunk = round(prefill_tokens)
        pre = self.perf.load(prefills=[(chunk, 0)] if chunk > 0 else [])
        return StepLoad(
            tokens=pre.tokens + round(n),
            seqs=pre.seqs + math.ceil(n),
            sampled=pre.sampled + math.ceil(n),
            pairs=pre.pairs + n * (c + 1),
            window_pairs=pre.window_pairs + n * (win + 1),
            context=pre.context + n * c,
            window_context=pre.window_context + n * win,
        )

    def step(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> StepCost:
        load = self.load(prefill_tokens, decode_seqs, context_tokens)
        terms = self.perf.terms(load)
        if self.others_s <= 0:
            return StepCost(terms.total, self.why(load, terms))
        seconds, _ = self.perf.time_sliced(load.sums, self.others_s)
        waits = max(0.0, seconds - terms.total)
        why = self.why(load, terms)
        if waits > 0:
            why += (
                f" + {waits * 1000:,.1f} ms waiting on the turns of the engines beside it "
                f"({self.others_s * 1000:,.1f} ms a round)"
            )
        return StepCost(max(seconds, terms.total), why)

    def why(self, load: StepLoad, terms: StepTerms) -> str:
        """The step's dominant term in numbers (bytes over bandwidth, FLOPs over peak, or
        the kernels' launches)."""
        perf, cal, hw = self.perf, self.perf.calibration, self.perf.hardware
        pp = perf.cost.pipeline_parallel
        if terms.bound == "memory":
            bandwidth = hw.bandwidth * self.share
            read = terms.memory * bandwidth * cal.bandwidth_efficiency / pp
            weights = perf.cost.weight_read_bytes(load.tokens)
            share = "" if self.share >= 1 else f" ({self.share:.0%} of the card's)"
            main = (
                f"reads {read / 1e9:,.1f} GB, weights {weights / 1e9:,.1f} GB, at "
                f"{_rate(bandwidth / 1e9)} GB/s{share} x {cal.bandwidth_efficiency:.0%} "
                f"efficiency: {terms.memory * 1000:,.1f} ms"
            )
        elif terms.bound == "launch":
            layers = perf.cost.layers * pp
            main = (
                f"{load.tokens:,} tokens, more than the {perf.graph_tokens:,} a CUDA graph "
                f"replays: {layers} layers launched at {cal.layer_launch_s * 1e6:,.0f} us "
                f"each: {terms.launch * 1000:,.1f} ms"
            )
        else:
            peak = hw.peak_flops * self.share
            flops = terms.compute * peak * cal.compute_efficiency / pp
            main = (
                f"{flops / 1e12:,.2f} TFLOP at {_rate(peak / 1e12)} TFLOP/s x "
                f"{cal.compute_efficiency:.0%} efficiency: {terms.compute * 1000:,.1f} ms"
            )
        extra = f" + link {terms.link * 1000:,.1f} ms" if terms.link else ""
        overhead = f"overhead {terms.overhead * 1000:,.1f} ms"
        sort = perf.sort_seconds(load.sampled)
        if sort >= 0.1 * terms.total:  # worth a word: the user can change it (greedy, top-k)
            overhead += (
                f" (of which {sort * 1000:,.1f} ms sorting the vocabulary of "
                f"{load.sampled:,} sequences for top-p sampling)"
            )
        return f"{hw.name}: {main}{extra} + {overhead}"


class Roofline:
    """:class:`~fleetserve.plan.capacity.PerfModel` over :mod:`fleetserve.perf`."""

    def __init__(self, calibration: Calibration | None = None) -> None:
        self.calibration = calibration

    def step_model(self, shape: ReplicaShape) -> EngineSteps:
        m = shape.model
        perf = engine_perf(
            shape.config,
            shape.gpu,
            self.calibration,
            dtype=m.dtype,
            quantization=m.quantization,
            kv_cache_dtype=m.kv_cache_dtype,
            tensor_parallel=m.tensor_parallel,
            pipeline_parallel=m.pipeline_parallel,
            cores_percent=shape.cores_percent,
            engine_args=m.engine_args,
        )
        return EngineSteps(perf)
