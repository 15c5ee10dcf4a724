"""Rules: Ray Serve and vLLM configuration inside RayServices (pitfalls.md, "Serve and vLLM").

Each rule reads the Serve replicas of a RayService through :mod:`._engines` (one view of
what vLLM runs with and what Ray gives it) and the worker groups through ``ray_objects``;
memory rules add the card behind a pod (:mod:`._devices`) and the model's facts
(:mod:`._models`). A rule stays silent when a number it needs is not written in the input:
the app's code may set it, and a guess would be a false positive.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

import yaml
from packaging.version import Version

from fleetserve.k8s.doctor.finding import Finding, Located, Severity
from fleetserve.k8s.doctor.inventory import Inventory, Manifest, get_path
from fleetserve.k8s.doctor.ray_objects import (
    RAY_KINDS,
    GroupView,
    cluster_spec,
    fmt_num,
    groups,
    serve_apps,
    serve_config,
    worker_groups,
)
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._devices import (
    CardMemory,
    HamiConfig,
    PodView,
    card_memory,
    card_of_type,
    container_slice,
    hami_config,
    lws_worker,
    pods,
    server_engines,
)
from fleetserve.k8s.doctor.rules._engines import (
    EngineReplica,
    OperatorEngine,
    can_host,
    engine_replicas,
    http_port,
    kubeai_engines,
    production_stack_engines,
)
from fleetserve.k8s.doctor.rules._models import gib, replica_need
from fleetserve.k8s.doctor.rules._versions import (
    KUBERAY_PROBES_SERVE_PORT_FROM,
    SERVE_DEFAULT_MAX_ONGOING,
    SERVE_DEFAULT_TARGET_ONGOING,
    SERVE_DEFAULTS_5_FROM,
    SERVE_NEW_NAMES_FROM,
    SERVE_OLD_NAMES_DROPPED_FROM,
    SERVE_PRE_2_32_MAX_ONGOING,
    KnownVersion,
    kuberay_version,
    normalise,
    ray_version,
    ray_version_of_image,
    vllm_version,
)

__all__ = ["ray_version_of_image"]  # re-exported: tests and callers read it from here

#: vLLM's V1 engine (chunked prefill always on) is the default from 0.8.0; V0 enabled chunked
#: prefill by itself only for contexts above 32k tokens.
VLLM_V1_DEFAULT_FROM = Version("0.8")
VLLM_V0_AUTO_CHUNKED_ABOVE = 32 * 1024
#: Ray Serve's defaults before 2.10 (ray/serve/_private/constants.py and config.py, 2.9.3).
SERVE_PRE_2_10_MAX_CONCURRENT = 100
SERVE_PRE_2_10_TARGET = 1.0
#: vLLM's default gpu_memory_utilization (vllm/config/cache.py, vLLM 0.32).
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92


def _replicas(inv: Inventory) -> Iterator[EngineReplica]:
    for m in inv.of_kind("RayService"):
        yield from engine_replicas(m)


# --------------------------------------------------------------------------- deprecated


def _deployment_dicts(inv: Inventory) -> Iterator[tuple[Manifest, str, str, dict[str, Any]]]:
    """(manifest, name, path, options) of every deployment options dict written."""
    for r in _replicas(inv):
        if r.options:
            yield r.manifest, r.name, r.options_path, r.options


@rule("deprecated-serve-field", versions={"ray": "all"})
def deprecated_serve_field(inv: Inventory) -> Iterator[Finding]:
    """Serve fields renamed in Ray 2.10 and dropped in 2.33, read against the Ray version the
    manifest runs, and num_replicas with autoscaling (rejected on every version)."""
    for m, name, path, opts in _deployment_dicts(inv):
        auto = opts.get("autoscaling_config")
        auto = auto if isinstance(auto, dict) else None
        v = ray_version(m)
        if v is not None and not v.at_least(SERVE_NEW_NAMES_FROM):
            yield from _new_names_too_early(m, name, path, opts, auto=auto, v=v)
        else:
            yield from _old_names(m, name, path, opts, auto=auto, v=v)
        num = opts.get("num_replicas")
        if isinstance(num, int) and not isinstance(num, bool) and auto is not None:
            yield Finding.at(
                "deprecated-serve-field",
                "error",
                m,
                f"{path}.num_replicas",
                f"Serve deployment {name!r} sets num_replicas: {num} together with "
                'autoscaling_config: Serve rejects the application ("Manually setting '
                'num_replicas is not allowed when autoscaling_config is provided").',
                "Remove num_replicas (or write num_replicas: auto); set "
                "autoscaling_config.min_replicas/initial_replicas instead.",
            )


def _old_names(
    m: Manifest,
    name: str,
    path: str,
    opts: dict[str, Any],
    *,
    auto: dict[str, Any] | None,
    v: KnownVersion | None,
) -> Iterator[Finding]:
    """The pre-2.10 names on Ray >= 2.10 (or an unknown Ray): deprecated, or dropped >= 2.33."""
    dropped = v is not None and v.at_least(SERVE_OLD_NAMES_DROPPED_FROM)
    severity: Severity = "error" if dropped else "warning"
    if "max_concurrent_queries" in opts:
        meant = opts["max_concurrent_queries"]
        has_new = "max_ongoing_requests" in opts
        real = opts.get("max_ongoing_requests", SERVE_DEFAULT_MAX_ONGOING)
        then = f"max_ongoing_requests = {real}" + ("" if has_new else " (Ray's default)")
        yield Finding.at(
            "deprecated-serve-field",
            severity,
            m,
            f"{path}.max_concurrent_queries",
            f"Serve deployment {name!r} sets max_concurrent_queries: {meant}, "
            + _old_name_effect(v, dropped, has_new, f"each replica takes {then}, not {meant}"),
            f"Rename it to max_ongoing_requests: {meant}.",
        )
    for where, table in (("", opts), (".autoscaling_config", auto or {})):
        if "target_num_ongoing_requests_per_replica" not in table:
            continue
        meant = table["target_num_ongoing_requests_per_replica"]
        has_new = "target_ongoing_requests" in (auto or {}) or "target_ongoing_requests" in opts
        real = (auto or {}).get(
            "target_ongoing_requests",
            opts.get("target_ongoing_requests", SERVE_DEFAULT_TARGET_ONGOING),
        )
        real_f = _float_or(real, SERVE_DEFAULT_TARGET_ONGOING)
        meant_f = _float_or(meant, real_f)
        effect = (
            f"the autoscaler targets {fmt_num(real_f)} ongoing requests per replica"
            + ("" if has_new else " (Ray's default)")
            + f", not {meant}: it scales up "
            + ("earlier" if real_f < meant_f else "later")
            + " than intended"
        )
        yield Finding.at(
            "deprecated-serve-field",
            severity,
            m,
            f"{path}{where}.target_num_ongoing_requests_per_replica",
            f"Serve deployment {name!r} sets target_num_ongoing_requests_per_replica: "
            f"{meant}, " + _old_name_effect(v, dropped, has_new, effect),
            f"Rename it to autoscaling_config.target_ongoing_requests: {meant}.",
        )


def _old_name_effect(v: KnownVersion | None, dropped: bool, has_new: bool, effect: str) -> str:
    """What the old name does on ``v``: dropped (>= 2.33), deprecated, or unknown."""
    if dropped:
        assert v is not None
        return (
            f"a field Ray Serve removed in 2.33: {v.describe()} accepts the config without "
            f"a word and drops it, so {effect}."
        )
    if v is not None:
        return (
            f"a name deprecated since Ray 2.10 that {v.describe()} still honours"
            + (" (the new name, also set, wins)" if has_new else "")
            + f"; Ray 2.33 and later drop it without a word, and then {effect}."
        )
    return (
        "a name Ray Serve deprecated in 2.10 and removed in 2.33 (the manifest names no Ray "
        f"version): from Ray 2.33 on it is dropped without a word and {effect}; "
        "Ray 2.10-2.32 still honour it."
    )


def _new_names_too_early(
    m: Manifest,
    name: str,
    path: str,
    opts: dict[str, Any],
    *,
    auto: dict[str, Any] | None,
    v: KnownVersion,
) -> Iterator[Finding]:
    """Ray < 2.10 knows only the old names: the new ones are ignored without an error."""
    if "max_ongoing_requests" in opts:
        value = opts["max_ongoing_requests"]
        real = opts.get("max_concurrent_queries", SERVE_PRE_2_10_MAX_CONCURRENT)
        yield Finding.at(
            "deprecated-serve-field",
            "error",
            m,
            f"{path}.max_ongoing_requests",
            f"Serve deployment {name!r} sets max_ongoing_requests: {value}, a name Ray Serve "
            f"added in 2.10; {v.describe()} does not know it and ignores it without a word, "
            f"so each replica takes max_concurrent_queries = {real}"
            + ("" if "max_concurrent_queries" in opts else " (its default)")
            + f", not {value}.",
            f"On Ray {v.version} write max_concurrent_queries: {value} (or upgrade Ray to "
            "2.10+ together with the image).",
        )
    for where, table in (("", opts), (".autoscaling_config", auto or {})):
        if "target_ongoing_requests" not in table:
            continue
        value = table["target_ongoing_requests"]
        yield Finding.at(
            "deprecated-serve-field",
            "error",
            m,
            f"{path}{where}.target_ongoing_requests",
            f"Serve deployment {name!r} sets target_ongoing_requests: {value}, a name Ray "
            f"Serve added in 2.10; {v.describe()} does not know it and ignores it without a "
            "word, so the autoscaler keeps target_num_ongoing_requests_per_replica"
            + (
                f" = {(auto or {}).get('target_num_ongoing_requests_per_replica')}"
                if "target_num_ongoing_requests_per_replica" in (auto or {})
                else f" = {fmt_num(SERVE_PRE_2_10_TARGET)} (its default)"
            )
            + ".",
            f"On Ray {v.version} write autoscaling_config.target_num_ongoing_requests_per_"
            f"replica: {value} (or upgrade Ray to 2.10+ together with the image).",
        )


def _float_or(x: Any, default: float) -> float:
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    return default


# --------------------------------------------------------------------------- unreadable config


def _serve_config_problem(raw: str) -> tuple[str, int | None] | None:
    """Why Serve cannot read ``serveConfigV2`` (and the 0-based line inside it), or None."""
    try:
        parsed = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} of the block" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        return f"is not valid YAML ({what}{where})", (mark.line if mark is not None else None)
    if parsed is None:
        return "is empty", None
    if not isinstance(parsed, dict):
        return f"is a YAML {type(parsed).__name__}, not a mapping", None
    apps = parsed.get("applications")
    if apps is None:
        return (
            "has no `applications` list (KubeRay deploys the multi-application format: "
            "applications: [{name, import_path, ...}])",
            None,
        )
    if not isinstance(apps, list) or not apps:
        return "has `applications` that is not a non-empty list", None
    for i, app in enumerate(apps):
        if not isinstance(app, dict):
            return f"has applications[{i}] that is not a mapping", None
        if not app.get("import_path"):
            return f"has applications[{i}] without an import_path", None
    return None


@rule("serve-config-invalid", versions={"ray": "all", "kuberay": "all"})
def serve_config_invalid(inv: Inventory) -> Iterator[Finding]:
    """A RayService whose serveConfigV2 Serve cannot read: the app is never deployed."""
    for m in inv.of_kind("RayService"):
        raw = m.get("spec.serveConfigV2")
        if not isinstance(raw, str):
            continue  # absent, or not a string: the CRD schema reports the type
        found = _serve_config_problem(raw)
        if found is None:
            continue
        problem, inner = found
        f = Finding.at(
            "serve-config-invalid",
            "error",
            m,
            "spec.serveConfigV2",
            f"spec.serveConfigV2 of {m.ref} {problem}: KubeRay cannot hand it to Ray Serve, "
            "so the cluster starts but the Serve application is never deployed and the "
            "RayService never becomes ready. No other Serve check could run on it.",
            "Fix the embedded YAML (`python -c 'import yaml,sys; yaml.safe_load(sys.stdin)'` "
            "on the block shows the error), in the multi-application format: applications: "
            "[{name, import_path, deployments: [...]}].",
        )
        if inner is not None:
            f = dataclasses.replace(f, line=m.line_of("spec.serveConfigV2") + 1 + inner)
        yield f


# --------------------------------------------------------------------------- TP vs GPUs


def _gpu_groups(m: Manifest) -> list[GroupView]:
    return [g for g in worker_groups(m) if g.gpus_per_pod > 0]


@rule("tp-gpus-mismatch", versions="all")
def tp_gpus_mismatch(inv: Inventory) -> Iterator[Finding]:
    """TP x PP must equal the GPUs Ray gives the replica; TP beyond one pod needs Ray's executor."""
    yield from _server_tp(inv)
    yield from _operator_tp(inv)
    for r in _replicas(inv):
        ranks = r.parallel
        if ranks is None:
            continue
        tp = int(r.engine.get("tensor_parallel_size") or 1)
        pp = int(r.engine.get("pipeline_parallel_size") or 1)
        what = f"tensor_parallel_size {tp}" + (f" x pipeline_parallel_size {pp}" if pp > 1 else "")
        units = r.gpu_units
        if units is not None and not r.bundles_derived:
            count, per_unit = units
            given = (
                f"{fmt_num(r.num_gpus)} GPU{'s' if r.num_gpus != 1 else ''} "
                "(ray_actor_options.num_gpus)"
                if r.num_gpus is not None
                else f"{count} GPU bundle{'s' if count != 1 else ''} (placement_group_bundles)"
            )
            if per_unit < 1 and ranks > 1:
                yield Finding.at(
                    "tp-gpus-mismatch",
                    "error",
                    r.manifest,
                    r.gpus_path,
                    f"Serve replica {r.name!r} runs vLLM with {what} = {ranks} ranks, each "
                    f"needing a whole GPU, but Ray gives it {given}, a fraction of a card: "
                    "the ranks cannot each own a GPU and NCCL init hangs.",
                    f"Give the replica {ranks} whole GPUs (num_gpus: {ranks}, or {ranks} "
                    "bundles of {GPU: 1}), or lower tensor_parallel_size to 1.",
                )
            elif per_unit >= 1 and count != ranks:
                effect = (
                    "vLLM waits for ranks that have no GPU and NCCL init hangs"
                    if count < ranks
                    else f"{count - ranks} of the {count} GPUs sit idle"
                )
                yield Finding.at(
                    "tp-gpus-mismatch",
                    "error",
                    r.manifest,
                    r.engine_path("tensor_parallel_size"),
                    f"Serve replica {r.name!r} runs vLLM with {what} = {ranks} GPUs but Ray "
                    f"gives it {given}: {effect}.",
                    f"Make them equal: tensor_parallel_size x pipeline_parallel_size = {count}, "
                    f"or give the replica {ranks} GPUs.",
                )
        # TP across pods needs Ray's distributed executor (Serve LLM always uses it). A
        # replica given num_gpus must fit one pod anyway (the infeasible-request rule).
        backend = r.engine.get("distributed_executor_backend")
        if r.serve_llm or backend == "ray" or r.num_gpus is not None:
            continue
        gpu_groups = [g for g in _gpu_groups(r.manifest) if all(p in g.advertised for p in r.pins)]
        if not gpu_groups:
            continue
        most = max(g.gpus_per_pod for g in gpu_groups)
        if ranks > most:
            widest = max(gpu_groups, key=lambda g: g.gpus_per_pod)
            yield Finding.at(
                "tp-gpus-mismatch",
                "error",
                r.manifest,
                r.engine_path("tensor_parallel_size"),
                f"Serve replica {r.name!r} runs vLLM with {what} = {ranks} GPUs, more than "
                f"any worker pod has (largest: {widest.label}, {fmt_num(most)} GPU per pod), "
                f"and distributed_executor_backend is {backend or 'not set (mp)'}: the "
                "multiprocessing executor keeps every rank on one node, so the engine cannot "
                "start.",
                f"Give a worker group {ranks} GPUs per pod, or set "
                "distributed_executor_backend: ray to span pods (slower over the network).",
            )


