"""Fixtures for bench tests: the fake OpenAI server and a small local tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .fake_openai import FakeOpenAIServer


@pytest.fixture(scope="session")
def fake_server_session() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def fake_server(fake_server_session: FakeOpenAIServer) -> FakeOpenAIServer:
    """The shared fake, reset to default behaviour for each test."""
    fake_server_session.reset()
    return fake_server_session


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained on the bench word list, saved like a model dir.

    Byte-level BPE is what makes decode/encode non-bijective (merges across piece
    boundaries), which the exact-length prompt builder must cope with.
    """
    words = json.loads(files("fleetserve.bench").joinpath("data/words.json").read_text())["words"]
    corpus = [" ".join(words[i : i + 12]) for i in range(0, len(words), 3)] * 4
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(str(path))
    return path
