"""Rules: HAMi vGPU sharing (pitfalls.md, "HAMi vGPU sharing"; HAMi v2.10).

Facts these rules rest on (HAMi source, pkg/scheduler/webhook.go and HAMi-core):

* the admission webhook rewrites ``schedulerName`` to ``hami-scheduler`` for pods that ask for
  GPU resources, unless the pod names another scheduler (``default-scheduler`` is rewritten
  only with ``forceOverwriteDefaultScheduler``); it DENIES pods with a privileged container
  that ask for GPUs;
* without HAMi's scheduler, ``nvidia.com/gpumem``/``gpucores`` are ignored when placing pods:
  the default scheduler packs by ``nvidia.com/gpu`` alone;
* ``nvidia.com/gpu`` is the number of physical cards the container gets a slice of; each slice
  is ``gpumem`` MiB (``gpumem-percentage`` of the card) and ``gpucores`` % of its SMs;
* HAMi-core (the in-container CUDA hook) reports the slice as the card's total memory, so a
  vLLM ``gpu_memory_utilization`` applies to the slice - unless the hook is switched off with
  ``CUDA_DISABLE_CONTROL=true``, when vLLM sees (and claims a fraction of) the whole card.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from fleetserve.k8s.doctor.finding import Finding
from fleetserve.k8s.doctor.inventory import Inventory
from fleetserve.k8s.doctor.ray_objects import fmt_num, try_quantity
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._devices import (
    HamiConfig,
    PodView,
    Slice,
    card_memory,
    container_slice,
    hami_config,
    hami_in_use,
    may_share_nodes,
    node_constraints,
    nodepool_constraints,
    pods,
    tenant_of,
)
from fleetserve.k8s.doctor.rules._engines import (
    EngineReplica,
    can_host,
    container_engine,
    engine_replicas,
)
from fleetserve.k8s.doctor.rules._models import gib, replica_need
from fleetserve.k8s.doctor.rules._versions import HAMI_DENIES_PRIVILEGED_FROM, hami_version

_DEFAULT_SCHEDULER = "default-scheduler"
#: vLLM's default gpu_memory_utilization (vllm/config/cache.py, vLLM 0.32).
_VLLM_DEFAULT_UTIL = 0.92


def _hami_slices(pod: PodView, cfg: HamiConfig) -> list[tuple[dict[str, Any], str, Slice]]:
    out = []
    for c, path in pod.containers():
        s = container_slice(c, cfg)
        if s is not None:
            out.append((c, path, s))
    return out


def _describe(pod: PodView) -> str:
    return f"the {pod.label} of {pod.manifest.ref}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- scheduler


def _scheduled_by_hami(pod: PodView, cfg: HamiConfig) -> tuple[bool, str]:
    """Whether HAMi's scheduler will place this GPU pod, and who will if not."""
    name = pod.spec.get("schedulerName")
    if name == cfg.scheduler_name:
        return True, name
    if not cfg.webhook_enabled:
        return False, str(name or _DEFAULT_SCHEDULER)
    if name in (None, ""):
        return True, cfg.scheduler_name
    if name == _DEFAULT_SCHEDULER and cfg.force_overwrite_default_scheduler:
        return True, cfg.scheduler_name
    return False, str(name)