def _operator_tp(inv: Inventory) -> Iterator[Finding]:
    """KubeAI Models and production-stack modelSpecs: TP x PP against the GPUs they ask for."""
    found: list[tuple[Located, OperatorEngine]] = []
    found.extend(kubeai_engines(inv))
    for values in inv.charts("vllm-production-stack"):
        for e in production_stack_engines(values.body):
            spec = get_path(values.body, e.path)
            if isinstance(spec, dict) and spec.get("raySpec") is not None:
                continue  # ranks spread over the chart's Ray workers
            found.append((values, e))
    for where, e in found:
        tp = int(e.engine.get("tensor_parallel_size", 1))
        pp = int(e.engine.get("pipeline_parallel_size", 1))
        if (
            e.gpus is None
            or e.gpus == tp * pp
            or not ("tensor_parallel_size" in e.engine or "pipeline_parallel_size" in e.engine)
        ):
            continue
        effect = (
            f"vLLM finds {e.gpus} GPU(s) for {tp * pp} ranks and fails at start-up"
            if e.gpus < tp * pp
            else f"{e.gpus - tp * pp} of the {e.gpus} GPUs sit idle"
        )
        yield Finding.at(
            "tp-gpus-mismatch",
            "error",
            where,
            e.paths.get("tensor_parallel_size", e.paths.get("pipeline_parallel_size", e.path)),
            f"{e.who} runs vLLM with tensor_parallel_size {tp} x pipeline_parallel_size {pp} "
            f"= {tp * pp} ranks but asks for {e.gpus} GPU(s) ({e.gpus_path}): {effect}.",
            f"Make them equal: {tp * pp} GPUs, or tensor_parallel_size {max(e.gpus // pp, 1)}.",
        )


