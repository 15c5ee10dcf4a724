"""Rules: vLLM engine arguments that make the engine refuse to start, whatever the cluster.

Each rule reads every vLLM engine the input runs - Serve replicas of a RayService and plain
``vllm serve`` containers - through :mod:`._engines`, so the value judged is the value every
other rule sees (or, for a value outside vLLM's bounds, the one they were kept from).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fleetserve.errors import FleetServeError
from fleetserve.k8s.doctor.finding import Finding, Located
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import groups
from fleetserve.k8s.doctor.registry import rule
from fleetserve.k8s.doctor.rules._advisories import (
    VLLM_PROMPT_EMBEDS,
    VLLM_PROMPT_EMBEDS_MROPE,
    VLLM_PROMPT_EMBEDS_VALIDATION,
)
from fleetserve.k8s.doctor.rules._devices import lws_worker, pods
from fleetserve.k8s.doctor.rules._engines import (
    container_engine,
    engine_replicas,
    kubeai_engines,
    out_of_bounds,
    production_stack_engines,
    split_rejected,
)
from fleetserve.k8s.doctor.rules._versions import vllm_version
from fleetserve.plan.catalogue import catalogue_entry
from fleetserve.plan.memory import load_model_config

#: vLLM's escape hatch for a context longer than the model's (vllm/envs.py): with it set the
#: engine starts and only warns, so the rule stays silent.
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"

#: What each bounded argument means, for the fix.
_MEANING = {
    "tensor_parallel_size": "the number of GPUs one replica shards each layer over (1 for one GPU)",
    "pipeline_parallel_size": "the number of pipeline stages (1 unless the model is split by "
    "layers across GPUs)",
    "gpu_memory_utilization": "a fraction of the card's memory vLLM may take, e.g. 0.9 (not a "
    "percentage or a count of GiB)",
}


@dataclass(frozen=True)
class _Engine:
    """One vLLM engine as written: who runs it, and its arguments with their field paths."""

    #: The object (or Helm values) that runs it.
    manifest: Located
    #: ``Serve replica 'app/model' of RayService/ns/name`` or ``vLLM container 'c' of ...``.
    who: str
    #: Every argument as written, within vLLM's bounds or not.
    engine: dict[str, Any]
    paths: dict[str, str]
    #: Field path of the engine when an argument's own path is unknown.
    path: str
    #: Literal environment the engine runs with (runtime_env env_vars, container env).
    env: dict[str, str]
    #: Container images it runs in (for the vLLM version), when known.
    images: tuple[str, ...] = ()


def _engines(inv: Inventory) -> Iterator[_Engine]:
    for m in inv.of_kind("RayService"):
        for r in engine_replicas(m):
            written = {**r.engine, **r.rejected}
            who = f"Serve replica {r.name!r} of {m.ref}"
            images = tuple(str(g.container.get("image", "")) for g in groups(m))
            yield _Engine(m, who, written, r.engine_paths, r.path, r.env, images)
    for pod in pods(inv):
        if pod.group is not None:
            continue  # Ray pods run their engines through Serve (above)
        for c, path in pod.containers():
            engine, paths = container_engine(c, path, raw=True)
            if engine:
                who = f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref}"
                env = c.get("env")
                literal = {
                    str(e["name"]): str(e["value"])
                    for e in (env if isinstance(env, list) else [])
                    if isinstance(e, dict) and "name" in e and "value" in e
                }
                image = (str(c.get("image", "")),)
                yield _Engine(pod.manifest, who, engine, paths, path, literal, image)
    for where, found in kubeai_engines(inv):
        who = found.who if isinstance(where, Manifest) else f"{found.who} of {where.file}"
        yield _Engine(where, who, found.engine, found.paths, found.path, found.env)
    for values in inv.charts("vllm-production-stack"):
        for e in production_stack_engines(values.body):
            who = f"{e.who} of {values.file}"
            yield _Engine(values, who, e.engine, e.paths, e.path, e.env)


@rule("engine-arg-invalid", versions={"vllm": "all"})
def engine_arg_invalid(inv: Inventory) -> Iterator[Finding]:
    """tensor/pipeline_parallel_size below 1, gpu_memory_utilization outside (0, 1]."""
    for e in _engines(inv):
        for key, value in sorted(split_rejected(e.engine)[1].items()):
            bound = out_of_bounds(key, value)
            yield Finding.at(
                "engine-arg-invalid",
                "error",
                e.manifest,
                e.paths.get(key, e.path),
                f"{e.who} sets {key} {value:g}, outside vLLM's bound ({key} {bound}): vLLM's "
                "config validation refuses it and the engine never starts.",
                f"Set {key} to {_MEANING[key]}.",
            )


def _model_limit(model: Any) -> tuple[int, str] | None:
    """(the longest max_model_len vLLM derives for ``model``, where it comes from), for
    catalogue models only: a manifest's model path is never opened."""
    if not isinstance(model, str) or catalogue_entry(model) is None:
        return None
    try:
        config = load_model_config(model)
    except FleetServeError:
        return None
    rope = f", RoPE scaling '{config.rope_scaling}' included" if config.rope_scaling else ""
    return config.max_model_len_limit, f"{config.max_len_key} in its config.json{rope}"