@rule("hami-scheduler-disabled", versions="all")
def hami_scheduler_disabled(inv: Inventory) -> Iterator[Finding]:
    """gpumem/gpucores only hold when HAMi's scheduler places the pod."""
    cfg = hami_config(inv)
    sliced = [
        (pod, path, s) for pod in pods(inv) for _, path, s in _hami_slices(pod, cfg) if s.is_hami
    ]
    for values in inv.charts("hami"):
        enabled = values.get("scheduler.kubeScheduler.enabled")
        if enabled is not False and str(enabled).lower() != "false":
            continue
        example = ""
        if sliced:
            pod, _, s = sliced[0]
            mem = f"{fmt_num(s.mem_mib)} MiB" if s.mem_mib is not None else "a slice"
            example = (
                f" {len(sliced)} container(s) in the input ask for HAMi slices (e.g. {mem} in "
                f"{_describe(pod)}), and their memory is not counted when they are placed."
            )
        yield Finding.at(
            "hami-scheduler-disabled",
            "error",
            values,
            "scheduler.kubeScheduler.enabled",
            "HAMi's chart runs without its kube-scheduler (scheduler.kubeScheduler.enabled: "
            "false): the default scheduler places GPU pods by nvidia.com/gpu alone and ignores "
            "nvidia.com/gpumem/gpucores, so slices on one card can sum beyond its memory and "
            "the OOM killer takes the engines (seed 004's week-long incident)." + example,
            "Set scheduler.kubeScheduler.enabled: true (the chart default) and check that the "
            "hami-scheduler pod runs.",
        )
    for pod, path, s in sliced:
        ok, who = _scheduled_by_hami(pod, cfg)
        if ok:
            continue
        why = (
            "HAMi's admission webhook is disabled (scheduler.admissionWebhook.enabled: false), "
            "so nothing sets schedulerName for it"
            if not cfg.webhook_enabled
            else f"it names schedulerName {who!r}, which HAMi's webhook leaves alone"
        )
        yield Finding.at(
            "hami-scheduler-disabled",
            "error",
            pod.manifest,
            f"{pod.path}.schedulerName",
            f"{_cap(_describe(pod))} asks for HAMi resources ({_slice_text(s)} at "
            f"{path}) but is placed by {who!r}: {why}. That scheduler ignores gpumem/gpucores, "
            "so slices can oversubscribe a card and the engines OOM.",
            f"Set schedulerName: {cfg.scheduler_name} in the pod template.",
        )


def _slice_text(s: Slice) -> str:
    parts = [f"nvidia.com/gpu {s.count}"]
    if s.mem_mib is not None:
        parts.append(f"gpumem {fmt_num(s.mem_mib)} MiB")
    if s.mem_percent is not None:
        parts.append(f"gpumem-percentage {fmt_num(s.mem_percent)}")
    if s.cores is not None:
        parts.append(f"gpucores {fmt_num(s.cores)}")
    return ", ".join(parts)


# --------------------------------------------------------------------------- overflow


def _cards_per_node(pod: PodView, inv: Inventory) -> int | None:
    keys = ("nvidia.com/gpu.count", "karpenter.k8s.aws/instance-gpu-count")
    want = node_constraints(pod.spec)
    tables = [want] + [
        nodepool_constraints(p)
        for p in inv.of_kind("NodePool")
        if "karpenter.sh/nodepool" in want and p.name in want["karpenter.sh/nodepool"]
    ]
    for table in tables:
        for key in keys:
            if key in table:
                vals = [try_quantity(v) for v in table[key]]
                nums = [int(v) for v in vals if v]
                if nums:
                    return max(nums)
    return None


