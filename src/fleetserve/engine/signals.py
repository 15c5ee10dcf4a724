"""Engine load signals for routing and autoscaling: waiting requests, KV-cache usage,
prefix-cache hits, generated tokens/s.

vLLM computes these in its scheduler and hands them to its stat loggers after every
engine step; :class:`VllmSignals` is such a logger that only keeps the latest values
(no I/O), so reading them from the replica's event loop costs a dict copy. Engines without
it (the fake engine) fall back to :func:`fallback_signals`, derived from the request counts
every engine reports.
"""

from __future__ import annotations

import time
from typing import Any

from fleetserve.engine.protocol import EngineStats

#: Keys of ``EngineStats.extra`` (and of the replicas' routing/autoscaling reports).
WAITING = "waiting"
KV_CACHE_USAGE = "kv_cache_usage"
PREFIX_HITS = "prefix_cache_hits"
PREFIX_QUERIES = "prefix_cache_queries"
TOKENS_PER_S = "generation_tokens_per_s"
KV_CAPACITY_TOKENS = "kv_capacity_tokens"
#: Key of a replica's routing report: its engine died (``EngineStats.alive`` is False).
ENGINE_DOWN = "engine_down"


class SignalsHolder:
    """The latest engine signals (one per engine; written by vLLM's logging loop)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self._tokens = 0
        self._since = time.monotonic()

    def update(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            v = self.values
            v[WAITING] = float(scheduler_stats.num_waiting_reqs)
            v[KV_CACHE_USAGE] = float(scheduler_stats.kv_cache_usage)
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                v[PREFIX_HITS] = v.get(PREFIX_HITS, 0.0) + float(prefix.hits)
                v[PREFIX_QUERIES] = v.get(PREFIX_QUERIES, 0.0) + float(prefix.queries)
        if iteration_stats is not None:
            self._tokens += int(iteration_stats.num_generation_tokens)
        now = time.monotonic()
        if now - self._since >= 1.0:
            self.values[TOKENS_PER_S] = self._tokens / (now - self._since)
            self._tokens, self._since = 0, now


def vllm_signals_logger(holder: SignalsHolder) -> Any:
    """A vLLM per-engine stat-logger factory that feeds ``holder``."""
    from vllm.v1.metrics.loggers import StatLoggerBase  # noqa: PLC0415 - vLLM only

    class VllmSignals(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            cache = vllm_config.cache_config
            if cache.num_gpu_blocks:
                holder.values[KV_CAPACITY_TOKENS] = float(cache.num_gpu_blocks * cache.block_size)

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            holder.update(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return VllmSignals


#: vLLM's Prometheus series each signal is read from, on a ``vllm serve``'s /metrics
#: (the same names in every supported release; counters end in ``_total``).
SERIES = {
    "vllm:num_requests_waiting": WAITING,
    "vllm:kv_cache_usage_perc": KV_CACHE_USAGE,
    "vllm:prefix_cache_hits_total": PREFIX_HITS,
    "vllm:prefix_cache_queries_total": PREFIX_QUERIES,
}
RUNNING_SERIES = "vllm:num_requests_running"
GENERATED_SERIES = "vllm:generation_tokens_total"
CACHE_INFO_SERIES = "vllm:cache_config_info"


def metrics_values(text: str) -> dict[str, float]:
    """The series of :data:`SERIES`, :data:`RUNNING_SERIES` and :data:`GENERATED_SERIES`
    from a ``vllm serve``'s Prometheus text, summed over their label sets (one engine has
    one set per series; a LoRA or a data-parallel rank would add more), and
    :data:`KV_CAPACITY_TOKENS` from :data:`CACHE_INFO_SERIES`'s labels.

    A line scan, not prometheus-client's parser: it runs on the replica's event loop every
    refresh, over a text that is mostly histogram buckets nobody here reads."""
    wanted = (*SERIES, RUNNING_SERIES, GENERATED_SERIES)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, rest = line.partition("{")
        if name == CACHE_INFO_SERIES:
            labels = dict(_labels(rest.rpartition("}")[0]))
            blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
            if blocks.isdigit() and size.isdigit():
                out[KV_CAPACITY_TOKENS] = float(int(blocks) * int(size))
            continue
        if not rest:  # no labels: "name value"
            name, _, rest = line.partition(" ")
            rest = "} " + rest
        if name not in wanted:
            continue
        try:
            value = float(rest.rpartition("}")[2].split()[0])
        except (IndexError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def _labels(text: str) -> list[tuple[str, str]]:
    """``k="v",...`` pairs (vLLM's label values hold no quotes or commas)."""
    pairs = []
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if eq:
            pairs.append((key.strip(), value.strip().strip('"')))
    return pairs


class MetricsSignals:
    """The signals of an engine read from its server's Prometheus text, one scrape at a
    time: what :class:`SignalsHolder` keeps for an engine in this process."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.running = 0
        self._generated: tuple[float, float] | None = None  # (tokens, monotonic time)

    def update(self, text: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        found = metrics_values(text)
        values = {SERIES[k]: v for k, v in found.items() if k in SERIES}
        if KV_CAPACITY_TOKENS in found:
            values[KV_CAPACITY_TOKENS] = found[KV_CAPACITY_TOKENS]
        generated = found.get(GENERATED_SERIES)
        if generated is not None:
            if self._generated is not None and now > self._generated[1]:
                tokens, since = self._generated
                values[TOKENS_PER_S] = max(0.0, generated - tokens) / (now - since)
            self._generated = (generated, now)
        self.running = int(
            found.get(RUNNING_SERIES, 0.0) + found.get("vllm:num_requests_waiting", 0.0)
        )
        self.values = values


def fallback_signals(stats: EngineStats, max_num_seqs: int) -> dict[str, float]:
    """Signals of an engine that reports only request counts: the excess over the batch
    size waits, and batch occupancy stands in for KV-cache usage."""
    busy = max(stats.running, stats.in_flight)
    return {
        WAITING: float(max(0, busy - max_num_seqs)),
        KV_CACHE_USAGE: min(1.0, busy / max(1, max_num_seqs)),
    }


def engine_signals(stats: EngineStats, max_num_seqs: int) -> dict[str, float]:
    """The load signals of one replica: the engine's own, else derived from counts."""
    out = fallback_signals(stats, max_num_seqs)
    out.update(stats.extra)
    return out