@rule("max-model-len-exceeds-model", versions={"vllm": "all"})
def max_model_len_exceeds_model(inv: Inventory) -> Iterator[Finding]:
    """max_model_len above the context the model's config allows: vLLM refuses to start."""
    for e in _engines(inv):
        mml = e.engine.get("max_model_len")
        if not isinstance(mml, int) or mml <= 0:  # -1 is vLLM's "fit to memory"
            continue
        limit = _model_limit(e.engine.get("model"))
        if limit is None or mml <= limit[0]:
            continue
        allowed = e.env.get(ALLOW_LONG_ENV, "").strip().lower()
        if allowed in ("1", "true"):
            continue
        yield Finding.at(
            "max-model-len-exceeds-model",
            "error",
            e.manifest,
            e.paths.get("max_model_len", e.path),
            f"{e.who} sets max_model_len {mml} for {e.engine['model']}, whose longest context "
            f"is {limit[0]} ({limit[1]}, fleetserve's model catalogue): vLLM refuses to start "
            f"('User-specified max_model_len ({mml}) is greater than the derived "
            f"max_model_len') unless {ALLOW_LONG_ENV}=1.",
            f"Set max_model_len to at most {limit[0]} (or leave it unset: vLLM then uses "
            f"{limit[0]}).",
        )


#: The container runtime's /dev/shm when the pod mounts none (containerd, CRI-O, Docker: 64 MiB).
DEFAULT_SHM_MIB = 64


def _shm_volume(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any] | None:
    """The volume mounted at /dev/shm in ``container`` (None when the runtime's 64 MiB stays)."""
    mounts = container.get("volumeMounts")
    name = next(
        (
            m.get("name")
            for m in (mounts if isinstance(mounts, list) else [])
            if isinstance(m, dict) and str(m.get("mountPath", "")).rstrip("/") == "/dev/shm"
        ),
        None,
    )
    if name is None:
        return None
    volumes = pod_spec.get("volumes")
    for v in volumes if isinstance(volumes, list) else []:
        if isinstance(v, dict) and v.get("name") == name:
            return v
    return {}


@rule("shm-too-small", versions={"vllm": "all"})
def shm_too_small(inv: Inventory) -> Iterator[Finding]:
    """A multi-rank vLLM pod without a /dev/shm volume: NCCL and vLLM's workers share memory
    through /dev/shm, and the runtime's 64 MiB is not enough for TP/PP > 1."""
    for pod in pods(inv):
        if pod.group is not None or pod.spec.get("hostIPC") is True:
            continue  # Ray pods: Ray warns itself; hostIPC: the node's /dev/shm is used
        for c, path in pod.containers():
            engine, _ = container_engine(c, path)
            ranks = int(engine.get("tensor_parallel_size", 1)) * int(
                engine.get("pipeline_parallel_size", 1)
            )
            if ranks <= 1:
                continue
            worker = lws_worker(inv, pod)
            if worker is not None and worker is not pod:
                # The group's ranks also run in the worker pods (vLLM over Ray): they need
                # the same shared memory.
                for wc, wpath in worker.containers():
                    gpu = "gpu" in str(wc.get("resources", "")).lower()
                    if gpu and _shm_volume(worker.spec, wc) is None:
                        yield Finding.at(
                            "shm-too-small",
                            "error",
                            pod.manifest,
                            f"{wpath}.volumeMounts",
                            f"Container {wc.get('name', '?')!r} of {pod.manifest.ref}'s worker "
                            f"template hosts ranks of the leader's vLLM ({ranks} tensor/pipeline "
                            f"ranks over {pod.hosts} pods) but mounts nothing at /dev/shm: the "
                            f"runtime's {DEFAULT_SHM_MIB} MiB is too little for NCCL between "
                            "the ranks on that pod, and the engine fails at start-up.",
                            "Mount an in-memory emptyDir at /dev/shm in the worker template "
                            "too (volumes: [{name: dshm, emptyDir: {medium: Memory}}]).",
                        )
                        break
            if _shm_volume(pod.spec, c) is not None:
                continue
            yield Finding.at(
                "shm-too-small",
                "error",
                pod.manifest,
                f"{path}.volumeMounts",
                f"vLLM container {c.get('name', '?')!r} of {pod.manifest.ref} runs "
                f"{ranks} tensor/pipeline ranks but mounts nothing at /dev/shm: the container "
                f"runtime gives {DEFAULT_SHM_MIB} MiB, too little for NCCL's shared-memory "
                "buffers between the ranks, and the engine fails at start-up (NCCL 'unhandled "
                "system error' or a bus error).",
                "Mount an in-memory emptyDir at /dev/shm: volumes: [{name: dshm, emptyDir: "
                "{medium: Memory, sizeLimit: 2Gi}}], volumeMounts: [{name: dshm, mountPath: "
                "/dev/shm}].",
            )