@rule("hami-gpumem-overflow", versions="all")
def hami_gpumem_overflow(inv: Inventory) -> Iterator[Finding]:
    """A slice larger than the card (x deviceMemoryScaling) never finds a card."""
    cfg = hami_config(inv)
    scaling = cfg.device_memory_scaling
    for pod in pods(inv):
        slices = _hami_slices(pod, cfg)
        if not any(s.is_hami for _, _, s in slices):
            continue
        card = card_memory(pod, inv)
        for c, path, s in slices:
            res = f"{path}.resources.limits"
            if s.cores is not None and s.cores > 100:
                yield Finding.at(
                    "hami-gpumem-overflow",
                    "info",
                    pod.manifest,
                    f"{res}.{cfg.resource_cores}",
                    f"Container {c.get('name', '?')!r} of {_describe(pod)} asks for "
                    f"gpucores {fmt_num(s.cores)}: HAMi clamps it to 100, which means an "
                    "exclusive card (no other slice may use its SMs).",
                    "Write gpucores <= 100 (100 only when the card must be exclusive).",
                )
            if s.mem_percent is not None and s.mem_percent > 100:
                yield Finding.at(
                    "hami-gpumem-overflow",
                    "error",
                    pod.manifest,
                    f"{res}.{cfg.resource_mem_percentage}",
                    f"Container {c.get('name', '?')!r} of {_describe(pod)} asks for "
                    f"gpumem-percentage {fmt_num(s.mem_percent)}: no card has more than 100% "
                    "of itself, so HAMi finds no card (CardInsufficientMemory) and the pod "
                    "stays Pending.",
                    "Write gpumem-percentage <= 100.",
                )
            if card is None or s.mem_mib is None:
                continue
            capacity = card.largest * scaling
            if s.mem_mib > capacity:
                scaled = f" x deviceMemoryScaling {scaling:g}" if scaling != 1 else ""
                yield Finding.at(
                    "hami-gpumem-overflow",
                    "error",
                    pod.manifest,
                    f"{res}.{cfg.resource_mem}",
                    f"Container {c.get('name', '?')!r} of {_describe(pod)} asks for "
                    f"gpumem {fmt_num(s.mem_mib)} MiB per card, but the largest card it can "
                    f"land on has {fmt_num(round(card.largest))} MiB{scaled} "
                    f"({card.source}): HAMi finds no card (CardInsufficientMemory) and the "
                    "pod stays Pending"
                    + ("" if cfg.kube_scheduler_enabled else "; without HAMi's scheduler it OOMs")
                    + ".",
                    f"Lower gpumem to <= {fmt_num(math.floor(capacity))} MiB (minus headroom), "
                    "or select a pool with larger cards.",
                )
        # Slices of one pod that must share the node's cards.
        cards = _cards_per_node(pod, inv)
        if card is None or cards is None:
            continue
        total = sum(s.count * s.memory_of(card.largest) for _, _, s in slices)
        capacity = cards * card.largest * scaling
        if total > capacity and all(
            s.mem_mib is None or s.mem_mib <= card.largest * scaling for _, _, s in slices
        ):
            yield Finding.at(
                "hami-gpumem-overflow",
                "error",
                pod.manifest,
                pod.path,
                f"The containers of {_describe(pod)} ask for {fmt_num(round(total))} MiB of "
                f"GPU memory together, but a node has {cards} card(s) of "
                f"{fmt_num(round(card.largest))} MiB = {fmt_num(round(capacity))} MiB: the "
                "slices cannot all be placed and the pod stays Pending.",
                "Shrink the slices or pick a node type with more cards.",
            )


# --------------------------------------------------------------------------- privileged


def _privileged(c: dict[str, Any]) -> bool:
    sc = c.get("securityContext")
    return isinstance(sc, dict) and sc.get("privileged") is True


