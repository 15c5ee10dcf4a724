"""How long one vLLM engine step takes: a roofline over the model's FLOPs and bytes.

Design note. vLLM runs a model in *steps*: each step pushes every scheduled token through
the model once - the new tokens of the prefills in the batch (whole prompts or chunks of
them) and one token per decoding sequence - and samples one token for every sequence whose
prompt is done. What a step costs follows from the model's architecture facts
(:mod:`fleetserve.plan.architecture`, sized by :mod:`fleetserve.plan.memory`; nothing is
re-derived here) and the card's speed facts (:mod:`fleetserve.plan.gpus`):

* FLOPs: ``2 x active linear parameters`` per scheduled token (MoE: the routed experts a
  token uses), ``2 x vocab x hidden`` per *sampled* sequence (vLLM computes logits only at
  the positions it samples), and attention: ``2 x heads x (head_dim + v_head_dim)`` per
  (query, key) pair per layer, the pairs of a chunk of ``n`` new tokens after ``c`` cached
  ones being ``n c + n (n + 1) / 2`` (causal), capped by the window on sliding-window and
  chunked-local layers.
* bytes read from memory: every weight once per step (the vision tower and an untied input
  embedding table are not read; MoE: the experts the step's tokens touch, in expectation
  ``E (1 - (1 - k/E)^tokens)`` per layer), plus every sequence's cached K/V of every layer
  (windowed layers: at most the window), plus the new tokens' K/V written.
* tensor parallelism: FLOPs and bytes per card divide by the ranks; each layer all-reduces
  its hidden states twice, ``2 (tp-1)/tp x tokens x hidden x dtype`` bytes over the link.
  Pipeline parallelism: a step crosses every stage in turn (no micro-batch overlap), so its
  time is ``pp`` times the fullest stage's.

**The roofline rule.** ``t_step = step_overhead + token_overhead x tokens + seq_overhead x
sequences + max(FLOPs / (peak x compute_efficiency x compute_share), bytes / (bandwidth x
bandwidth_efficiency x bandwidth_share)) + link time``. Compute and memory traffic overlap
inside a step (the kernels stream weights while they multiply), so the slower of the two
bounds the step: prefill-heavy steps are compute-bound, decode steps bandwidth-bound. The
overheads are the step's host work (scheduling, input preparation, sampling, output
processing), which does not overlap the forward pass on either backend. The efficiencies and
overheads are *fitted* per engine (:mod:`fleetserve.perf.calibrate`); the peaks are spec
sheet facts.

**Sampling.** A sampled sequence whose sampling sorts the vocabulary - top-p, which the
model's generation_config.json may make every request's default
(:mod:`fleetserve.sampling`) - adds ``sort_s_per_compare x V log2 V`` of host time
(``Calibration.sort_s_per_compare``; V the vocabulary). It is the CPU backend's largest
per-sequence cost (Gemma 3's 262,144 logits: ~15 ms a sequence on one core), and what
makes a greedy model there several times faster per sequence than the same model with its
defaults; on GPUs its default is 0.

**Kernel launches outside CUDA graphs.** vLLM replays a step of up to
:func:`graph_tokens` tokens as captured CUDA graphs: one launch for the whole model. A
larger step - a prefill of more tokens than that, which at the graph size vLLM picks for a
batch of ``max_num_seqs`` (twice it, at most 512) is every prompt of a few hundred tokens -
runs its compiled kernels launched one by one from Python, a few hundred microseconds of
host time per layer, while the card works through the queue behind it. Such a step takes
the longer of the two: ``max(compute, memory, layer_launch x layers)``. On an H100 this is
what a small model's prefill costs: the c = 1 time to first token of Gemma 3 1B, 4B and 12B
at 512-token prompts (25.5, 30.2, 35.8 ms) grows with their layer count (26, 34, 48; ~0.47
ms a layer), not with their prefill FLOPs (0.7, 3.3, 11.1 TFLOP), which the card could not
do in the 10 ms between the 1B and the 12B at any efficiency. CPU engines have no graphs,
and their cores do the work: the term is 0 there.

**Interference (replicas sharing a card).** A HAMi ``gpucores`` slice of ``c`` % caps the
replica at ``c`` % of the card's time (``Hardware.share``): HAMi-core throttles kernel
launches until the container's measured utilisation - the share of time a kernel of it
runs, memory-bound or not - is back under the cap, so a capped step of ``w`` seconds of
whole-card work lasts ``w / c``, its memory traffic as much as its FLOPs. Without MPS,
engines on one card do not run side by side: the card time-slices between their CUDA
contexts, each holding the whole card for a turn of at most ``T`` (``time_slice_s``) while
it has work queued. So a step of ``w`` seconds of card work (``max(compute, memory)`` on
the whole card) waits, before it starts and after each of its own turns, for one turn of
every other engine stepping on the card - that engine's ``min(T, w_j)`` for its current
step: ``wait = (w / T + 1) x sum_j min(T, w_j)``. The cap and the turns bound the same
card time, so a step takes the longer of ``w / c`` and ``w + wait``, not their sum
(:meth:`EnginePerf.time_sliced`): engines whose caps fill the card and all step get about
their caps either way, and a capped engine alone still gets only its cap. A small
engine's short steps thus wait on a big engine's long ones, while the big engine barely
notices them - what an H100 running four uncapped Gemma 3 sizes at once showed, where an
even split of the card had the small ones 2x too fast. (The runs so far had no HAMi: the
cap's half of this is HAMi-core's documented behaviour, not yet a measurement.) On a CPU
host the engines run on their own pinned cores: compute is not shared, DRAM bandwidth is,
evenly among those stepping (:meth:`Hardware.shares`).

Everything here is pure arithmetic over frozen dataclasses: the simulator calls
:meth:`EnginePerf.step_seconds` (:meth:`EnginePerf.step_time` of a load given as its sums)
once per engine step (or per run of identical decode steps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetserve.perf.calibration import Calibration
from fleetserve.plan.architecture import ModelConfig
from fleetserve.plan.gpus import CPU_HOST, GpuType
from fleetserve.plan.memory import (
    GRAPH_TOKENS_CEILING,
    Dtype,
    KvDtype,
    Quantization,
    cuda_graph_tokens,
    kv_dtype_bytes,
    quant_of,
    resolve_dtype,
    weight_bytes,
    weight_bytes_per_card,
)
from fleetserve.sampling import default_sampling, sorts_vocabulary

# --------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class ModelCost:
    """Per-card FLOPs and bytes of one replica's model, as coefficients of a step's load."""

    name: str
    linear_flops_per_token: float
    """2 x active linear parameters per card (attention projections + MLP/experts)."""
    head_flops_per_sample: float
    """2 x vocab x hidden per card, per sampled sequence (the logits)."""
    attn_flops_per_pair: float
    """Attention FLOPs per (query, key) pair summed over the full-attention layers."""
    attn_flops_per_window_pair: float
    """The same over the windowed (sliding / chunked-local) layers."""
    window: int | None
    """Keys a windowed layer attends to at most (None: no windowed layers)."""
    dense_weight_bytes: float
    """Weights read every step on one card (everything but the routed experts)."""
    expert_bytes: float
    """Bytes of one routed expert of one layer, on one card (0: dense model)."""
    moe_layers: int
    experts: int
    experts_per_token: int
    kv_bytes_per_token: float
    """K/V bytes of one token over the full-attention layers, on one card."""
    kv_window_bytes_per_token: float
    """K/V bytes of one token over the windowed layers, on one card."""
    allreduce_bytes_per_token: float
    """Bytes one card exchanges per token per step under tensor parallelism (0: tp 1)."""
    pipeline_parallel: int = 1
    compute_dtype: str = "bfloat16"
    """The dtype the matmuls run in (``fp8`` for fp8 checkpoints on fp8 cards)."""
    layers: int = 0
    """Decoder layers one card runs (its pipeline stage's share)."""
    vocab_sort_compares: float = 0.0
    """Comparisons of one sequence's vocabulary sort, ``V log2 V``."""
    sampling: tuple[tuple[str, float], ...] = ()
    """What a request that sets no sampling parameters samples with on this engine
    (:func:`fleetserve.sampling.default_sampling`)."""
    sorts: bool = False
    """Whether the engine's requests sort the vocabulary (top-p): its default sampling,
    or what a replayed run's requests set (:meth:`with_request_sampling`)."""

    def with_request_sampling(self, params: Mapping[str, float]) -> ModelCost:
        """The same engine serving requests that set ``params`` (over its defaults)."""
        return dataclasses.replace(self, sorts=sorts_vocabulary({**dict(self.sampling), **params}))

    def weight_read_bytes(self, tokens: int) -> float:
        """Weight bytes a step of ``tokens`` tokens reads (MoE: the experts it touches)."""
        if not self.experts or tokens <= 0:
            return self.dense_weight_bytes
        e, k = self.experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** tokens)
        return self.dense_weight_bytes + self.moe_layers * touched * self.expert_bytes


