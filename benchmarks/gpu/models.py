"""Weight-free Gemma 3 model directories for the GPU runs: config.json + the tokenizer.

Each size's config is the published Gemma 3 text config (the dimensions fleetserve's
catalogue records, ``fleetserve.plan.catalogue``: 270M and 1B are text-only, 4B/12B/27B
are the text model of the multimodal checkpoints) written in the format of the default
model's own config.json (transformers 5: ``layer_types``, per-type ``rope_parameters``,
with the 4B+ models' linear RoPE scaling of 8 on the global layers). The tokenizer is the
default model's, which every Gemma 3 size shares (4B+ add image tokens to the vocabulary,
which text requests never produce). vLLM serves them with ``load_format: dummy``: random
weights of the real shapes, so speed and memory are the real model's.

    .venv/bin/python benchmarks/gpu/models.py OUTDIR [--sizes 270m 1b 4b 12b 27b]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from fleetserve.modelstore.store import ModelStore
from fleetserve.plan.catalogue import MODEL_CATALOGUE
from fleetserve.spec import DEFAULT_MODEL_SOURCE

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
#: The text-config keys a size overrides in the default model's config.json.
DIMENSIONS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "query_pre_attn_scalar",
    "sliding_window",
    "max_position_embeddings",
)
#: Gemma 3 4B/12B/27B scale the global layers' RoPE linearly by 8 (128k context).
LONG_CONTEXT_ROPE = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}


def text_config(size: str) -> dict[str, Any]:
    entry = MODEL_CATALOGUE[f"gemma-3-{size}"]
    return dict(entry.get("text_config", entry))


def write_model(base: Path, out: Path, size: str) -> Path:
    config = json.loads((base / "config.json").read_text())
    facts = text_config(size)
    for key in DIMENSIONS:
        config[key] = facts[key]
    pattern = int(facts.get("sliding_window_pattern", 6))
    config["layer_types"] = [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(config["num_hidden_layers"])
    ]
    if config["max_position_embeddings"] > 32768:
        config["rope_parameters"] = {
            **config["rope_parameters"],
            "full_attention": dict(LONG_CONTEXT_ROPE),
        }
    config["_model_name_or_path"] = f"google/gemma-3-{size}"
    target = out / f"gemma-3-{size}"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        if (base / name).exists():
            shutil.copy2(base / name, target / name)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sizes", nargs="+", default=["270m", "1b", "4b", "12b", "27b"])
    args = parser.parse_args()
    base = Path(ModelStore().resolve(DEFAULT_MODEL_SOURCE))
    for size in args.sizes:
        print(write_model(base, args.out, size))


if __name__ == "__main__":
    main()