def _server_tp(inv: Inventory) -> Iterator[Finding]:
    """Plain ``vllm serve`` pods: TP x PP against the container's ``nvidia.com/gpu``."""
    cfg = hami_config(inv)
    for pod, c, path, engine, paths in server_engines(inv):
        if "tensor_parallel_size" not in engine and "pipeline_parallel_size" not in engine:
            continue
        tp = int(engine.get("tensor_parallel_size") or 1)
        pp = int(engine.get("pipeline_parallel_size") or 1)
        gpus = container_slice(c, cfg)
        # A LeaderWorkerSet leader's engine spans its group: the leader's GPUs plus each
        # worker pod's (the worker template's, which may differ from the leader's).
        worker = lws_worker(inv, pod)
        per_worker = _pod_gpus(worker, cfg) if worker is not None else 0
        total = (gpus.count + (pod.hosts - 1) * per_worker) if gpus is not None else 0
        if gpus is None or gpus.is_hami or total == tp * pp:
            continue  # HAMi slices: the hami-gpu-count rule explains nvidia.com/gpu there
        if engine.get("distributed_executor_backend") == "ray" and total < tp * pp:
            continue  # ranks may live in other pods of a Ray cluster
        group = (
            f" + {pod.hosts - 1} worker pod(s) x nvidia.com/gpu: {per_worker} = {total}"
            if pod.hosts > 1
            else ""
        )
        effect = (
            f"vLLM finds {total} GPU(s) for {tp * pp} ranks and fails at start-up"
            if total < tp * pp
            else f"{total - tp * pp} of the {total} GPUs sit idle"
        )
        yield Finding.at(
            "tp-gpus-mismatch",
            "error",
            pod.manifest,
            paths.get("tensor_parallel_size", paths.get("pipeline_parallel_size", path)),
            f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref} runs with "
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {tp * pp} ranks but "
            f"the container gets nvidia.com/gpu: {gpus.count}{group}: {effect}.",
            f"Make them equal: nvidia.com/gpu: {tp * pp}, or --tensor-parallel-size "
            f"{max(gpus.count // pp, 1)}.",
        )