def model_cost(
    config: ModelConfig,
    *,
    dtype: Dtype = "auto",
    quantization: Quantization = None,
    kv_cache_dtype: KvDtype = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    gpu: GpuType | None = None,
    engine_args: Mapping[str, object] | None = None,
) -> ModelCost:
    """The step-cost coefficients of ``config`` on one card of a replica.

    ``gpu`` decides the compute dtype (an fp8 checkpoint computes in fp8 only on cards with
    fp8 tensor cores; None: the CPU backend, which computes in the activation dtype);
    ``engine_args`` (the model's) whether its default sampling sorts the vocabulary.
    """
    tp, pp = max(1, tensor_parallel), max(1, pipeline_parallel)
    defaults = default_sampling(config, engine_args or {})
    act = resolve_dtype(config, dtype)
    unit = 2 if act in ("bfloat16", "float16", "half") else 4
    h = config.hidden_size
    # Linear FLOPs: active parameters less the parts that are no matmul per token (the
    # embedding lookup, norms, a vision tower); the LM head is counted per sample.
    head = config.vocab_size * h
    active_linear = (
        config.active_params() - config.embedding_params() - config.small_params()
    ) - config.extra_params
    per_layer_attn = 2.0 * config.num_heads * (config.head_dim + config.v_head_dim)
    windowed_layers = config.sliding_layers + config.chunked_layers
    windows = [w for w in (config.sliding_window, config.chunk_size) if w is not None]
    window = min(windows) if windows and windowed_layers else None
    # Bytes: whole-model weights on the fullest card, less what a step never reads.
    per_card = weight_bytes_per_card(
        config, dtype, quantization, tensor_parallel=tp, pipeline_parallel=pp
    )
    unread = config.extra_params * unit
    if not config.tie_word_embeddings:
        unread += head * unit  # the input table is gathered, the untied head is read
    total = weight_bytes(config, dtype, quantization)
    kept = (config.embedding_params() + config.small_params() + config.extra_params) * unit
    linear = config.linear_params()
    bytes_per_linear_param = (total - kept) / linear if linear else float(unit)
    expert = 3.0 * h * config.moe_intermediate_size * bytes_per_linear_param / tp
    stage = 1.0 / pp
    routed = config.moe_layers * config.num_experts * expert * stage
    dense = max(0.0, per_card - unread / (tp * pp) - routed)
    kv_unit = kv_dtype_bytes(config, dtype, kv_cache_dtype)
    kv_layer = config.kv_elements_per_token_layer(tp) * kv_unit
    q = quant_of(config, quantization)
    fp8 = q is not None and q.scheme == "fp8" and gpu is not None and gpu.fp8
    return ModelCost(
        name=config.name,
        linear_flops_per_token=2.0 * active_linear / tp * stage,
        head_flops_per_sample=2.0 * head / tp,
        attn_flops_per_pair=per_layer_attn * config.full_layers / tp * stage,
        attn_flops_per_window_pair=per_layer_attn * windowed_layers / tp * stage,
        window=window,
        dense_weight_bytes=dense,
        expert_bytes=expert,
        moe_layers=math.ceil(config.moe_layers * stage),
        experts=config.num_experts,
        experts_per_token=config.experts_per_token,
        kv_bytes_per_token=kv_layer * config.full_layers * stage,
        kv_window_bytes_per_token=kv_layer * windowed_layers * stage,
        allreduce_bytes_per_token=(
            2.0 * config.num_layers * stage * 2.0 * (tp - 1) / tp * h * unit if tp > 1 else 0.0
        ),
        pipeline_parallel=pp,
        compute_dtype="fp8" if fp8 else act,
        layers=math.ceil(config.num_layers * stage),
        vocab_sort_compares=config.vocab_size * math.log2(max(config.vocab_size, 2)),
        sampling=tuple(defaults.items()),
        sorts=sorts_vocabulary(defaults),
    )