@rule("hami-privileged-gpu", versions={"hami": "all"})
def hami_privileged_gpu(inv: Inventory) -> Iterator[Finding]:
    """HAMi's webhook denies pods with a privileged container that ask for GPUs."""
    cfg = hami_config(inv)
    in_use = hami_in_use(inv, cfg)
    v = hami_version(inv)
    for pod in pods(inv):
        slices = _hami_slices(pod, cfg)
        if not slices or not cfg.webhook_enabled:
            continue
        if not in_use and not any(s.is_hami for _, _, s in slices):
            continue  # plain NVIDIA device plugin: privileged GPU pods are allowed
        handled, _ = _scheduled_by_hami(pod, cfg)
        if not handled:
            continue  # the webhook skips pods that name another scheduler
        for c, path in pod.containers():
            if not _privileged(c):
                continue
            name = c.get("name", "?")
            then = " and the Ray group never gets a node" if pod.group is not None else ""
            if v is not None and v.at_least(HAMI_DENIES_PRIVILEGED_FROM):
                what = (
                    f"{v.describe()}'s admission webhook denies it (\"container {name} is "
                    f'privileged"), so the pod is never created{then}'
                )
            elif v is not None:
                what = (
                    f"{v.describe()}'s admission webhook skips privileged containers: the pod is "
                    "admitted without HAMi (no hami-scheduler, no gpumem/gpucores limits), and a "
                    "privileged container sees every GPU of its node; HAMi 2.10 and later deny "
                    "the pod instead"
                )
            else:
                what = (
                    'HAMi 2.10 and later deny it at admission ("container '
                    f'{name} is privileged"), so the pod is never created{then}; older HAMi '
                    "admits it without applying the slice (the manifests name no HAMi version)"
                )
            yield Finding.at(
                "hami-privileged-gpu",
                "error",
                pod.manifest,
                f"{path}.securityContext.privileged",
                f"Container {name!r} of {_describe(pod)} is privileged and the pod asks for GPU "
                f"resources: {what}.",
                "Drop privileged: true (grant the specific capabilities the container needs), "
                "or run the GPU work in a container of a non-privileged pod.",
            )
            break


# --------------------------------------------------------------------------- GPU count


def _replica_gpus(r: EngineReplica) -> tuple[int, str] | None:
    """Whole GPUs one replica needs inside ONE pod, and why, when the config says so."""
    if r.num_gpus is not None and r.num_gpus >= 2:
        tp = r.engine.get("tensor_parallel_size")
        return round(r.num_gpus), f"num_gpus {fmt_num(r.num_gpus)}" + (
            f" (tensor_parallel_size {tp})" if tp else ""
        )
    return None


@rule("hami-gpu-count", versions="all")
def hami_gpu_count(inv: Inventory) -> Iterator[Finding]:
    """With HAMi, nvidia.com/gpu counts cards to slice from: TP=4 needs nvidia.com/gpu: 4."""
    cfg = hami_config(inv)
    for m in inv.of_kind("RayService"):
        replicas = [(r, n) for r in engine_replicas(m) if (n := _replica_gpus(r)) is not None]
        if not replicas:
            continue
        gpu_pods = [
            (p, s)
            for p in pods(inv)
            if p.manifest is m and p.group is not None and not p.group.is_head
            for c, _, s in _hami_slices(p, cfg)[:1]
            if c is p.group.container
        ]
        for r, (gpus, why) in replicas:
            hosts = [
                (p, s)
                for p, s in gpu_pods
                if p.group and all(k in p.group.advertised for k in r.pins)
            ]
            hosts_sliced = [(p, s) for p, s in hosts if s.is_hami]
            if not hosts_sliced or gpus <= max(s.count for _, s in hosts):
                continue
            pod, s = max(hosts_sliced, key=lambda ps: ps[1].count)
            assert pod.group is not None
            yield Finding.at(
                "hami-gpu-count",
                "error",
                m,
                f"{pod.group.container_path}.resources.limits.{cfg.resource_count}",
                f"Serve replica {r.name!r} needs {gpus} GPUs in one pod ({why}), but the "
                f"{pod.group.label} gives nvidia.com/gpu: {s.count} with HAMi slices "
                f"({_slice_text(s)}): with HAMi that is {s.count} slice(s) of "
                f"{s.count} physical card(s), and Ray advertises {s.count} GPU(s) per pod, "
                "not a share of more cards, so not even one replica fits.",
                f"Set nvidia.com/gpu: {gpus} (one {fmt_num(s.mem_mib or 0)} MiB slice on each "
                f"of {gpus} cards) and num-gpus accordingly, or lower the replica's GPUs.",
            )
    # Plain vLLM server pods (Deployment/StatefulSet/Pod) with a TP flag.
    for pod in pods(inv):
        if pod.group is not None:
            continue
        for c, path, s in _hami_slices(pod, cfg):
            engine, _ = container_engine(c, path)
            tp = int(engine.get("tensor_parallel_size") or 1) * int(
                engine.get("pipeline_parallel_size") or 1
            )
            if tp > s.count and (s.is_hami or hami_in_use(inv, cfg)):
                yield Finding.at(
                    "hami-gpu-count",
                    "error",
                    pod.manifest,
                    f"{path}.resources.limits.{cfg.resource_count}",
                    f"Container {c.get('name', '?')!r} of {_describe(pod)} runs vLLM with "
                    f"{tp} tensor/pipeline ranks but asks for nvidia.com/gpu: {s.count}: with "
                    f"HAMi that is {s.count} slice(s) of {s.count} card(s), so {tp - s.count} "
                    "rank(s) find no GPU and vLLM fails at start-up as it does without HAMi: "
                    "not even one replica starts.",
                    f"Set nvidia.com/gpu: {tp}.",
                )