# --------------------------------------------------------------------------- Serve port

#: KubeRay's names for a Serve port (common/service.go isServingPort) and its default.
_SERVE_PORT_NAME = "serve"
_DEFAULT_SERVE_PORT = 8000


def _named_serve_port(container: dict[str, Any]) -> tuple[int | None, int, bool]:
    """(the container port named ``serve``, its index, whether any ``serve``/``serve-*`` port
    is declared) - KubeRay's FindContainerPort, which falls back to 8000 when none is named."""
    ports = container.get("ports")
    found: int | None = None
    index = -1
    any_serving = False
    for i, p in enumerate(ports if isinstance(ports, list) else []):
        if not isinstance(p, dict):
            continue
        name = str(p.get("name", ""))
        if name == _SERVE_PORT_NAME or name.startswith(_SERVE_PORT_NAME + "-"):
            any_serving = True
        if name == _SERVE_PORT_NAME and isinstance(p.get("containerPort"), int):
            found, index = p["containerPort"], i
    return found, index, any_serving


@rule("serve-port-missing", versions={"kuberay": ">=1.1", "ray": "all"})
def serve_port_missing(inv: Inventory) -> Iterator[Finding]:
    """The Serve port KubeRay builds the serve Service and the worker probe from must exist
    and be the port Serve listens on."""
    operator = kuberay_version(inv)
    probes = operator is None or operator.at_least(KUBERAY_PROBES_SERVE_PORT_FROM)
    for m in inv.of_kind("RayService"):
        head = next((g for g in groups(m) if g.is_head), None)
        if head is None:
            continue
        raw_ports = head.container.get("ports")
        head_ports: list[Any] = raw_ports if isinstance(raw_ports, list) else []
        _, _, head_serving = _named_serve_port(head.container)
        if head_ports and not head_serving and m.get("spec.serveService") is None:
            yield Finding.at(
                "serve-port-missing",
                "error",
                m,
                f"{head.container_path}.ports",
                f"The head container of {m.ref} declares {len(head_ports)} port(s) but "
                "none named 'serve': KubeRay builds the serve Service from the head's "
                "declared ports and refuses (\"Please specify a port named 'serve' (or "
                "with the prefix 'serve-', e.g. 'serve-grpc')\"), so the RayService never "
                "serves traffic.",
                f"Add - {{containerPort: {http_port(m)}, name: serve}} to the head "
                "container's ports (or give spec.serveService).",
            )
        found = serve_config(m)
        opts = found[0].get("http_options") if found is not None else None
        if not isinstance(opts, dict) or "port" not in opts:
            continue  # Serve listens on 8000, KubeRay's default too
        listen = http_port(m)
        for g in groups(m):
            if not g.is_head and not probes:
                continue  # no Serve readiness probe on workers before KubeRay 1.1
            declared, index, _ = _named_serve_port(g.container)
            probed = declared if declared is not None else _DEFAULT_SERVE_PORT
            if probed == listen:
                continue
            where = (
                f"{g.container_path}.ports[{index}].containerPort"
                if index >= 0
                else f"{g.container_path}"
            )
            what = (
                "the serve Service targets"
                if g.is_head
                else "KubeRay's readiness probe (wget localhost:<port>/-/healthz) checks"
            )
            source = (
                "its container port named serve"
                if declared is not None
                else "no port is named serve, so KubeRay assumes 8000"
            )
            effect = (
                "traffic through the serve Service reaches nothing."
                if g.is_head
                else "the worker pods never become ready and get no traffic."
            )
            yield Finding.at(
                "serve-port-missing",
                "error",
                m,
                where,
                f"Serve listens on http_options.port {listen} but {what} port {probed} on "
                f"the {g.label} ({source}): {effect}",
                f"Name the container port Serve listens on 'serve': - {{containerPort: "
                f"{listen}, name: serve}} (or set http_options.port to {probed}).",
            )


# --------------------------------------------------------------------------- VLLM_PORT

#: Ports Ray itself listens on inside its pods (KubeRay defaults).
_RAY_PORTS = {
    6379: "the GCS",
    8265: "the dashboard",
    10001: "the Ray client server",
    8080: "the metrics exporter",
    52365: "the dashboard agent",
}


def _env_literal(container: dict[str, Any], name: str) -> tuple[str, int] | None:
    env = container.get("env")
    if not isinstance(env, list):
        return None
    for i, e in enumerate(env):
        if isinstance(e, dict) and e.get("name") == name and "value" in e:
            return str(e.get("value")), i
    return None


def _runs_vllm(m: Manifest) -> bool:
    if any(r.is_vllm for r in engine_replicas(m)):
        return True
    for g in groups(m):
        image = str(g.container.get("image", ""))
        if "vllm" in image.lower():
            return True
    return False


def _port(text: str) -> int | None:
    return int(text) if re.fullmatch(r"\s*\d{1,5}\s*", text) else None