def graph_tokens(
    gpu: GpuType | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    engine_args: Mapping[str, object] | None = None,
) -> int:
    """The most tokens a step may hold and still replay as a CUDA graph: vLLM's default
    (:func:`~fleetserve.plan.memory.cuda_graph_tokens`) unless the engine args set
    ``compilation_config.max_cudagraph_capture_size``; 0 with ``enforce_eager`` (every step
    launched kernel by kernel) and on CPU engines (no graphs; :class:`EnginePerf` adds no
    launch term there)."""
    args = engine_args or {}
    if gpu is None or gpu.vendor == "cpu" or args.get("enforce_eager") is True:
        return 0
    compilation = args.get("compilation_config")
    if isinstance(compilation, Mapping):
        size = compilation.get("max_cudagraph_capture_size")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            return min(size, max_num_batched_tokens)
    return cuda_graph_tokens(
        max_num_seqs, max_num_batched_tokens, blackwell=gpu.compute_capability[0] == 10
    )


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True, slots=True)
class Hardware:
    """What one engine (one card of it) may use: peak FLOP/s, memory and link bandwidth."""

    name: str
    peak_flops: float
    """FLOP/s of the engine's compute dtype on the whole card (on a CPU host: its cores)."""
    bandwidth: float
    """Memory bytes/s of the card (or of the engine's CPU cores) when nobody shares it."""
    link_bandwidth: float
    """Bytes/s to a tensor-parallel peer."""
    cpu: bool = False
    share: float = 1.0
    """The share of the card's time the engine may hold: its HAMi ``gpucores`` cap, which
    throttles kernel launches to that share of the card's busy time - memory-bound kernels
    as much as compute-bound ones (1: no cap; always 1 on a CPU host)."""

    def shares(self, busy: int) -> tuple[float, float]:
        """(bandwidth share, further compute share) of one of ``busy`` engines stepping on
        this CPU host at once: DRAM bandwidth splits evenly, compute is the engine's own
        pinned cores. Engines sharing a *card* take turns on it instead
        (:meth:`EnginePerf.time_sliced`)."""
        if not self.cpu:
            raise ValueError(f"{self.name}: engines on a card take turns (time_sliced)")
        return 1.0 / max(1, busy), 1.0

    @classmethod
    def of(
        cls,
        gpu: GpuType | None,
        *,
        compute_dtype: str = "bfloat16",
        cores_percent: int = 100,
        cpu_cores: float = 1.0,
    ) -> Hardware:
        """A card (``cores_percent``: its HAMi gpucores share) or, ``gpu=None``, a CPU
        engine with ``cpu_cores`` cores of :data:`CPU_HOST`."""
        if gpu is None or gpu.vendor == "cpu":
            host = gpu or CPU_HOST
            cores = max(1.0, cpu_cores)
            return cls(
                name=f"{host.name} x{cores:g}",
                peak_flops=host.peak_flops(compute_dtype) * cores,
                bandwidth=host.bandwidth * cores,
                link_bandwidth=host.link_gbps * 1e9,
                cpu=True,
            )
        if not gpu.tflops or not gpu.bandwidth_gbps:
            from fleetserve.errors import SpecError  # noqa: PLC0415

            raise SpecError(
                f"GPU '{gpu.name}' has no speed facts (peak FLOP/s, memory bandwidth)",
                hint="name a catalogue card in the pool's gpu.type",
            )
        share = min(100, max(1, cores_percent)) / 100
        return cls(
            name=gpu.name if share >= 1 else f"{gpu.name} ({cores_percent}% cores)",
            peak_flops=gpu.peak_flops(compute_dtype),
            bandwidth=gpu.bandwidth,
            link_bandwidth=gpu.link_gbps * 1e9,
            share=share,
        )


