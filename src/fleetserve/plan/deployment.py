"""What every model's Serve deployment runs with: the plan's one resolved answer per model.

Design note. A replica is configured three ways at once - vLLM's memory and batching numbers
(``gpu_memory_utilization``, ``max_model_len``, ``max_num_seqs``, engine args), Ray's
reservation (CPUs, GPUs, the model's custom resource, placement-group bundles) and Serve's
deployment options (replica count or autoscaling, ``max_ongoing_requests``, the request
router, the drain timeout). They used to be written in several places (the planner, the
local serve settings, the app builder, the RayService renderer) that could disagree. This
module is the only writer: it turns a plan's placement into a :class:`ModelDeployment`, and
``serve`` (:mod:`fleetserve.serve.control.app`) and ``render``
(:mod:`fleetserve.k8s.render.serveconfig`) only read it. A RayService carries the resolved
objects in its app args and writes the same options in ``deployments[]`` (where Ray and
``doctor`` read them), so the app that Ray builds from those args runs exactly what the
manifest says.

Two targets, because Ray sees the cards differently:

* a node the replicas share - this host or a joined cluster (:func:`node_deployment`):
  no HAMi, every engine sees whole cards, so vLLM gets the plan's fraction of the whole card
  and Ray reserves the plan's ``num_gpus`` - the replica's slice (engine budget plus margin)
  as a fraction of a card, the sum the packer kept at most 1 per card, so Ray co-locates
  the replicas the plan co-located - except that a fixed-count model whose replicas the
  plan gave a card each reserves the whole card (:func:`_own_card_models`: Ray would
  otherwise fill one card with them); whole cards for tensor/pipeline parallelism;
* a pod per replica - KubeRay (:func:`pod_deployment`): the pod holds the replica's cards
  (one vGPU for a HAMi slice), so Ray reserves them whole (or one ``{GPU: 1}`` bundle per
  rank), pinned to the model's worker group by its custom resource; inside a HAMi slice vLLM
  sees the slice as the card, so it gets the plan's fraction of the slice.

A model planned from its ``traffic`` has no replica count, tensor-parallel size or
``max_num_seqs`` the user gave: the plan chooses them (``PlanResult.traffic[]``).
:func:`planned_spec` is the spec with those choices written in - the replica count fixed
at the count placed (``replicas.min = replicas.max``: that many serve the rate within the
SLOs; autoscaling past them would need cards the plan did not reserve) - and every writer
here reads it, so ``render`` and ``serve`` deploy exactly what ``plan`` printed and the
spec a RayService's app receives says the same.

Pure and Ray-free: rendering must not need Ray.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve.engine.config import Frontend
from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import CapacityError, RenderError
from fleetserve.plan.result import PlanResult, ReplicaPlacement
from fleetserve.spec import FleetSpec, ModelSpec, admitting
from fleetserve.units import gib_to_bytes

#: The Serve application's name (``fleetserve serve`` and the RayService's serveConfigV2).
APP_NAME = "fleetserve"
#: The ingress deployment's name.
INGRESS_DEPLOYMENT = "ingress"
#: Import path of fleetserve's Serve application builder (a Serve config's ``import_path``).
APP_IMPORT_PATH = "fleetserve.serve.control.app:build_app"
#: Where releases before serve/ was split by concern had it: manifests they rendered (and
#: images they built) still name it, and ``doctor`` must still recognise fleetserve's app.
FORMER_APP_IMPORT_PATHS = ("fleetserve.serve.app:build_app",)
#: Import path of fleetserve's request router (``serve.routing.router.FleetRouter``).
ROUTER_CLASS = "fleetserve.serve.routing.router:FleetRouter"
#: Import path of fleetserve's autoscaling policy (``serve.autoscaling``).
POLICY_CLASS = "fleetserve.serve.control.autoscaling:LLMAutoscalingPolicy"
#: Logical CPUs reserved by the (single) ingress replica: enough to be counted, small
#: enough never to be the reason a fleet does not fit (pitfall ``ingress-starved``).
INGRESS_CPUS = 0.1
#: Ingress requests at once beyond the models' own bounds; it only relays, so the models'
#: limits are what bind.
INGRESS_MIN_ONGOING = 1000
#: Serve's own request timeout is ours plus this, so ours (with its error event) fires first.
SERVE_TIMEOUT_MARGIN_S = 15.0


def serve_request_timeout_s(request_timeout_s: float) -> float:
    """Serve's ``http_options.request_timeout_s``: a backstop behind our own deadline."""
    return request_timeout_s + SERVE_TIMEOUT_MARGIN_S