@rule("vllm-port-conflict", versions="all")
def vllm_port_conflict(inv: Inventory) -> Iterator[Finding]:
    """VLLM_PORT on a port already taken, shared by replicas of one pod, or set by a Service."""
    service_links = {(s.namespace, s.name) for s in inv.of_kind("Service") if s.name == "vllm"}
    for m in inv.of_kind(*RAY_KINDS):
        serve_port = http_port(m) if m.kind == "RayService" else 8000
        replicas = engine_replicas(m) if m.kind == "RayService" else []
        vllm = _runs_vllm(m)
        for g in groups(m):
            hit = _env_literal(g.container, "VLLM_PORT")
            env_path = f"{g.container_path}.env[{hit[1]}].value" if hit else ""
            port = _port(hit[0]) if hit else None
            if port is not None:
                taken = {serve_port: "Ray Serve's HTTP proxy", **_RAY_PORTS}
                declared = g.container.get("ports")
                for p in declared if isinstance(declared, list) else []:
                    if isinstance(p, dict) and isinstance(p.get("containerPort"), int):
                        taken.setdefault(p["containerPort"], f"container port {p.get('name', '')}")
                if port in taken:
                    yield Finding.at(
                        "vllm-port-conflict",
                        "error",
                        m,
                        env_path,
                        f"VLLM_PORT={port} in the {g.label} is the port {taken[port]} listens "
                        "on: vLLM's distributed init races it for the socket and one side fails "
                        "with 'Address already in use'.",
                        "Set VLLM_PORT to a free port (e.g. 8004), or remove it.",
                    )
                    continue
                per_pod = _replicas_per_pod(g, replicas)
                if per_pod >= 2:
                    yield Finding.at(
                        "vllm-port-conflict",
                        "error",
                        m,
                        env_path,
                        f"VLLM_PORT={port} is fixed for every process of the {g.label}, and "
                        f"one pod ({fmt_num(g.gpus_per_pod)} GPUs) holds up to {per_pod} vLLM "
                        "replicas: replicas starting together probe the same free port and "
                        "all but one fail with 'Address already in use' "
                        "(torch.distributed DistNetworkError).",
                        "Remove VLLM_PORT (vLLM then picks a free port per engine), or give "
                        "each pod one replica.",
                    )
            elif hit is None and vllm and (m.namespace, "vllm") in service_links:
                # Only pods that run engines matter: skip links switched off, and a head
                # that takes no work (num-cpus 0, no GPUs).
                idle_head = g.is_head and g.advertised.get("CPU") == 0 and not g.gpus_per_pod
                if g.pod_spec.get("enableServiceLinks") is False or idle_head:
                    continue
                yield Finding.at(
                    "vllm-port-conflict",
                    "error",
                    m,
                    g.container_path,
                    f"A Service named 'vllm' in namespace {m.namespace!r} makes Kubernetes "
                    "inject VLLM_PORT=tcp://<cluster-ip>:<port> into the pods of the "
                    f"{g.label}; vLLM reads it as its own port setting and refuses to start "
                    '("VLLM_PORT ... appears to be a URI").',
                    "Rename the Service, set enableServiceLinks: false on the pod, or set "
                    "VLLM_PORT explicitly in the container env.",
                )
        for r in replicas:
            raw = r.env.get("VLLM_PORT")
            port = _port(raw) if raw is not None else None
            if port is None:
                continue
            if port == serve_port or port in _RAY_PORTS:
                owner = "Ray Serve's HTTP proxy" if port == serve_port else _RAY_PORTS[port]
                yield Finding.at(
                    "vllm-port-conflict",
                    "error",
                    m,
                    r.env_paths["VLLM_PORT"],
                    f"Serve replica {r.name!r} runs with VLLM_PORT={port}, the port {owner} "
                    "listens on in every Ray pod: one of them fails with 'Address already in "
                    "use'.",
                    "Set VLLM_PORT to a free port (e.g. 8004), or remove it.",
                )
                continue
            for g in _gpu_groups(m):
                per_pod = _replicas_per_pod(g, [r])
                if per_pod >= 2:
                    yield Finding.at(
                        "vllm-port-conflict",
                        "error",
                        m,
                        r.env_paths["VLLM_PORT"],
                        f"Serve replica {r.name!r} fixes VLLM_PORT={port} for all its replicas, "
                        f"and one pod of the {g.label} ({fmt_num(g.gpus_per_pod)} GPUs) holds "
                        f"up to {per_pod} of them: they race for the same port and all but one "
                        "fail with 'Address already in use'.",
                        "Remove VLLM_PORT from runtime_env (vLLM picks a free port per engine).",
                    )
                    break


def _replicas_per_pod(g: GroupView, replicas: list[EngineReplica]) -> int:
    """Most vLLM replicas one pod of ``g`` can hold at once (by GPUs), over ``replicas``."""
    if g.is_head or g.gpus_per_pod <= 0:
        return 0
    best = 0
    for r in replicas:
        units = r.gpu_units
        if not r.is_vllm or units is None:
            continue
        count, per_unit = units
        need = count * per_unit
        if need <= 0 or need > g.gpus_per_pod or not can_host(g, r):
            continue
        best = max(best, math.floor(g.gpus_per_pod / need + 1e-9))
    return best


# --------------------------------------------------------------------------- rayVersion


@rule("rayversion-image-mismatch", versions={"ray": "all", "kuberay": "all"})
def rayversion_image_mismatch(inv: Inventory) -> Iterator[Finding]:
    """rayVersion must equal the Ray version in the head/worker images."""
    for m in inv.of_kind(*RAY_KINDS):
        found = cluster_spec(m)
        if found is None:
            continue
        spec, path = found
        declared = spec.get("rayVersion")
        parsed = normalise(str(declared)) if isinstance(declared, str | int | float) else None
        if parsed is None:
            continue
        want = str(parsed)
        for g in groups(m):
            containers = g.pod_spec.get("containers")
            for i, c in enumerate(containers if isinstance(containers, list) else []):
                if not isinstance(c, dict) or not isinstance(c.get("image"), str):
                    continue
                have = ray_version_of_image(c["image"])
                if have is None or have == want:
                    continue
                yield Finding.at(
                    "rayversion-image-mismatch",
                    "error",
                    m,
                    f"{g.path}.template.spec.containers[{i}].image",
                    f"rayVersion is {declared!s} but the {g.label} runs {c['image']} (Ray "
                    f"{have}): KubeRay configures the cluster (autoscaler, health checks, "
                    "start parameters) for a Ray it is not running.",
                    f"Set {path}.rayVersion: '{have}', or use a Ray {want} image.",
                )


# --------------------------------------------------------------------------- memory


def _replica_pods(r: EngineReplica, all_pods: list[PodView]) -> list[PodView]:
    """GPU worker pods a vLLM replica can run on (GPU share and custom-resource pins)."""
    return [
        p
        for p in all_pods
        if p.manifest is r.manifest
        and p.group is not None
        and p.group.gpus_per_pod > 0
        and can_host(p.group, r)
    ]


def _pod_gpus(pod: PodView, cfg: HamiConfig) -> int:
    """Whole GPUs a pod template's containers ask for (HAMi slices count 0)."""
    total = 0
    for c, _ in pod.containers():
        got = container_slice(c, cfg)
        if got is not None and not got.is_hami:
            total += got.count
    return total