# --------------------------------------------------------------------------- one step


@dataclass(frozen=True, slots=True)
class StepLoad:
    """What one step computes, reduced to the sums its cost depends on."""

    tokens: int
    """Scheduled tokens: prefill (chunk) tokens plus one per decoding sequence."""
    seqs: int
    """Sequences in the step."""
    sampled: int
    """Sequences that sample a token (decodes, and prefills whose prompt completes)."""
    pairs: float
    """(query, key) pairs over all sequences, full-attention layers."""
    window_pairs: float
    """(query, key) pairs over all sequences, windowed layers (keys capped at the window)."""
    context: float
    """Cached tokens all sequences read (full-attention layers)."""
    window_context: float
    """Cached tokens all sequences read, each capped at the window (windowed layers)."""

    @property
    def sums(self) -> LoadSums:
        return (
            self.tokens,
            self.seqs,
            self.sampled,
            self.pairs,
            self.window_pairs,
            self.context,
            self.window_context,
        )


#: A step's load as the sums its time depends on, in :class:`StepLoad`'s field order (what
#: the simulator passes :meth:`EnginePerf.step_seconds` instead of building a StepLoad).
LoadSums = tuple[int, int, int, float, float, float, float]


def _pairs(new: int, before: int, cap: int | None) -> float:
    """Causal (query, key) pairs of ``new`` tokens after ``before`` cached, keys <= cap."""
    if cap is None or before + new <= cap:
        return new * before + new * (new + 1) / 2
    if before >= cap:
        return float(new * cap)
    under = cap - before  # queries whose key count is still below the cap
    return under * before + under * (under + 1) / 2 + (new - under) * cap