def is_fleetserve_app(import_path: str) -> bool:
    """Whether a Serve config's ``import_path`` names fleetserve's application builder."""
    module = import_path.partition(":")[0]
    return module in {p.partition(":")[0] for p in (APP_IMPORT_PATH, *FORMER_APP_IMPORT_PATHS)}


def deployment_name(model: str) -> str:
    """The Serve deployment name of ``model``'s replicas."""
    return "model-" + re.sub(r"[^A-Za-z0-9_.-]", "-", model)


def _number(value: float) -> float | int:
    """JSON-stable numbers: 1 rather than 1.0 (the manifests are compared byte for byte)."""
    return int(value) if float(value).is_integer() else value


def replica_count_options(model: ModelSpec, max_replicas: int | None = None) -> dict[str, Any]:
    """``num_replicas`` when the count is fixed, else ``autoscaling_config`` (never both:
    Serve rejects them together). ``max_replicas`` caps ``replicas.max`` (a cluster with
    fewer worker pods)."""
    r = model.replicas
    high = r.max if max_replicas is None else min(r.max, max_replicas)
    if r.min == high:
        return {"num_replicas": high}
    return {
        "autoscaling_config": {
            "min_replicas": r.min,
            "max_replicas": high,
            "initial_replicas": max(r.min, 1),
            "target_ongoing_requests": _number(r.target_ongoing_requests),
            "upscale_delay_s": _number(r.upscale_delay_s),
            "downscale_delay_s": _number(r.downscale_delay_s),
            "look_back_period_s": _number(r.look_back_period_s),
            "policy": {
                "policy_function": POLICY_CLASS,
                "policy_kwargs": {
                    "target_ongoing_requests": _number(r.target_ongoing_requests),
                    "target_kv_cache_usage": _number(r.target_kv_cache_usage),
                    "target_waiting_requests": _number(r.target_waiting_requests),
                },
            },
        }
    }


def request_router_options(model: ModelSpec) -> dict[str, Any]:
    """``request_router_config``: fleetserve's router with the model's routing knobs."""
    routing = model.routing
    return {
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_router_kwargs": {
                "policy": routing.policy,
                "block_chars": routing.block_chars,
                "load_factor": None
                if routing.load_factor is None
                else _number(routing.load_factor),
                "load_weight": _number(routing.load_weight),
                "adapter_weight": _number(routing.adapter_weight),
                # Which request ``model`` is the base (others are adapters) and how many
                # adapters a replica keeps loaded (vLLM's CPU LoRA cache, LRU).
                "model": model.name,
                "adapter_slots": model.max_cpu_loras or model.max_loras,
            },
            "request_routing_stats_period_s": _number(routing.stats_period_s),
        }
    }