def _kv_finding(
    *,
    who: str,
    m: Manifest,
    engine: dict[str, Any],
    at: str,
    slice_mib: float | None,
    card: CardMemory | None,
    planned_slice: float | None,
    complete: bool,
) -> Finding | None:
    """The kv-cache-too-small finding for one engine on one pod shape, or None if it fits."""
    need = replica_need(engine, complete=complete)
    if need is None:
        return None  # model or settings unknown to the memory model: stay silent
    per_card = need.per_card
    util = float(engine.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
    # HAMi-core virtualises device memory: inside a slice the engine sees the slice as the
    # whole card, so its budget is a fraction of the slice. Otherwise it is a fraction of the
    # largest card the pool may have (never a false positive).
    if slice_mib is not None:
        visible, where = slice_mib, f"the {fmt_num(round(slice_mib))} MiB HAMi slice"
    elif card is not None:
        visible = card.largest
        where = f"a {fmt_num(round(visible))} MiB card ({card.source})"
    else:
        return None
    budget = util * visible * 2**20
    if per_card.total <= budget:
        return None
    fixed = per_card.non_kv
    hint = ""
    if slice_mib is not None and card is not None and card.largest > slice_mib:
        ratio = slice_mib / min(card.candidates)
        if util <= ratio + 0.02:
            whole = fmt_num(round(min(card.candidates)))
            hint = (
                f" ({util:g} looks like a fraction of the whole {whole} MiB card, "
                f"slice / card = {ratio:.2f}; HAMi-core shows the engine the "
                "slice as its card, so the fraction applies to the slice)"
            )
    elif slice_mib is not None:
        hint = " (HAMi-core shows the engine the slice as its card)"
    return Finding.at(
        "kv-cache-too-small",
        "error",
        m,
        at,
        f"{who} ({need.model}, max_model_len {need.max_model_len}"
        + (" - vLLM's default, the model's context" if need.default_len else "")
        + ", "
        f"{need.ranks} rank{'s' if need.ranks > 1 else ''}): "
        f"gpu_memory_utilization {util:g} of {where} gives each rank {gib(budget)}{hint}; "
        f"weights take {gib(per_card.weights)} and activations, CUDA context and "
        f"graphs about {gib(fixed - per_card.weights)}, leaving "
        f"{gib(max(budget - fixed, 0))} for the KV cache, but one "
        f"{need.max_model_len}-token sequence needs {gib(per_card.kv_cache)}: vLLM "
        'fails at start-up ("not enough KV cache" / out of memory).',
        (
            f"Inside the HAMi slice pass the plan's slice fraction "
            f"(slice_memory_utilization {planned_slice:g}) as "
            "gpu_memory_utilization, not the whole-card fraction."
            if slice_mib is not None and planned_slice
            else "Lower max_model_len, raise gpu_memory_utilization or the slice, "
            "quantize (fp8/awq) or raise tensor_parallel_size."
        ),
    )


@rule("kv-cache-too-small", versions="all")
def kv_cache_too_small(inv: Inventory) -> Iterator[Finding]:
    """Weights + overhead + one max_model_len sequence must fit the engine's memory budget."""
    cfg = hami_config(inv)
    all_pods = pods(inv)
    for r in _replicas(inv):
        if not r.is_vllm:
            continue
        for pod in _replica_pods(r, all_pods):
            assert pod.group is not None
            found = _kv_finding(
                who=f"Serve replica {r.name!r} on the {pod.group.label}",
                m=r.manifest,
                engine=r.engine,
                at=r.engine_path("max_model_len"),
                slice_mib=_slice_mib(pod.group.container, cfg),
                # The pod's own evidence first; else the card type the replica asks Ray for.
                card=card_memory(pod, inv)
                or card_of_type(r.accelerator_type, f"accelerator_type: {r.accelerator_type}"),
                planned_slice=r.planned_slice_utilization,
                complete=r.serve_llm,
            )
            if found is not None:
                yield found
                break
    for pod, c, path, engine, paths in server_engines(inv):
        found = _kv_finding(
            who=f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref}",
            m=pod.manifest,
            engine=engine,
            at=paths.get("max_model_len", path),
            slice_mib=_slice_mib(c, cfg),
            card=card_memory(pod, inv),
            planned_slice=None,
            complete=True,
        )
        if found is not None:
            yield found


def _slice_mib(container: dict[str, Any], cfg: HamiConfig) -> float | None:
    """MiB of the container's HAMi memory slice, when one is set."""
    s = container_slice(container, cfg)
    if s is None or not s.is_hami:
        return None
    if s.mem_mib is not None:
        return s.mem_mib
    return None


