"""vLLM's internal listeners: the ports a vLLM pod opens besides its OpenAI API.

Design note: beyond the API port, a vLLM server that spans pods listens for its peers -
KV-cache transfer between prefill and decode pods (``--kv-transfer-config``), data
parallelism across pods (``--data-parallel-address`` / ``--headless``), multi-node
multiprocessing (``--nnodes``), and, in a LeaderWorkerSet whose leader starts Ray, Ray's GCS.
None of them authenticates its callers (vLLM's security guide: "inter-node traffic is
unauthenticated and unencrypted"), and several unpickled what they received (the ShadowMQ
advisories, :mod:`._advisories`). Each channel is read from the container's own command line
and literal env, with vLLM's default port when the flag is absent (vllm/config/parallel.py,
vllm/config/kv_transfer.py, vllm/envs.py of the vLLM release fleetserve pins); a channel is
only reported when the command line turns the feature on, never assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleetserve.k8s.doctor.rules._advisories import (
    RAY_SHADOWRAY,
    VLLM_MOONCAKE_PICKLE,
    VLLM_MULTINODE_PICKLE,
    VLLM_MULTINODE_XPUB,
    VLLM_PYNCCL_PICKLE,
    Advisory,
)
from fleetserve.k8s.doctor.rules._devices import PodView
from fleetserve.k8s.doctor.rules._engines import container_words, runs_vllm

#: vLLM's defaults (KVTransferConfig.kv_port, ParallelConfig.data_parallel_rpc_port and
#: master_port, envs VLLM_NIXL_SIDE_CHANNEL_PORT / VLLM_MOONCAKE_BOOTSTRAP_PORT).
KV_PORT_DEFAULT = 14579
DP_RPC_PORT_DEFAULT = 29550
MASTER_PORT_DEFAULT = 29501
NIXL_SIDE_CHANNEL_DEFAULT = 5600
MOONCAKE_BOOTSTRAP_DEFAULT = 8998
#: Ray's GCS port on a head started with ``ray start --head`` (Ray's default).
RAY_GCS_PORT = 6379


@dataclass(frozen=True)
class Channel:
    """One internal listener of a vLLM container."""

    port: int
    #: ``the PyNcclPipe KV-transfer port (kv_port)`` for messages.
    what: str
    #: Field path of the setting that opens it (the container when it is a default).
    path: str
    #: Advisories about this channel (judged against the release by the rule).
    advisories: tuple[Advisory, ...] = ()


def _flag(words: list[tuple[str, str]], name: str) -> tuple[str, str] | None:
    """(value, field path) of ``--name value`` / ``--name=value`` (``_`` spelt as ``-`` too)."""
    for n, (word, path) in enumerate(words):
        flag, eq, value = word.partition("=")
        if not flag.startswith("--") or "--" + flag[2:].replace("_", "-") != name:
            continue
        if eq:
            return value, path
        if n + 1 < len(words) and not words[n + 1][0].startswith("--"):
            return words[n + 1]
        return "", path
    return None


def _int(text: str | None, default: int) -> int:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return default


def _env(container: dict[str, Any], path: str) -> dict[str, tuple[str, str]]:
    env = container.get("env")
    return {
        str(e["name"]): (str(e["value"]), f"{path}.env[{i}].value")
        for i, e in enumerate(env if isinstance(env, list) else [])
        if isinstance(e, dict) and "name" in e and "value" in e
    }


def _env_port(
    env: dict[str, tuple[str, str]], name: str, default: int, path: str
) -> tuple[int, str]:
    if name in env:
        return _int(env[name][0], default), env[name][1]
    return default, path


def _kv_channels(
    words: list[tuple[str, str]], env: dict[str, tuple[str, str]], path: str
) -> list[Channel]:
    found = _flag(words, "--kv-transfer-config")
    if found is None:
        return []
    text, where = found
    try:
        cfg = json.loads(text)
    except ValueError:
        return []
    if not isinstance(cfg, dict):
        return []
    connector = str(cfg.get("kv_connector", ""))
    kv_port = _int(cfg.get("kv_port"), KV_PORT_DEFAULT)
    low = connector.lower()
    if "pynccl" in low:
        return [
            Channel(
                kv_port, f"the {connector} KV-transfer port (kv_port)", where, (VLLM_PYNCCL_PICKLE,)
            )
        ]
    if "mooncake" in low:
        port, at = _env_port(env, "VLLM_MOONCAKE_BOOTSTRAP_PORT", MOONCAKE_BOOTSTRAP_DEFAULT, where)
        return [
            Channel(
                kv_port,
                f"the {connector} KV-transfer port (kv_port)",
                where,
                (VLLM_MOONCAKE_PICKLE,),
            ),
            Channel(
                port,
                f"the {connector} bootstrap port (VLLM_MOONCAKE_BOOTSTRAP_PORT)",
                at,
                (VLLM_MOONCAKE_PICKLE,),
            ),
        ]
    if "nixl" in low:
        port, at = _env_port(env, "VLLM_NIXL_SIDE_CHANNEL_PORT", NIXL_SIDE_CHANNEL_DEFAULT, where)
        return [Channel(port, f"the {connector} side channel (VLLM_NIXL_SIDE_CHANNEL_PORT)", at)]
    if "p2pnccl" in low:
        return [Channel(kv_port, f"the {connector} KV-transfer port (kv_port)", where)]
    return []  # LMCache, shared storage, offloading: no peer listener of vLLM's own


def _dp_channels(words: list[tuple[str, str]], path: str) -> list[Channel]:
    spans = any(
        _flag(words, name) is not None
        for name in ("--data-parallel-address", "--data-parallel-start-rank", "--headless")
    )
    size = _flag(words, "--data-parallel-size")
    local = _flag(words, "--data-parallel-size-local")
    if size is not None and local is not None and _int(local[0], 0) < _int(size[0], 0):
        spans = True
    if not spans:
        return []
    rpc = _flag(words, "--data-parallel-rpc-port")
    port = _int(rpc[0], DP_RPC_PORT_DEFAULT) if rpc else DP_RPC_PORT_DEFAULT
    return [
        Channel(
            port, "the data-parallel RPC port (--data-parallel-rpc-port)", rpc[1] if rpc else path
        )
    ]


def _multinode_channels(words: list[tuple[str, str]], pod: PodView, path: str) -> list[Channel]:
    out: list[Channel] = []
    nnodes = _flag(words, "--nnodes")
    if nnodes is not None and _int(nnodes[0], 1) > 1:
        master = _flag(words, "--master-port")
        out.append(
            Channel(
                _int(master[0], MASTER_PORT_DEFAULT) if master else MASTER_PORT_DEFAULT,
                "the multi-node torch.distributed master port (--master-port)",
                master[1] if master else nnodes[1],
                (VLLM_MULTINODE_PICKLE, VLLM_MULTINODE_XPUB),
            )
        )
    if pod.hosts > 1:
        # A LeaderWorkerSet leader joins its group with Ray (KubeRay's and vLLM's
        # multi-node-serving.sh: ``ray start --head``): the GCS takes every peer's jobs.
        out.append(
            Channel(
                RAY_GCS_PORT,
                "Ray's GCS, which the group's Ray cluster runs on the leader",
                path,
                (RAY_SHADOWRAY, VLLM_MULTINODE_PICKLE, VLLM_MULTINODE_XPUB),
            )
        )
    return out


def vllm_channels(pod: PodView) -> list[tuple[dict[str, Any], str, list[Channel]]]:
    """(container, field path, its internal listeners) for each vLLM container of ``pod``
    that has any."""
    out: list[tuple[dict[str, Any], str, list[Channel]]] = []
    for c, path in pod.containers():
        words = container_words(c, path)
        if not runs_vllm(c, words):
            continue
        env = _env(c, path)
        found = (
            _kv_channels(words, env, path)
            + _dp_channels(words, path)
            + _multinode_channels(words, pod, path)
        )
        if found:
            out.append((c, path, found))
    return out