def serve_options(
    spec: FleetSpec, model: ModelSpec, max_replicas: int | None = None
) -> dict[str, Any]:
    """Serve's options of ``model``'s deployment (all but Ray's reservation)."""
    r = model.replicas
    return {
        "name": deployment_name(model.name),
        "max_ongoing_requests": r.max_ongoing_requests,
        # The gateway's exact admission (serve/guard/admission.py) is the binding limit;
        # Serve's own queue bound is a backstop above it, so its router's stale view of
        # replica load can never refuse a request the gateway admitted.
        "max_queued_requests": r.max * r.max_ongoing_requests + r.max_queued_requests,
        **replica_count_options(model, max_replicas),
        **request_router_options(model),
        "graceful_shutdown_timeout_s": _number(spec.server.drain_timeout_s),
    }


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RayOptions(_Frozen):
    """What Ray schedules for one replica: its actor's reservation and placement group."""

    num_cpus: float = Field(ge=0, description="Logical CPUs of the replica actor.")
    num_gpus: float = Field(default=0.0, ge=0, description="GPUs of the replica actor.")
    memory_bytes: int | None = Field(default=None, ge=0, description="Ray memory reservation.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom resources (the model's worker-group pin)."
    )
    placement_group_bundles: list[dict[str, float]] | None = Field(
        default=None, description="One bundle per rank when the replica spans several cards."
    )
    placement_group_strategy: Literal["PACK", "STRICT_PACK"] | None = None

    def ray_actor_options(self) -> dict[str, Any]:
        """As Ray Serve's ``ray_actor_options``."""
        options: dict[str, Any] = {"num_cpus": _number(self.num_cpus)}
        if self.num_gpus or self.placement_group_bundles:
            # Stated as 0 beside bundles: the actor holds none, the bundles hold the cards.
            options["num_gpus"] = _number(self.num_gpus)
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        if self.resources:
            options["resources"] = {k: _number(v) for k, v in self.resources.items()}
        return options

    def options(self) -> dict[str, Any]:
        """The deployment options Ray schedules by."""
        out: dict[str, Any] = {"ray_actor_options": self.ray_actor_options()}
        if self.placement_group_bundles:
            out["placement_group_bundles"] = [
                {k: _number(v) for k, v in b.items()} for b in self.placement_group_bundles
            ]
            out["placement_group_strategy"] = self.placement_group_strategy
        return out