def _total(compute: float, memory: float, link: float, overhead: float, launch: float) -> float:
    """The roofline rule's sum: compute, memory traffic and the kernels' launches overlap,
    the rest adds."""
    return overhead + max(compute, memory, launch) + link


@dataclass(frozen=True, slots=True)
class StepTerms:
    """One step's time and the terms it is made of (seconds)."""

    compute: float
    memory: float
    link: float
    overhead: float
    launch: float = 0.0
    """Host time launching the layers' kernels one by one (a step outside CUDA graphs)."""

    @property
    def total(self) -> float:
        return _total(self.compute, self.memory, self.link, self.overhead, self.launch)

    @property
    def bound(self) -> str:
        """Which term bounds the step: ``compute``, ``memory`` or ``launch`` (the host)."""
        if self.launch > max(self.compute, self.memory):
            return "launch"
        return "compute" if self.compute >= self.memory else "memory"


class EnginePerf:
    """The step-time model of one engine: a model on a card (slice) with fitted constants.

    ``step_time`` is what the simulator calls; ``estimate`` (:mod:`fleetserve.perf.steady`)
    answers throughput and latency at a load without simulating.
    """

    __slots__ = (
        "_c_compute",
        "_c_memory",
        "_cap",
        "_launch",
        "_sort",
        "calibration",
        "cost",
        "graph_tokens",
        "hardware",
    )

    def __init__(
        self,
        cost: ModelCost,
        hardware: Hardware,
        calibration: Calibration,
        graph_tokens: int = GRAPH_TOKENS_CEILING,
    ) -> None:
        self.cost = cost
        self.hardware = hardware
        self.calibration = calibration
        self.graph_tokens = graph_tokens
        """Steps of more tokens launch their kernels one by one (:func:`graph_tokens`)."""
        # Seconds per FLOP and per byte on the whole card (efficiencies folded in once).
        self._c_compute = 1.0 / max(hardware.peak_flops * calibration.compute_efficiency, 1.0)
        self._c_memory = 1.0 / max(hardware.bandwidth * calibration.bandwidth_efficiency, 1.0)
        self._cap = hardware.share
        # Host seconds a sampled sequence's vocabulary sort takes (0: no sort).
        sort = calibration.sort_s_per_compare * cost.vocab_sort_compares
        self._sort = sort if cost.sorts else 0.0
        # A step's launches cross every pipeline stage in turn, as its work does.
        self._launch = (
            0.0
            if hardware.cpu
            else calibration.layer_launch_s * cost.layers * cost.pipeline_parallel
        )

    def recalibrated(self, calibration: Calibration) -> EnginePerf:
        """The same engine (model, card, graphs) with other constants."""
        return EnginePerf(self.cost, self.hardware, calibration, self.graph_tokens)

    def sort_seconds(self, sampled: int) -> float:
        """Host seconds the vocabulary sorts of ``sampled`` sequences take in a step (0:
        the engine's requests do not sort: :mod:`fleetserve.sampling`)."""
        return self._sort * sampled

    def serving(self, params: Mapping[str, float]) -> EnginePerf:
        """The same engine serving requests that set the sampling ``params``."""
        cost = self.cost.with_request_sampling(params)
        return EnginePerf(cost, self.hardware, self.calibration, self.graph_tokens)

    # ---- building a step's load

    def load(
        self, prefills: Sequence[tuple[int, int]] = (), decodes: Sequence[int] = ()
    ) -> StepLoad:
        """The load of a step with ``prefills`` as (new tokens, cached tokens before, and
        the chunk completes the prompt when new > 0) and ``decodes`` as context lengths.

        Every prefill chunk is taken to finish its prompt (it samples); the simulator builds
        :class:`StepLoad` itself when a chunk does not.
        """
        w = self.cost.window
        tokens = len(decodes)
        pairs = win_pairs = ctx = win_ctx = 0.0
        for new, before in prefills:
            tokens += new
            pairs += _pairs(new, before, None)
            win_pairs += _pairs(new, before, w)
            ctx += before
            win_ctx += before if w is None else min(before, w)
        for c in decodes:
            pairs += c + 1
            win_pairs += c + 1 if w is None else min(c + 1, w)
            ctx += c
            win_ctx += c if w is None else min(c, w)
        seqs = len(prefills) + len(decodes)
        return StepLoad(tokens, seqs, seqs, pairs, win_pairs, ctx, win_ctx)

    # ---- time

    def terms(
        self, load: StepLoad, *, bandwidth_share: float = 1.0, compute_share: float = 1.0
    ) -> StepTerms:
        """The terms of one step's time (see the module note for the rule)."""
        return StepTerms(*self._terms(load.sums, bandwidth_share, compute_share))

    def _terms(
        self, load: LoadSums, bandwidth_share: float, compute_share: float
    ) -> tuple[float, float, float, float, float]:
        """(compute, memory, link, overhead, launch) of a step: the one place the roofline
        rule's terms are computed (:meth:`terms`, :meth:`step_seconds`). The HAMi cap
        (``Hardware.share``) scales compute and memory alike: the engine holds at most that
        share of the card's time, whatever its kernels are bound by."""
        tokens, seqs, sampled, pairs, window_pairs, context, window_context = load
        c = self.cost
        flops = (
            c.linear_flops_per_token * tokens
            + c.head_flops_per_sample * sampled
            + c.attn_flops_per_pair * pairs
            + c.attn_flops_per_window_pair * window_pairs
        )
        data = (
            c.weight_read_bytes(tokens)
            + c.kv_bytes_per_token * (context + tokens)
            + c.kv_window_bytes_per_token * (window_context + tokens)
        )
        pp = c.pipeline_parallel
        cal = self.calibration
        link = (
            c.allreduce_bytes_per_token * tokens / self.hardware.link_bandwidth * pp
            if c.allreduce_bytes_per_token and self.hardware.link_bandwidth
            else 0.0
        )
        cap = self._cap
        return (
            flops * self._c_compute / max(compute_share * cap, 1e-6) * pp,
            data * self._c_memory / max(bandwidth_share * cap, 1e-6) * pp,
            link,
            cal.step_overhead_s
            + cal.token_overhead_s * tokens
            + cal.seq_overhead_s * seqs
            + self._sort * sampled,
            self._launch if tokens > self.graph_tokens else 0.0,
        )

    def step_time(
        self, load: StepLoad, *, bandwidth_share: float = 1.0, compute_share: float = 1.0
    ) -> float:
        """Seconds one step of ``load`` takes (``bandwidth_share``: 1/n with n replicas
        stepping on the card at once; ``compute_share``: a further compute split)."""
        return self.step_seconds(
            load.sums, bandwidth_share=bandwidth_share, compute_share=compute_share
        )

    def step_seconds(
        self, load: LoadSums, *, bandwidth_share: float = 1.0, compute_share: float = 1.0
    ) -> float:
        """:meth:`step_time` of a load given as its sums (the simulator's hot path builds
        no :class:`StepLoad` or :class:`StepTerms` per step; the arithmetic is the same)."""
        return _total(*self._terms(load, bandwidth_share, compute_share))

    def time_sliced(self, load: LoadSums, others: float) -> tuple[float, float]:
        """(seconds, turn) of a step on a card where the other engines stepping there hold
        ``others`` seconds of turns per round (the sum of their turns; 0: alone): the step
        has the whole card while it runs and waits a round before it starts and after each
        of its own turns (the module note). A HAMi cap bounds it too: at most its share of
        the card's time, so the step lasts at least its work over that share; the two are
        bounds on one card's time, so the step takes the longer, not their sum. ``turn`` is
        what this step holds per round, ``min(time_slice_s, card work)``, for the others'
        waits."""
        whole = 1.0 / self._cap  # shares that cancel the cap: the work on the whole card
        compute, memory, link, overhead, launch = self._terms(load, whole, whole)
        work = max(compute, memory)
        turn = self.calibration.time_slice_s
        wait = (work / turn + 1.0) * others if others > 0 else 0.0
        return overhead + max(work / self._cap, work + wait, launch) + link, min(turn, work)

    def decode_load(self, batch: int, context: float) -> LoadSums:
        """The sums of one pure-decode step of ``batch`` sequences of mean context
        ``context``."""
        w = self.cost.window
        win = context if w is None else min(context, float(w))
        return (
            batch,
            batch,
            batch,
            batch * (context + 1),
            batch * (win + 1),
            batch * context,
            batch * win,
        )

    def decode_step_time(
        self,
        batch: int,
        context: float,
        *,
        bandwidth_share: float = 1.0,
        compute_share: float = 1.0,
    ) -> float:
        """One pure-decode step of ``batch`` sequences of mean context ``context``."""
        if batch <= 0:
            return 0.0
        return self.step_seconds(
            self.decode_load(batch, context),
            bandwidth_share=bandwidth_share,
            compute_share=compute_share,
        )


