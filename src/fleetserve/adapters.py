"""LoRA adapters on disk: what an adapter directory says, and which adapters a directory holds.

Design note. An adapter is a PEFT LoRA directory (``adapter_config.json`` + weights), the
format vLLM's ``--lora-modules`` and runtime loading read. fleetserve reads only the JSON
config, never the weights: enough to refuse at spec load what vLLM would refuse later,
deep inside a replica - a rank above ``max_lora_rank`` (vLLM: "LoRA rank ... is greater
than max_lora_rank") or an adapter trained on a different base architecture (vLLM loads
it, or fails on shapes, and serves garbage either way). Discovery from an ``adapter_dir``
is a directory listing: every sub-directory with an ``adapter_config.json`` whose name is
a valid adapter id. Pure functions over paths; no Ray, no vLLM.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The adapter config file of a PEFT adapter directory.
ADAPTER_CONFIG = "adapter_config.json"
#: LoRA ranks vLLM accepts for ``--max-lora-rank`` (vllm.config.lora.MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: An adapter id: an OpenAI model id without ':' (it separates ``base:adapter``) or '/'
#: (an adapter id is also a directory name inside ``adapter_dir``).
ADAPTER_ID = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"
_ADAPTER_ID = re.compile(ADAPTER_ID)
#: config.json keys whose values must agree between an adapter's base and the served model.
_ARCHITECTURE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size")
#: A plain module name (``q_proj``), as vLLM's ``--lora-target-modules`` takes them.
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The tensor file PEFT writes (``adapter_model.bin`` adapters are not shape-checked).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: A safetensors header larger than this is not a LoRA adapter's (or a base shard's) header.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
#: ``<module>.lora_A.weight`` / ``<module>.lora_B.weight`` in a PEFT adapter's tensor names.
_LORA_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")


@dataclass(frozen=True)
class AdapterConfig:
    """What fleetserve reads from ``adapter_config.json``."""

    rank: int
    base: str | None
    target_modules: tuple[str, ...]

    @property
    def plain_targets(self) -> bool:
        """Whether ``target_modules`` is a list of module names (not PEFT's
        ``"all-linear"`` or a regular expression, which only the model can expand)."""
        return bool(self.target_modules) and all(
            _MODULE_NAME.match(t) and t != "all-linear" for t in self.target_modules
        )


def valid_adapter_id(name: str) -> bool:
    """Whether ``name`` can be an adapter id (and so a directory name, never a path)."""
    return len(name) <= 128 and _ADAPTER_ID.match(name) is not None


def outside_targets(adapter: AdapterConfig, allowed: list[str] | None) -> list[str]:
    """The adapter's target modules the replicas do not apply LoRA to (``allowed``:
    ``lora_target_modules``; None allows all). A pattern target cannot be checked here."""
    if allowed is None or not adapter.plain_targets:
        return []
    return [t for t in adapter.target_modules if t not in allowed]


def is_local_source(source: str) -> bool:
    """Whether an adapter ``source`` names a directory rather than a HF repo id.

    Decided by its spelling, not by this machine's disk (render runs where the pods' paths
    do not exist): a HF repo id never starts with '/', '.' or '~'; anything that exists
    here is a directory too.
    """
    return source.startswith(("/", ".", "~")) or Path(source).expanduser().exists()


def read_adapter_config(directory: Path) -> AdapterConfig:
    """The LoRA config of a PEFT adapter directory; ValueError says what is wrong."""
    path = directory / ADAPTER_CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{directory} has no {ADAPTER_CONFIG} (not a PEFT adapter)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    peft_type = str(data.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"{path}: peft_type is {peft_type}; vLLM serves LORA adapters only")
    rank = data.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{path}: 'r' (the LoRA rank) must be a positive integer, got {rank!r}")
    targets = data.get("target_modules") or ()
    base = data.get("base_model_name_or_path")
    return AdapterConfig(
        rank=rank,
        base=str(base) if base else None,
        target_modules=tuple(sorted(targets)) if isinstance(targets, list) else (str(targets),),
    )


def discover(adapter_dir: Path) -> dict[str, Path]:
    """Adapters in ``adapter_dir`` by name (sorted); an unreadable directory holds none."""
    try:
        entries = sorted(adapter_dir.iterdir())
    except OSError:
        return {}
    return {
        e.name: e for e in entries if valid_adapter_id(e.name) and (e / ADAPTER_CONFIG).is_file()
    }


def find_in(adapter_dir: Path, name: str) -> Path | None:
    """The adapter ``name`` inside ``adapter_dir``, or None (never looks outside it)."""
    if not valid_adapter_id(name):
        return None
    path = adapter_dir / name
    return path if (path / ADAPTER_CONFIG).is_file() else None


def base_config(directory: Path) -> dict[str, Any] | None:
    """A model directory's ``config.json`` (text part for multimodal configs), or None."""
    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    return text if isinstance(text, dict) and "hidden_size" in text else data