# --------------------------------------------------------------------------- engine memory


def _hook_disabled(c: dict[str, Any]) -> bool:
    env = c.get("env")
    for e in env if isinstance(env, list) else []:
        if isinstance(e, dict) and e.get("name") == "CUDA_DISABLE_CONTROL":
            return str(e.get("value", "")).strip().lower() in ("true", "1")
    return False


def _engines_on(
    pod: PodView, inv: Inventory
) -> list[tuple[str, dict[str, Any], dict[str, str], str, bool]]:
    """(name, engine args, their paths, default path, args complete) of vLLM engines in
    ``pod`` (complete: the whole command line, so vLLM's defaults apply to what is unset)."""
    out: list[tuple[str, dict[str, Any], dict[str, str], str, bool]] = []
    if pod.group is not None:
        if pod.group.is_head or pod.group.gpus_per_pod <= 0:
            return out
        for r in engine_replicas(pod.manifest):
            if not r.is_vllm or not can_host(pod.group, r):
                continue
            out.append((f"Serve replica {r.name!r}", r.engine, r.engine_paths, r.path, r.serve_llm))
        return out
    for c, path in pod.containers():
        engine, paths = container_engine(c, path)
        if engine or "vllm" in str(c.get("image", "")).lower():
            out.append((f"vLLM container {c.get('name', '?')!r}", engine, paths, path, True))
    return out