@rule("gpu-memory-utilization-exceeds-slice", versions="all")
def gpu_memory_utilization_exceeds_slice(inv: Inventory) -> Iterator[Finding]:
    """Replicas sharing a card must each claim at most their share of it."""
    for r in _replicas(inv):
        frac = r.gpu_fraction
        if frac is None or not r.is_vllm:
            continue
        written = "gpu_memory_utilization" in r.engine
        util = float(r.engine.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
        if util <= frac + 1e-3:  # rounding of planned fractions (4 decimals) is no overlap
            continue
        sharers = math.floor(1 / frac + 1e-9)
        yield Finding.at(
            "gpu-memory-utilization-exceeds-slice",
            "error",
            r.manifest,
            r.engine_path("gpu_memory_utilization") if written else r.gpus_path,
            f"Serve replica {r.name!r} holds {fmt_num(frac)} of a GPU, so Ray packs up to "
            f"{sharers} replicas on one card, but each vLLM engine claims "
            f"gpu_memory_utilization {util:g}"
            + ("" if written else " (vLLM's default)")
            + f" of the card: {sharers} x {util:g} = {sharers * util:g} > 1, and the second "
            "replica fails at start-up with out-of-memory (ray#62553).",
            f"Set gpu_memory_utilization <= {frac:g} (minus a margin, e.g. "
            f"{max(frac - 0.05, 0.01):.2f}), or give each replica a whole GPU.",
        )


# --------------------------------------------------------------------------- batching


def _batch_findings(
    who: str,
    m: Manifest,
    engine: dict[str, Any],
    path_of: dict[str, str],
    default: str,
    *,
    vllm: KnownVersion | None = None,
) -> Iterator[Finding]:
    """The two start-up refusals: batch budget < context (no chunked prefill), < max_num_seqs.

    Chunked prefill is always on in vLLM's V1 engine (the default from 0.8); the V0 engine of
    a known older image turns it on by itself only above a 32k context, so there an unset
    flag means "off". An unknown version keeps the unset flag's V1 meaning (no finding).
    """
    mnbt = engine.get("max_num_batched_tokens")
    mml = engine.get("max_model_len")
    seqs = engine.get("max_num_seqs")
    chunked = engine.get("enable_chunked_prefill")
    v0_off = (
        chunked is None
        and vllm is not None
        and not vllm.at_least(VLLM_V1_DEFAULT_FROM)
        and isinstance(mml, int)
        and mml <= VLLM_V0_AUTO_CHUNKED_ABOVE
    )
    at = path_of.get("max_num_batched_tokens", default)
    if mnbt is not None and mml is not None and mnbt < mml and (chunked is False or v0_off):
        why = (
            "with chunked prefill off"
            if chunked is False
            else f"and chunked prefill unset, which {vllm.describe() if vllm else ''} (V0 engine) "
            f"leaves off below a {VLLM_V0_AUTO_CHUNKED_ABOVE}-token context"
        )
        yield Finding.at(
            "max-num-batched-tokens",
            "warning",
            m,
            at,
            f"{who}: max_num_batched_tokens {mnbt} < max_model_len "
            f"{mml} {why}: a prompt longer than {mnbt} tokens can never "
            "be scheduled, and vLLM refuses this configuration at start-up.",
            f"Raise max_num_batched_tokens to >= {mml}, or enable chunked prefill.",
        )
    if mnbt is not None and seqs is not None and mnbt < seqs:
        yield Finding.at(
            "max-num-batched-tokens",
            "warning",
            m,
            at,
            f"{who}: max_num_batched_tokens {mnbt} < max_num_seqs "
            f"{seqs}: vLLM refuses this at start-up.",
            f"Raise max_num_batched_tokens to >= {seqs}.",
        )


def read_names(v: KnownVersion | None, new: str, old: str) -> list[str]:
    """The names of a renamed Serve field that Ray ``v`` reads, in precedence order: before
    Ray 2.10 only the old one; from 2.10 the new one, then the old one until 2.33; with no
    version only the new one (the old one is dropped from 2.33 on, so nothing can be said
    about it). The one place ``deprecated-serve-field``'s version facts are applied to a
    value."""
    new_names = v is None or v.at_least(SERVE_NEW_NAMES_FROM)
    old_names = v is not None and not v.at_least(SERVE_OLD_NAMES_DROPPED_FROM)
    return ([new] if new_names else []) + ([old] if old_names else [])


def effective_target(opts: dict[str, Any], v: KnownVersion | None) -> tuple[str, float, str] | None:
    """The autoscaling target Serve really uses on ``v``: (written key, value, assumption).

    The same version facts as ``deprecated-serve-field``, so one report never cites a target
    that another finding calls dropped: before Ray 2.10 only the old name counts; from 2.10 the
    new name wins and the old one counts until 2.33; with no version only the new name is used
    (the old one is dropped from 2.33 on, so nothing can be said about it).
    """
    auto = opts.get("autoscaling_config")
    auto = auto if isinstance(auto, dict) else {}
    for key in read_names(v, "target_ongoing_requests", "target_num_ongoing_requests_per_replica"):
        for table, where in ((auto, "autoscaling_config."), (opts, "")):
            val = table.get(key)
            if isinstance(val, int | float) and not isinstance(val, bool):
                assumed = (
                    v.describe()
                    if v is not None
                    else "assuming Ray 2.10 or later; the manifest names no Ray version"
                )
                return f"{where}{key}", float(val), assumed
    return None


@rule("max-num-batched-tokens", versions={"ray": "all", "vllm": "all"})
def max_num_batched_tokens(inv: Inventory) -> Iterator[Finding]:
    """Batch token budget vs context length, and max_num_seqs vs the traffic Serve sends."""
    for pod, c, path, engine, paths in server_engines(inv):
        who = f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref}"
        image = c.get("image")
        vllm = vllm_version([image]) if isinstance(image, str) else None
        yield from _batch_findings(who, pod.manifest, engine, paths, path, vllm=vllm)
    for r in _replicas(inv):
        if not r.is_vllm:
            continue
        yield from _batch_findings(
            f"Serve replica {r.name!r}", r.manifest, r.engine, r.engine_paths, r.path
        )
        seqs = r.engine.get("max_num_seqs")
        if seqs is None:
            continue
        found = effective_target(r.options, ray_version(r.manifest))
        if found is None:
            continue
        key, target, assumed = found
        if seqs >= target:
            continue
        yield Finding.at(
            "max-num-batched-tokens",
            "warning",
            r.manifest,
            r.engine_path("max_num_seqs"),
            f"Serve replica {r.name!r}: vLLM runs at most max_num_seqs {seqs} sequences at "
            f"once, but Serve is told to keep {fmt_num(target)} requests per replica "
            f"({key}, {assumed}): {fmt_num(target - seqs)} of them wait in vLLM's queue "
            f"while the GPU is capped at {seqs} concurrent sequences, and the autoscaler "
            "adds replicas late.",
            f"Raise max_num_seqs to at least {fmt_num(math.ceil(target))} (the KV cache "
            "permitting), or lower the autoscaling target.",
        )


# --------------------------------------------------------------------------- admission

#: The fewest sequences vLLM runs at once when ``max_num_seqs`` is not written: its
#: scheduler's own default (``SchedulerConfig.DEFAULT_MAX_NUM_SEQS``, what an ``AsyncLLM``
#: built from engine args in a deployment gets); its API server defaults higher on GPUs
#: (256, 1024 on 70 GiB cards; vllm/engine/arg_utils.py, 0.32).
VLLM_MIN_DEFAULT_MAX_NUM_SEQS = 128
#: The router's retry schedule for a replica that is full (Ray 2.60, request_router.py).
_BACKOFF = "25-500 ms"


def effective_cap(opts: dict[str, Any], v: KnownVersion | None) -> tuple[int, str | None, str]:
    """The requests Serve lets one replica hold on ``v``: (value, the key that writes it or
    None for Ray's default, where the value comes from: ``max_ongoing_requests: 32``,
    ``Ray's default on Ray 2.60.0 (rayVersion)``). The same naming facts as
    ``effective_target`` (:func:`read_names`)."""
    for key in read_names(v, "max_ongoing_requests", "max_concurrent_queries"):
        val = opts.get(key)
        if isinstance(val, int) and not isinstance(val, bool):
            return val, key, f"{key}: {val}"
    if v is None:
        return (
            SERVE_DEFAULT_MAX_ONGOING,
            None,
            ("Ray's default, assuming Ray 2.32 or later: the manifest names no Ray version"),
        )
    default = (
        SERVE_DEFAULT_MAX_ONGOING
        if v.at_least(SERVE_DEFAULTS_5_FROM)
        else SERVE_PRE_2_32_MAX_ONGOING
    )
    return default, None, f"Ray's default on {v.describe()}"


