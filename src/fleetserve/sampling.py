"""What sampling an engine's requests get by default, and whether it sorts the vocabulary.

Design note. vLLM samples every sequence of a step after the forward pass, and what that
costs depends on the sampling parameters: greedy requests take an argmax, top-k alone a
partial selection, but **top-p sorts each sequence's whole vocabulary** (vLLM's
``apply_top_k_top_p``; with top-k as well it still sorts everything). On the CPU backend that
sort is most of a decode step's per-sequence cost: Gemma 3's 262,144 logits take ~15 ms a
sequence on one core of this repository's host, against ~3.5 ms for everything else a
greedy sequence costs (``benchmarks/cpu_steps.py``, docs/benchmarks-log.md "What a CPU
decode step's per-sequence cost is"). On a GPU it is a few kernels among hundreds.

Requests that set no sampling parameters - ``fleetserve bench`` and ``vllm bench serve``
send none - get the model's defaults: with ``--generation-config auto`` (vLLM's default)
the generation_config.json's ``temperature``/``top_p``/``top_k``/... (Gemma 3: top_k 64,
top_p 0.95), with ``vllm`` none of them; ``override_generation_config`` then replaces
single keys (``examples/multi-model.yaml``'s ``temperature: 0`` makes a model greedy).
That is what :func:`sorts_vocabulary` decides from, per model: the simulator and the
planner model requests that leave sampling to the server; a replayed bench run whose
requests set sampling parameters (``--extra-body``, recorded in its report) is replayed on
engines serving them (:meth:`fleetserve.perf.EnginePerf.serving`). A ``generation_config``
that names another directory is not read here (its defaults are unknown: taken as none).

Pure, and light: ``fleetserve bench`` records what its requests set with it. The model's
defaults come in :attr:`ModelConfig.sampling`, read with its config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only its ``sampling`` is read; architecture imports this module
    from fleetserve.plan.architecture import ModelConfig

#: vLLM's sampling epsilon: a temperature below it is greedy (vllm/sampling_params.py).
GREEDY_TEMPERATURE = 1e-5

#: The generation_config.json keys vLLM takes as request defaults (``--generation-config
#: auto``; vllm/config/model.py ``get_diff_sampling_param``), less ``max_new_tokens``.
GENERATION_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def sampling_params(raw: Any) -> tuple[tuple[str, float], ...]:
    """The sampling parameters a generation_config.json's dict (or a request body) sets:
    numbers of :data:`GENERATION_KEYS`; anything else is not sampling and is ignored."""
    if not isinstance(raw, dict):
        return ()
    return tuple(
        (key, float(raw[key]))
        for key in GENERATION_KEYS
        if isinstance(raw.get(key), int | float) and not isinstance(raw.get(key), bool)
    )


def default_sampling(config: ModelConfig, engine_args: Mapping[str, object]) -> dict[str, float]:
    """The sampling parameters a request that sets none gets from an engine of ``config``
    started with ``engine_args`` (the module note)."""
    source = engine_args.get("generation_config", "auto")
    params = dict(config.sampling) if source == "auto" else {}
    overrides = engine_args.get("override_generation_config")
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                params[str(key)] = float(value)
    return params


def sorts_vocabulary(params: Mapping[str, float]) -> bool:
    """Whether sampling with ``params`` sorts every sequence's logits: top-p below 1 on a
    request that is not greedy."""
    if params.get("temperature", 1.0) < GREEDY_TEMPERATURE:
        return False
    return params.get("top_p", 1.0) < 1.0


def request_sampling(body: Mapping[str, object]) -> dict[str, float]:
    """The sampling parameters a request body sets (what ``fleetserve bench --extra-body``
    adds to every request, recorded in its report), over the engine's defaults."""
    return dict(sampling_params(dict(body)))