def engine_perf(
    config: ModelConfig,
    gpu: GpuType | None,
    calibration: Calibration | None = None,
    *,
    dtype: Dtype = "auto",
    quantization: Quantization = None,
    kv_cache_dtype: KvDtype = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    cores_percent: int = 100,
    cpu_cores: float = 1.0,
    graph_tokens: int = GRAPH_TOKENS_CEILING,
    engine_args: Mapping[str, object] | None = None,
) -> EnginePerf:
    """The step-time model of one replica of ``config`` on ``gpu`` (None: a CPU engine of
    ``cpu_cores`` cores), with ``calibration``'s constants (None: the defaults for the
    backend, :meth:`Calibration.default`); ``graph_tokens``: the largest step it replays
    as a CUDA graph (:func:`graph_tokens` from its engine settings); ``engine_args``: the
    model's, for its default sampling (:mod:`fleetserve.sampling`)."""
    cost = model_cost(
        config,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        gpu=gpu,
        engine_args=engine_args,
    )
    hardware = Hardware.of(
        gpu, compute_dtype=cost.compute_dtype, cores_percent=cores_percent, cpu_cores=cpu_cores
    )
    cal = calibration or Calibration.default(cpu=hardware.cpu)
    return EnginePerf(cost, hardware, cal, graph_tokens)