#: Engine arguments only vLLM takes. ``model``, ``max_model_len``, ``tensor_parallel_size``
#: and ``dtype`` are every server's (a transformers-neuronx or diffusers app reads MODEL_ID
#: too), so they do not say a replica runs vLLM.
_VLLM_ONLY_ARGS = frozenset(
    {
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "kv_cache_dtype",
        "distributed_executor_backend",
        "enable_lora",
        "max_loras",
        "max_cpu_loras",
        "max_lora_rank",
        "enable_prompt_embeds",
        "enforce_eager",
    }
)


def _runs_vllm_surely(r: EngineReplica) -> bool:
    """The config shows that ``r`` runs vLLM, not only that it names a model: Ray Serve LLM,
    an argument only vLLM takes, or "vllm" in its name, its app's import path or its
    cluster's images (KubeRay's ``VLLMDeployment`` samples)."""
    if r.serve_llm or _VLLM_ONLY_ARGS & r.engine.keys():
        return True
    app = next((a for a in serve_apps(r.manifest) if r.path.startswith(a.path + ".")), None)
    words = [r.name, app.import_path if app is not None else ""]
    words += [str(g.container.get("image", "")) for g in groups(r.manifest)]
    return any("vllm" in w.lower() for w in words)


@rule("serve-admits-below-batch", versions={"ray": "all", "vllm": "all"})
def serve_admits_below_batch(inv: Inventory) -> Iterator[Finding]:
    """A Serve replica admitting fewer requests than its vLLM engine's batch: a warning when
    the config writes the cap; info when Ray's default would apply, since the app's own
    ``@serve.deployment(max_ongoing_requests=...)`` - code the manifest does not show - may
    set it (the config wins over the decorator only where it writes the field)."""
    for r in _replicas(inv):
        if not r.is_vllm or not _runs_vllm_surely(r):
            continue
        cap, key, source = effective_cap(r.options, ray_version(r.manifest))
        if r.serve_llm and key is None:
            continue  # Ray Serve LLM's builder admits without bound (1e9) unless told
        seqs = r.engine.get("max_num_seqs")
        batch = seqs if isinstance(seqs, int) and seqs > 0 else VLLM_MIN_DEFAULT_MAX_NUM_SEQS
        explicit = batch == seqs
        if cap >= batch:
            continue
        runs = (
            f"up to {batch} sequences at once (max_num_seqs)"
            if explicit
            else f"at least {batch} sequences at once (vLLM's smallest default max_num_seqs)"
        )
        effect = (
            f"the engine never decodes more than {cap}, {100 * cap // batch} % of its batch, "
            "and every further request waits in Serve's router, which retries a full "
            f"replica on a {_BACKOFF} backoff."
        )
        fix = (
            f"{batch}; {2 * batch} also keeps a batch waiting inside the engine, so a request "
            "that replaces a finished one starts at the engine's next step."
        )
        if key is not None:
            yield Finding.at(
                "serve-admits-below-batch",
                "warning",
                r.manifest,
                f"{r.options_path}.{key}",
                f"Serve replica {r.name!r} admits {cap} requests at once ({source}), but "
                f"its vLLM engine runs {runs}: {effect}",
                f"Set max_ongoing_requests to at least {fix}",
            )
        else:
            yield Finding.at(
                "serve-admits-below-batch",
                "info",
                r.manifest,
                r.options_path,
                f"Serve replica {r.name!r}: the config writes no max_ongoing_requests, so "
                f"unless the app's @serve.deployment sets one, Serve admits {cap} requests "
                f"at once ({source}) while its vLLM engine runs {runs}: {effect}",
                f"Write max_ongoing_requests in the deployment's config: at least {fix}",
            )


# --------------------------------------------------------------------------- eager engines

_EAGER_COST = (
    "it turns off torch.compile and CUDA graphs, so every decode step launches the model "
    "layer by layer from Python and the engine's one CPU core, not the GPU, sets the token "
    "rate (Gemma 3 270M: 34 ms per output token eager at 8 concurrent requests on an H100, "
    "its SMs 15 % busy; 3.0-7.6 ms compiled at 1-64 on an H200; about 2 ms of CPU per layer "
    "per step, so bigger models lose as much)"
)
_EAGER_FIX = (
    "Remove enforce_eager (vLLM compiles and captures CUDA graphs by default; only the "
    "first start is slower). If it was set to fit a small slice, cap the graphs instead: "
    "compilation_config {max_cudagraph_capture_size: <max_num_seqs>} keeps the graphs to "
    "the batch sizes the replica runs."
)


@rule("enforce-eager", versions={"vllm": "all"})
def enforce_eager(inv: Inventory) -> Iterator[Finding]:
    """A GPU engine with enforce_eager: decode bound by one CPU core's Python."""
    # (where, path of the setting, who) of every eager engine given a GPU
    eager: list[tuple[Located, str, str]] = []
    cfg = hami_config(inv)
    for pod, c, path, engine, paths in server_engines(inv):
        if engine.get("enforce_eager") is True and container_slice(c, cfg) is not None:
            who = f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref}"
            eager.append((pod.manifest, paths.get("enforce_eager", path), who))
    for r in _replicas(inv):
        if r.is_vllm and r.engine.get("enforce_eager") is True and r.gpu_units is not None:
            eager.append((r.manifest, r.engine_path("enforce_eager"), f"Serve replica {r.name!r}"))
    operators: list[tuple[Located, OperatorEngine]] = list(kubeai_engines(inv))
    for values in inv.charts("vllm-production-stack"):
        operators.extend((values, e) for e in production_stack_engines(values.body))
    for where, e in operators:
        if e.engine.get("enforce_eager") is True and (e.gpus or 0) > 0:
            eager.append((where, e.paths.get("enforce_eager", e.path), e.who))
    for where, path, who in eager:
        yield Finding.at(
            "enforce-eager",
            "warning",
            where,
            path,
            f"{who} runs on a GPU with enforce_eager: {_EAGER_COST}.",
            _EAGER_FIX,
        )