# --------------------------------------------------------------------------- untrusted code

#: A Hugging Face Hub model id (``org/name``): not a local path, not another store's URL.
_HUB_ID = re.compile(r"^(hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: A pinned revision: a full commit SHA (a branch or tag can be moved by the repository).
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@rule("trust-remote-code-hub", versions={"vllm": "all"})
def trust_remote_code_hub(inv: Inventory) -> Iterator[Finding]:
    """trust_remote_code with a model fetched from a public hub at an unpinned revision."""
    for e in _engines(inv):
        model = e.engine.get("model")
        if e.engine.get("trust_remote_code") is not True or not isinstance(model, str):
            continue
        if not _HUB_ID.match(model) or _COMMIT.match(str(e.engine.get("revision", ""))):
            continue
        org = model.removeprefix("hf://").split("/", 1)[0]
        yield Finding.at(
            "trust-remote-code-hub",
            "warning",
            e.manifest,
            e.paths.get("trust_remote_code", e.path),
            f"{e.who} sets trust_remote_code for {model}, fetched from the Hugging Face Hub "
            "at no pinned revision: vLLM imports the repository's own Python files "
            "(config.json auto_map) in the pod at start-up, so whoever can push to "
            f"{org!r} runs code there with the pod's credentials (HF token, service account).",
            "Drop trust_remote_code when vLLM supports the architecture natively; otherwise pin "
            "--revision to a reviewed commit SHA, or serve a reviewed copy from your own storage.",
        )


#: The advisories of --enable-prompt-embeds, oldest first (GHSA-mrw7-hf4f-83pf: 0.10.2 up to
#: 0.11.1; its follow-up GHSA-mcmc-2m55-j8jj: with the flag on, up to 0.13.0; the M-RoPE
#: crash GHSA-33cg-gxv8-3p8g: 0.12.0 up to 0.24.0). The first two corrupt memory (an error),
#: the last crashes the engine on one model family (said, as the documented crash is).
PROMPT_EMBEDS_ADVISORIES = (
    VLLM_PROMPT_EMBEDS,
    VLLM_PROMPT_EMBEDS_VALIDATION,
    VLLM_PROMPT_EMBEDS_MROPE,
)
#: The first release where an enabled flag corrupts no memory (the sparse-tensor checks).
PROMPT_EMBEDS_SAFE_FROM = VLLM_PROMPT_EMBEDS_VALIDATION.fixed_in


@rule("prompt-embeds-enabled", versions={"vllm": "all"})
def prompt_embeds_enabled(inv: Inventory) -> Iterator[Finding]:
    """--enable-prompt-embeds lets any client send tensors the engine deserialises."""
    for e in _engines(inv):
        if e.engine.get("enable_prompt_embeds") is not True:
            continue
        v = vllm_version(list(e.images))
        hits = [a for a in PROMPT_EMBEDS_ADVISORIES if a.affects(v)]
        corrupting = [a for a in hits if a is not VLLM_PROMPT_EMBEDS_MROPE]
        if v is not None and hits:
            what = f"{v.describe()} is affected by " + "; and by ".join(a.cite() for a in hits)
        elif v is not None:
            what = (
                f"{v.describe()} validates the tensors, but vLLM's own documentation says to "
                "enable the flag only for trusted users"
            )
        else:
            what = (
                "the image names no vLLM release, so the advisories cannot be ruled out: "
                + "; ".join(a.cite() for a in PROMPT_EMBEDS_ADVISORIES)
            )
        yield Finding.at(
            "prompt-embeds-enabled",
            "error" if corrupting else "warning",
            e.manifest,
            e.paths.get("enable_prompt_embeds", e.path),
            f"{e.who} enables prompt_embeds inputs: every client of the API can send raw "
            f"embedding tensors the engine deserialises with torch.load, and {what}.",
            "Remove --enable-prompt-embeds unless only trusted clients reach the engine; "
            f"if it must stay, run vLLM {VLLM_PROMPT_EMBEDS_MROPE.fixed_in} or newer (no "
            f"advisory open; memory-safe from {PROMPT_EMBEDS_SAFE_FROM}).",
        )