def architecture_mismatch(adapter: AdapterConfig, served: dict[str, Any]) -> str | None:
    """Why ``adapter`` was not trained for the served model's architecture, or None.

    Known only when the adapter's ``base_model_name_or_path`` is a local model directory;
    otherwise (a hub id, or no base recorded) there is nothing to compare and this says
    nothing.
    """
    if adapter.base is None:
        return None
    trained_on = base_config(Path(adapter.base).expanduser())
    if trained_on is None:
        return None
    for key in _ARCHITECTURE_KEYS:
        a, b = trained_on.get(key), served.get(key)
        if a is not None and b is not None and a != b:
            return f"it was trained on {adapter.base} ({key} {a}), the served model has {key} {b}"
    return None


#: Tensor name (from ``layers.`` on) -> shape: what a weights file says without its data.
Shapes = dict[str, tuple[int, ...]]


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors file's header (the data is never read)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (header of {size} bytes)")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file")
    return {
        name: tuple(int(d) for d in meta["shape"])
        for name, meta in header.items()
        if isinstance(meta, dict) and isinstance(meta.get("shape"), list)
    }


def _layer_key(name: str) -> str | None:
    """``...layers.3.self_attn.q_proj`` -> ``layers.3.self_attn.q_proj`` (None: no layer).

    Base checkpoints and PEFT adapters prefix module names differently (``model.``,
    ``base_model.model.model.``, ``language_model.``); from ``layers.`` on they agree.
    """
    at = name.find("layers.")
    return name[at:] if at >= 0 else None


def base_weight_shapes(model_dir: Path) -> Shapes | None:
    """Per-layer linear weight shapes of a local HF model directory (None: unknown)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    out: Shapes = {}
    try:
        for file in files:
            for name, shape in safetensors_shapes(file).items():
                key = _layer_key(name)
                if key is not None and key.endswith(".weight") and len(shape) == 2:
                    out[key.removesuffix(".weight")] = shape
    except (OSError, ValueError):
        return None
    return out


def shape_mismatch(adapter_dir: Path, base: Shapes) -> str | None:
    """Why the adapter's LoRA tensors do not fit the served weights, or None.

    ``lora_A`` of a module is ``rank x in`` and ``lora_B`` is ``out x rank`` where the
    base weight is ``out x in``: an adapter trained on another base has other ``in``/
    ``out`` (vLLM would copy it into its preallocated slots and fail or serve garbage),
    and one that targets a module the served model lacks has no base weight at all.
    """
    weights = adapter_dir / ADAPTER_WEIGHTS
    if not weights.is_file():
        return None
    try:
        tensors = safetensors_shapes(weights)
    except (OSError, ValueError, json.JSONDecodeError) as e:
        return f"cannot read {ADAPTER_WEIGHTS}: {e}"
    for name, shape in sorted(tensors.items()):
        match = _LORA_TENSOR.match(name)
        key = _layer_key(match.group("module")) if match else None
        if match is None or key is None or len(shape) != 2:
            continue
        served = base.get(key)
        if served is None:
            return f"it has LoRA weights for {key}, a module the served model does not have"
        out_dim, in_dim = served
        half = match.group("half")
        got, want, what = (shape[1], in_dim, "in") if half == "A" else (shape[0], out_dim, "out")
        if got != want:
            return (
                f"its {key} lora_{half} has {got} {what}-features, the served model's {key} "
                f"has {want}: it was trained on another base model"
            )
    return None


def load_problem(
    adapter_dir: Path,
    *,
    max_lora_rank: int,
    served_config: Mapping[str, Any] | None,
    base_shapes: Shapes | None,
    target_modules: tuple[str, ...] | None = None,
) -> str | None:
    """Why the replica must not load this adapter (a client error at its first request),
    or None. The same checks as spec load, for an adapter that appeared after start, plus
    its tensor shapes against the served weights when those are known."""
    try:
        found = read_adapter_config(adapter_dir)
    except ValueError as e:
        return str(e)
    if found.rank > max_lora_rank:
        return (
            f"its rank {found.rank} is above this model's max_lora_rank ({max_lora_rank}); "
            "raise max_lora_rank in the spec"
        )
    if served_config is not None:
        mismatch = architecture_mismatch(found, dict(served_config))
        if mismatch is not None:
            return mismatch
    outside = outside_targets(found, list(target_modules) if target_modules else None)
    if outside:
        return (
            f"it targets {', '.join(outside)}, but this model's replicas apply LoRA to "
            f"{', '.join(target_modules or ())} only (lora_target_modules)"
        )
    return shape_mismatch(adapter_dir, base_shapes) if base_shapes is not None else None


def refusal(adapter: str, base: str, problem: str) -> str:
    """The client-facing 400 message for an adapter that ``base`` cannot serve."""
    return f"LoRA adapter '{adapter}' cannot be served by model '{base}': {problem}"
