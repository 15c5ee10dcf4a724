"""Workloads: repeatable streams, exact token lengths with a tokenizer, file errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.tokenizer import HfTokenizer
from fleetserve.bench.workload import (
    PromptFileWorkload,
    SharedPrefixWorkload,
    ShareGptWorkload,
    SyntheticWorkload,
)
from fleetserve.errors import InputFileError

L = LengthDistribution.parse


def take(workload: object, n: int, seed: int = 0) -> list:  # type: ignore[type-arg]
    return list(itertools.islice(workload.requests(seed), n))  # type: ignore[attr-defined]


def test_synthetic_with_tokenizer_has_exact_lengths(tokenizer_dir: Path) -> None:
    tok = HfTokenizer(tokenizer_dir)
    w = SyntheticWorkload(L("uniform:5-60"), L("16"), tok)
    assert w.exact_lengths
    reqs = take(w, 40)
    for r in reqs:
        assert len(tok.encode(r.prompt)) == r.prompt_tokens
        assert 5 <= r.prompt_tokens <= 60
        assert r.max_tokens == 16
    assert take(w, 40) == reqs  # same seed, same stream
    assert take(w, 5, seed=1) != reqs[:5]


def test_synthetic_without_tokenizer_uses_words() -> None:
    w = SyntheticWorkload(L("50"), L("normal:20,5"), None)
    assert not w.exact_lengths
    r = take(w, 1)[0]
    assert len(r.prompt.split()) == 50
    assert r.prompt_tokens == 50


def test_shared_prefix_groups_share_their_system_prompt(tokenizer_dir: Path) -> None:
    w = SharedPrefixWorkload(3, 40, L("8"), L("4"), HfTokenizer(tokenizer_dir))
    reqs = take(w, 60)
    by_group: dict[int, set[str]] = {}
    for r in reqs:
        assert r.group is not None
        by_group.setdefault(r.group, set()).add(r.system or "")
    assert sorted(by_group) == [0, 1, 2]
    assert all(len(s) == 1 for s in by_group.values())
    assert len({next(iter(s)) for s in by_group.values()}) == 3
    assert len({r.prompt for r in reqs}) == 60  # suffixes differ


def test_prompt_file(tmp_path: Path) -> None:
    f = tmp_path / "prompts.txt"
    f.write_text("first prompt\n\n  second prompt  \nthird\n", encoding="utf-8")
    w = PromptFileWorkload(f, L("8"))
    assert w.size == 3
    assert [r.prompt for r in take(w, 4)] == [
        "first prompt",
        "second prompt",
        "third",
        "first prompt",
    ]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read"),
        (b"\n  \n", "no prompts"),
        (b"ok\n\xff\xfe\n", r"prompts.txt:2: not UTF-8"),
    ],
)
def test_prompt_file_errors(tmp_path: Path, content: bytes | None, match: str) -> None:
    f = tmp_path / "prompts.txt"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(InputFileError, match=match):
        PromptFileWorkload(f, L("8"))


def test_sharegpt(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [
                {"from": "human", "value": "Tell me a story"},
                {"from": "gpt", "value": "Once upon a time there was"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello there"},
            ]
        },
        {"conversations": [{"from": "human", "value": "no reply"}]},
        "garbage",
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data), encoding="utf-8")
    w = ShareGptWorkload(f, None, None)
    assert w.size == 2
    reqs = take(w, 2)
    assert {r.prompt for r in reqs} == {"Tell me a story", "Hi"}
    fixed = ShareGptWorkload(f, None, L("7"))
    assert all(r.max_tokens == 7 for r in take(fixed, 4))


def test_sharegpt_errors_name_file_and_position(tmp_path: Path) -> None:
    f = tmp_path / "sg.json"
    f.write_text('[\n {"conversations": [}\n]', encoding="utf-8")
    with pytest.raises(InputFileError, match=r"sg.json:2:\d+"):
        ShareGptWorkload(f, None, None)
    f.write_text("[]", encoding="utf-8")
    with pytest.raises(InputFileError, match="no usable conversation"):
        ShareGptWorkload(f, None, None)


def test_tokenizer_dir_must_hold_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no tokenizer files"):
        HfTokenizer(tmp_path)