class ModelDeployment(_Frozen):
    """One model's Serve deployment: what its vLLM, Ray and Serve are given."""

    engine: EngineSettings = Field(description="vLLM's memory and batching numbers.")
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        description="vLLM tensor_parallel_size as planned (None: the spec's; manifests "
        "rendered before the plan chose it).",
    )
    pipeline_parallel: int | None = Field(
        default=None, ge=1, description="vLLM pipeline_parallel_size as planned (None: the spec's)."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra vLLM arguments (the spec's, resolved)."
    )
    frontend: Frontend = Field(
        default="replica",
        description="Where vLLM's OpenAI layer runs (the spec's frontend, `auto` resolved: "
        ":func:`planned_frontend`).",
    )
    ray: RayOptions
    serve: dict[str, Any] = Field(description="Serve's deployment options (see serve_options).")

    def options(self) -> dict[str, Any]:
        """Every deployment option, as ``Deployment.options`` and ``deployments[]`` take them."""
        return {**self.serve, **self.ray.options()}


class FleetDeployment(_Frozen):
    """Every deployment of the fleet's Serve application."""

    models: dict[str, ModelDeployment]
    ingress: RayOptions = RayOptions(num_cpus=INGRESS_CPUS)

    def engine_settings(self) -> dict[str, EngineSettings]:
        return {name: m.engine for name, m in self.models.items()}

    def ingress_options(self, spec: FleetSpec) -> dict[str, Any]:
        """The ingress deployment's options: it holds every model's requests at once -
        each model's own bound (its ``max_queued_requests``, from the planned replica
        count: :func:`serve_options`) and a margin."""
        ongoing = INGRESS_MIN_ONGOING
        for model in self.models.values():
            ongoing += int(model.serve["max_queued_requests"])
        return {
            "name": INGRESS_DEPLOYMENT,
            "max_ongoing_requests": ongoing,
            "graceful_shutdown_timeout_s": _number(spec.server.drain_timeout_s),
            **self.ingress.options(),
        }


def _memory_bytes(model: ModelSpec) -> int | None:
    gb = model.resources.memory_gb
    return None if gb is None else gib_to_bytes(gb)


def planned_model(model: ModelSpec, plan: PlanResult) -> ModelSpec:
    """``model`` as ``plan`` resolved it: for a model planned from its traffic, the
    option chosen (tensor_parallel, max_num_seqs) and the replica count placed, fixed
    (module note); any other model as it is."""
    chosen = next((t for t in plan.traffic if t.model == model.name), None)
    if chosen is None or chosen.replicas == 0:
        return model  # not traffic-planned, or nothing placed (the plan says why)
    count = chosen.replicas
    return model.model_copy(
        update={
            "tensor_parallel": chosen.tensor_parallel,
            "max_num_seqs": chosen.max_num_seqs,
            # the admission default follows the batch chosen (spec.admitting)
            "replicas": admitting(
                model.replicas.model_copy(update={"min": count, "max": count}),
                chosen.max_num_seqs,
            ),
        }
    )


def planned_spec(spec: FleetSpec, plan: PlanResult) -> FleetSpec:
    """``spec`` with every model as ``plan`` resolved it (:func:`planned_model`): what
    ``render`` and ``serve`` deploy. The identity for a plan without ``traffic[]``."""
    if not plan.traffic:
        return spec
    return spec.model_copy(update={"models": [planned_model(m, plan) for m in spec.models]})


def node_deployment(spec: FleetSpec, plan: PlanResult) -> FleetDeployment:
    """The deployments of a plan whose replicas share a node's cards (this host, a joined
    cluster): the plan's engine settings and Ray ``num_gpus`` as they are, and the plan's
    choices for a traffic-planned model (:func:`planned_spec`).

    One Serve deployment per model: every replica starts with its first replica's numbers.
    Raises :class:`CapacityError` with the planner's reasons when a replica is unplaced.
    """
    spec = planned_spec(spec, plan)
    if not plan.feasible or plan.unplaced:
        reasons = "; ".join(f"{u.model} (replica {u.index}): {u.reason}" for u in plan.unplaced)
        raise CapacityError(f"the fleet does not fit this machine: {reasons or 'infeasible'}")
    first: dict[str, ReplicaPlacement] = {}
    for replica in sorted(plan.replicas, key=lambda r: r.index):
        first.setdefault(replica.model, replica)
    missing = [m.name for m in spec.models if m.name not in first]
    if missing:
        raise CapacityError(f"the plan placed no replica of {', '.join(missing)}")
    own_cards = _own_card_models(spec, plan)
    return FleetDeployment(
        models={
            m.name: ModelDeployment(
                engine=first[m.name].engine,
                tensor_parallel=first[m.name].tensor_parallel,
                pipeline_parallel=first[m.name].pipeline_parallel,
                engine_args=dict(m.engine_args),
                frontend=_node_frontend(m, first[m.name], own_card=m.name in own_cards),
                ray=RayOptions(
                    num_cpus=m.resources.cpu,
                    num_gpus=1.0 if m.name in own_cards else first[m.name].num_gpus,
                    memory_bytes=_memory_bytes(m),
                ),
                serve=serve_options(spec, m),
            )
            for m in spec.models
        }
    )


def planned_frontend(model: ModelSpec, *, cards: int, card_to_itself: bool) -> Frontend:
    """Where ``model``'s OpenAI layer runs: the spec's ``frontend``, ``auto`` resolved.

    Design note. ``auto`` means ``process`` - a ``vllm serve`` beside the replica - where it
    was measured to help and is allowed: a replica with one GPU to itself (a single card the
    plan gave it alone; a pod of one whole card, not a HAMi slice) and no LoRA adapters
    (``adapter_dir``'s, found on first use, need the replica's own resolver; listed ones
    are allowed in ``process`` but were never run through it on a card). Measured on one GPU
    (docs/benchmarks.md, GPU section): both frontends kept ``vllm serve``'s throughput
    (0.995-1.003 on the 12B), but under a wave of 64 requests the in-replica frontend's
    event loop took them in one by one and TTFT p50 rose 47-66 ms, where the process
    frontend's stayed at most 11 ms above ``vllm serve``'s (12B and 270M). Everywhere else
    ``replica``: a CPU host (the 2-core hosts' engine and server would share the same cores,
    unmeasured), a replica over several cards (its server would run one), a card shared
    with other replicas (not measured with a server each). ``cards``: the replica's GPUs
    (0 on a CPU).
    """
    if model.frontend != "auto":
        return model.frontend
    if cards == 1 and card_to_itself and model.adapter_dir is None and not model.adapters:
        return "process"
    return "replica"


def _node_frontend(model: ModelSpec, replica: ReplicaPlacement, *, own_card: bool) -> Frontend:
    """:func:`planned_frontend` of a replica on a shared node: its cards are those it was
    placed on (none on a CPU host or an unsized cluster), and it has one to itself when Ray
    reserves it whole (:func:`_own_card_models`, or a whole-card placement)."""
    cards = replica.tensor_parallel * replica.pipeline_parallel if replica.gpus else 0
    whole = own_card or (replica.whole_cards and len(replica.gpus) == 1)
    return planned_frontend(model, cards=cards, card_to_itself=whole)


def _own_card_models(spec: FleetSpec, plan: PlanResult) -> set[str]:
    """Models whose replicas Ray must give a card each: a fixed replica count (no
    autoscaling), every replica on one card, and no other replica planned on that card.

    Why. Ray reserves a slice as a fraction of *some* card of the node: it knows nothing of
    the card the plan chose, and fills a card before it takes the next, so two replicas of
    0.37 each land on one card whatever the plan said. For replicas that share a card in the
    plan that is the same packing; for ones the plan put on cards of their own (``policy.gpu:
    spread``, or a card too full for a neighbour) it is not - two replicas "one per card"
    would share card 0 and leave card 1 idle. Reserving their whole card makes Ray's packing
    the plan's: nothing else was planned there, and vLLM still gets the plan's fraction of
    it. Autoscaled models keep their fraction: Ray places the replicas the plan did not
    count in what their cards have left, which a whole-card reservation would take.
    """
    holders = Counter((r.pool, r.node, g) for r in plan.replicas for g in r.gpus)
    own = set()
    for m in spec.models:
        replicas = [r for r in plan.replicas if r.model == m.name]
        if (
            m.replicas.min == m.replicas.max
            and replicas
            and all(
                len(r.gpus) == 1
                and r.num_gpus < 1
                and len(r.spans) == 1
                and holders[(r.pool, r.node, r.gpus[0])] == 1
                for r in replicas
            )
        ):
            own.add(m.name)
    return own


@dataclass(frozen=True)
class PodTarget:
    """How a model's replicas run on KubeRay: one pod per replica (or per node of it)."""

    gpus: int
    """Cards of one pod (one vGPU for a HAMi slice; 0 on a CPU pool)."""
    pods_per_replica: int
    """> 1 when the replica's pipeline stages cross nodes (one pod per node)."""
    ray_resource: str
    """The model's custom resource: pins its replicas to its worker group."""
    max_replicas: int
    """Replicas its worker groups hold (Serve must not ask for more)."""
    hami_slice: bool
    """The pod is a HAMi slice, under HAMi-core's CUDA hook."""


def pod_deployment(
    spec: FleetSpec, index: int, engine: EngineSettings, pod: PodTarget
) -> ModelDeployment:
    """The deployment of ``spec.models[index]`` whose replicas each get pods of ``pod``;
    ``spec`` as the plan resolved it (:func:`planned_spec`).

    vLLM: inside a HAMi slice HAMi-core reports the slice as the card's total memory, so
    ``gpu_memory_utilization`` is the plan's fraction of the slice; elsewhere the plan's
    whole-card fraction. Ray: ``num_gpus`` = the pod's cards for one card; for tensor or
    pipeline parallelism one ``{GPU: 1}`` bundle per rank (vLLM's Ray executor starts a
    worker per bundle and refuses bigger ones; the replica actor itself holds none, so
    tensor_parallel x pipeline_parallel = GPUs by construction) - STRICT_PACK within a
    pod, PACK over the pods of a replica whose stages cross nodes, with every bundle taking
    one unit of the model's resource so bundles land only on its pods, and vLLM told to use
    its Ray executor (its multiprocessing one keeps all ranks on one node).
    """
    model = spec.models[index]
    if pod.hami_slice and engine.slice_memory_utilization is not None:
        engine = engine.model_copy(
            update={"gpu_memory_utilization": engine.slice_memory_utilization}
        )
    engine_args = dict(model.engine_args)
    cpu = model.resources.cpu
    pin = {pod.ray_resource: 1.0}
    ray: RayOptions
    if pod.pods_per_replica > 1:
        backend = engine_args.get("distributed_executor_backend", "ray")
        if backend != "ray":
            raise RenderError(
                f"models[{index}].engine_args.distributed_executor_backend of '{model.name}' "
                f"is {backend!r}, but its replica spans {pod.pods_per_replica} pods (pipeline "
                "stages across nodes): only vLLM's Ray executor runs ranks on other nodes",
                hint="remove it (render sets 'ray') or set it to 'ray'",
            )
        engine_args["distributed_executor_backend"] = "ray"
        # The replica actor (vLLM's driver, which must share a node with a bundle) sits in
        # bundle 0; PACK (Ray Serve LLM's default) fills one pod before the next.
        total = pod.gpus * pod.pods_per_replica
        ranks = [{"CPU": cpu, "GPU": 1.0, **pin}] + [{"GPU": 1.0, **pin}] * (total - 1)
        ray = RayOptions(
            num_cpus=cpu,
            resources=pin,
            placement_group_bundles=ranks,
            placement_group_strategy="PACK",
        )
    elif pod.gpus > 1:
        bundles = [{"CPU": cpu, "GPU": 1.0, **pin}] + [{"GPU": 1.0}] * (pod.gpus - 1)
        ray = RayOptions(
            num_cpus=cpu,
            resources=pin,
            placement_group_bundles=bundles,
            placement_group_strategy="STRICT_PACK",
        )
    else:
        ray = RayOptions(num_cpus=cpu, num_gpus=float(pod.gpus), resources=pin)
    return ModelDeployment(
        engine=engine,
        tensor_parallel=model.tensor_parallel,
        pipeline_parallel=model.pipeline_parallel,
        engine_args=engine_args,
        frontend=planned_frontend(
            model,
            cards=pod.gpus * pod.pods_per_replica,
            card_to_itself=pod.gpus == 1 and pod.pods_per_replica == 1 and not pod.hami_slice,
        ),
        ray=ray,
        serve=serve_options(spec, model, pod.max_replicas),
    )


__all__ = [
    "APP_IMPORT_PATH",
    "APP_NAME",
    "FORMER_APP_IMPORT_PATHS",
    "INGRESS_CPUS",
    "INGRESS_DEPLOYMENT",
    "POLICY_CLASS",
    "ROUTER_CLASS",
    "FleetDeployment",
    "ModelDeployment",
    "PodTarget",
    "RayOptions",
    "deployment_name",
    "is_fleetserve_app",
    "node_deployment",
    "planned_frontend",
    "planned_model",
    "planned_spec",
    "pod_deployment",
    "replica_count_options",
    "request_router_options",
    "serve_options",
    "serve_request_timeout_s",
]