@rule("hami-engine-memory", versions="all")
def hami_engine_memory(inv: Inventory) -> Iterator[Finding]:
    """vLLM inside a HAMi slice must fit the slice: its claim, and its weights."""
    cfg = hami_config(inv)
    for pod in pods(inv):
        slices = [
            (c, path, s) for c, path, s in _hami_slices(pod, cfg) if s.mem_mib or s.mem_percent
        ]
        if not slices:
            continue
        engines = _engines_on(pod, inv)
        if not engines:
            continue
        c, path, s = slices[0]
        card = card_memory(pod, inv)
        if s.mem_mib is not None:
            slice_mib: float | None = s.mem_mib
        elif card is not None and s.mem_percent is not None:
            slice_mib = card.largest * s.mem_percent / 100
        else:
            slice_mib = None
        if slice_mib is None:
            continue
        hook_off = _hook_disabled(c)
        for name, engine, paths, default_path, complete in engines:
            util = float(engine.get("gpu_memory_utilization", _VLLM_DEFAULT_UTIL))
            util_path = paths.get("gpu_memory_utilization", default_path)
            if hook_off and card is not None:
                # vLLM sees the whole card: its claim must fit inside the slice.
                claim = util * card.largest
                smallest = min(card.candidates)
                if util * smallest > slice_mib:
                    yield Finding.at(
                        "hami-engine-memory",
                        "error",
                        pod.manifest,
                        util_path,
                        f"{name} in {_describe(pod)} runs with CUDA_DISABLE_CONTROL=true, so "
                        "HAMi-core does not virtualise memory and vLLM sees the whole card: "
                        f"gpu_memory_utilization {util:g} x {fmt_num(round(card.largest))} MiB "
                        f"= {fmt_num(round(claim))} MiB, but its slice is "
                        f"{fmt_num(round(slice_mib))} MiB: it takes memory the card's other "
                        "slices were promised and they fail with out-of-memory.",
                        f"Set gpu_memory_utilization <= {slice_mib / smallest:.2f} "
                        "(slice / card, minus a margin), or remove CUDA_DISABLE_CONTROL.",
                    )
                    continue
            need = replica_need(engine, complete=complete)
            if need is None:
                continue
            per_card = need.per_card
            if per_card.total <= slice_mib * 2**20:
                continue
            yield Finding.at(
                "hami-engine-memory",
                "error",
                pod.manifest,
                f"{path}.resources.limits.{cfg.resource_mem}"
                if s.mem_mib is not None
                else f"{path}.resources.limits.{cfg.resource_mem_percentage}",
                f"{name} ({need.model}, max_model_len {need.max_model_len}, {need.ranks} "
                f"rank(s)) needs {gib(per_card.total)} per card (weights "
                f"{gib(per_card.weights)}, one sequence of KV cache {gib(per_card.kv_cache)}, "
                f"activations/CUDA context/graphs {gib(per_card.non_kv - per_card.weights)}), "
                f"but the HAMi slice of {_describe(pod)} is {fmt_num(round(slice_mib))} MiB: "
                "HAMi-core caps the engine at the slice, so no gpu_memory_utilization can make "
                "it fit and vLLM fails at start-up.",
                f"Raise nvidia.com/gpumem to >= {math.ceil(per_card.total / 2**20)} MiB (plus "
                "headroom), quantize, shorten max_model_len, or add tensor-parallel ranks.",
            )


# --------------------------------------------------------------------------- tenants


def _shares_card(s: Slice, card_mib: float | None) -> bool:
    """A slice leaves room for another workload on its card."""
    if s.cores is not None and s.cores >= 100:
        return False
    if s.mem_percent is not None:
        return s.mem_percent < 100
    if s.mem_mib is not None:
        return card_mib is None or s.mem_mib < card_mib
    return False  # no memory limit: HAMi gives the container the whole card's memory


@rule("tenant-shares-gpu", versions="all")
def tenant_shares_gpu(inv: Inventory) -> Iterator[Finding]:
    """Workloads of different tenants that HAMi may place on one physical card."""
    cfg = hami_config(inv)
    candidates: list[tuple[PodView, str, str, str]] = []
    for pod in pods(inv):
        tenant = tenant_of(pod)
        if tenant is None:
            continue
        card = card_memory(pod, inv)
        for _, path, s in _hami_slices(pod, cfg):
            if s.is_hami and _shares_card(s, card.largest if card else None):
                candidates.append((pod, path, tenant[0], tenant[1]))
                break
    reported: set[tuple[int, int]] = set()
    for i, (a, _, ta, _) in enumerate(candidates):
        for b, path_b, tb, src_b in candidates[i + 1 :]:
            if ta == tb or not may_share_nodes(a, b):
                continue
            key = (id(a), id(b))
            if key in reported:
                continue
            reported.add(key)
            yield Finding.at(
                "tenant-shares-gpu",
                "warning",
                b.manifest,
                f"{path_b}.resources.limits",
                f"{_cap(_describe(b))} (tenant {tb!r}, from {src_b}) and "
                f"{_describe(a)} (tenant {ta!r}) both take partial HAMi slices and nothing "
                "keeps them on different nodes: HAMi may put both on one physical card, and "
                "vGPU slicing is software isolation (shared memory bus, driver, and faults), "
                "not a trust boundary.",
                "Give each tenant its own node pool (distinct nodeSelector / taints), or make "
                "one of them exclusive (gpucores: 100, no gpumem).",
            )
