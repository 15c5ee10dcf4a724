"""LoRA adapters: spec checks, engine flags, and the ingress's routing and tenancy of adapter ids.

The engines are fake (in-process, no Ray); they know adapters as vLLM does (static ones,
and ``adapter_dir`` ones found on their first request) and answer an unknown one 404.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.engine.config import EngineConfig
from fleetserve.engine.fake_engine import FakeEngine
from fleetserve.engine.settings import EngineSettings
from fleetserve.errors import SpecError
from fleetserve.serve.guard.api_keys import ApiKeyTable
from fleetserve.serve.ingress.adapters import AdapterTable, splice_model
from fleetserve.serve.ingress.gateway import Gateway, ModelRoute, create_api
from fleetserve.serve.ingress.model_client import LocalModelClient
from fleetserve.spec import parse_spec

SETTINGS = EngineSettings(
    gpu_memory_utilization=0.1, max_num_seqs=8, max_model_len=64, max_num_batched_tokens=64
)


def make_adapter(
    where: Path,
    rank: int = 8,
    base: str | None = None,
    peft_type: str = "LORA",
    targets: list[str] | str | None = None,
) -> Path:
    where.mkdir(parents=True)
    config: dict[str, Any] = {
        "peft_type": peft_type,
        "r": rank,
        "target_modules": ["q_proj", "v_proj"] if targets is None else targets,
    }
    if base is not None:
        config["base_model_name_or_path"] = base
    (where / "adapter_config.json").write_text(json.dumps(config))
    return where


def make_base(where: Path, hidden: int) -> Path:
    where.mkdir(parents=True)
    (where / "config.json").write_text(
        json.dumps({"model_type": "gemma3_text", "hidden_size": hidden})
    )
    return where


# --------------------------------------------------------------------------- spec


def test_adapter_rank_above_max_lora_rank_is_refused_naming_the_field(tmp_path: Path) -> None:
    src = make_adapter(tmp_path / "big", rank=32)
    spec: dict[str, Any] = {
        "models": [{"name": "m", "source": "x", "adapters": [{"name": "big", "source": str(src)}]}]
    }
    with pytest.raises(
        SpecError,
        match=r"models\[0\].*adapters\[0\] \('big'\) has rank 32 > max_lora_rank \(16\); "
        r"raise max_lora_rank to 32",
    ):
        parse_spec(spec)
    spec["models"][0]["max_lora_rank"] = 32
    assert parse_spec(spec).models[0].adapters[0].name == "big"


def test_adapter_of_another_architecture_is_refused(tmp_path: Path) -> None:
    served = make_base(tmp_path / "served", hidden=640)
    other = make_base(tmp_path / "other", hidden=2048)
    src = make_adapter(tmp_path / "a", base=str(other))
    spec: dict[str, Any] = {
        "models": [
            {"name": "m", "source": str(served), "adapters": [{"name": "a", "source": str(src)}]}
        ]
    }
    with pytest.raises(
        SpecError,
        match=r"adapters\[0\] \('a'\) does not fit model 'm'.*hidden_size 2048.*hidden_size 640",
    ):
        parse_spec(spec)
    ok = make_adapter(tmp_path / "b", base=str(make_base(tmp_path / "same", hidden=640)))
    spec["models"][0]["adapters"] = [{"name": "b", "source": str(ok)}]
    parse_spec(spec)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {"adapters": [{"name": "a", "source": "org/a"}, {"name": "a", "source": "org/b"}]},
            "adapters: name 'a' appears twice",
        ),
        (
            {"adapters": [{"name": "m", "source": "org/a"}]},
            r"models\[0\].adapters\[0\]: id 'm' is also model 'm'",
        ),
        (
            {"adapters": [{"name": "a:b", "source": "org/a"}]},
            r"models\[0\].adapters\[0\].name: String should match",
        ),
        ({"max_loras": 4, "max_cpu_loras": 2}, r"max_cpu_loras \(2\) < max_loras \(4\)"),
        ({"max_lora_rank": 12}, r"models\[0\].max_lora_rank"),
        ({"engine_args": {"max_loras": 2}}, "duplicates the model field 'max_loras'"),
        (
            {"adapters": [{"name": "a", "source": "org/a", "tenant": "nobody"}]},
            r"adapters\[0\] \('a'\) names tenant 'nobody'",
        ),
        (
            {"tenant": "t1", "adapters": [{"name": "a", "source": "org/a", "tenant": "t2"}]},
            "needs an untagged \\(shared\\) base model",
        ),
    ],
)
def test_bad_adapter_specs_name_the_field(model: dict[str, object], message: str) -> None:
    spec = {
        "models": [{"name": "m", "source": "x", **model}],
        "tenants": [{"name": "t1"}, {"name": "t2"}],
    }
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_adapter_ids_are_unique_across_models_and_base_colon_adapter_forms() -> None:
    spec = {
        "models": [
            {"name": "m", "source": "x", "adapters": [{"name": "a", "source": "org/a"}]},
            {"name": "m:a", "source": "x"},
        ]
    }
    with pytest.raises(SpecError, match="id 'm:a' is also model 'm:a'"):
        parse_spec(spec)
    spec["models"][1] = {"name": "n", "source": "x", "adapters": [{"name": "a", "source": "org/a"}]}
    with pytest.raises(
        SpecError, match=r"models\[1\].adapters\[0\]: id 'a' is also adapter 'a' of models\[0\]"
    ):
        parse_spec(spec)


def test_relative_adapter_paths_are_read_beside_the_spec(tmp_path: Path) -> None:
    make_adapter(tmp_path / "adapters" / "a")
    spec = {
        "models": [
            {
                "name": "m",
                "source": "x",
                "adapter_dir": "adapters",
                "adapters": [{"name": "a", "source": "adapters/a"}],
            }
        ]
    }
    model = parse_spec(spec, base_dir=tmp_path).models[0]
    assert model.adapter_dir == str((tmp_path / "adapters").resolve())
    assert model.adapters[0].source == str((tmp_path / "adapters" / "a").resolve())


# --------------------------------------------------------------------------- engine flags


def test_engine_gets_vllms_lora_flags_and_modules() -> None:
    from fleetserve.engine.vllm_engine import parse_vllm_args  # noqa: PLC0415 - imports vLLM

    model = parse_spec(
        {
            "models": [
                {
                    "name": "m",
                    "source": "x",
                    "max_loras": 2,
                    "max_lora_rank": 32,
                    "max_cpu_loras": 4,
                    "adapters": [{"name": "a", "source": "org/a"}],
                }
            ]
        }
    ).models[0]
    config = EngineConfig.from_spec(model, model_path="/w", settings=SETTINGS)
    args = parse_vllm_args(config)
    assert (args.enable_lora, args.max_loras, args.max_lora_rank, args.max_cpu_loras) == (
        True,
        2,
        32,
        4,
    )
    [module] = args.lora_modules
    assert (module.name, module.path, module.base_model_name) == ("a", "org/a", "m")
    plain = EngineConfig.from_spec(
        parse_spec({"models": [{"name": "m", "source": "x"}]}).models[0],
        model_path="/w",
        settings=SETTINGS,
    )
    assert "--enable-lora" not in plain.vllm_cli_args()


def _model(**fields: Any) -> Any:
    return parse_spec({"models": [{"name": "m", "source": "x", **fields}]}).models[0]


def test_lora_target_modules_default_to_what_the_adapters_target(tmp_path: Path) -> None:
    qv = make_adapter(tmp_path / "qv")
    qk = make_adapter(tmp_path / "qk", targets=["q_proj", "k_proj"])
    listed = [{"name": "a", "source": str(qv)}, {"name": "b", "source": str(qk)}]
    model = _model(adapters=listed)
    assert model.lora_targets == ("k_proj", "q_proj", "v_proj")
    config = EngineConfig.from_spec(model, model_path="/w", settings=SETTINGS)
    args = config.vllm_cli_args()
    at = args.index("--lora-target-modules")
    assert args[at + 1 : at + 4] == ["k_proj", "q_proj", "v_proj"]
    # unknown now: an adapter_dir can add any adapter later, a hub adapter's config is remote,
    # PEFT's "all-linear" (or a regex) names no modules
    everything = make_adapter(tmp_path / "all", targets="all-linear")
    for unknown in (
        _model(adapters=listed, adapter_dir=str(tmp_path)),
        _model(adapters=[*listed, {"name": "h", "source": "org/h"}]),
        _model(adapters=[{"name": "e", "source": str(everything)}]),
    ):
        assert unknown.lora_targets is None
        plain = EngineConfig.from_spec(unknown, model_path="/w", settings=SETTINGS)
        assert "--lora-target-modules" not in plain.vllm_cli_args()
    # the operator's list wins
    chosen = _model(adapter_dir=str(tmp_path), lora_target_modules=["q_proj", "v_proj"])
    assert chosen.lora_targets == ("q_proj", "v_proj")


def test_an_adapter_outside_lora_target_modules_is_refused(tmp_path: Path) -> None:
    qv = make_adapter(tmp_path / "qv")
    with pytest.raises(
        SpecError,
        match=r"adapters\[0\] \('a'\) targets v_proj, not in lora_target_modules \(q_proj\)",
    ):
        _model(adapters=[{"name": "a", "source": str(qv)}], lora_target_modules=["q_proj"])
    with pytest.raises(SpecError, match="duplicates the model field 'lora_target_modules'"):
        _model(engine_args={"lora_target_modules": ["q_proj"]})


async def test_a_hot_added_adapter_outside_lora_target_modules_is_a_400(tmp_path: Path) -> None:
    adapter_dir = tmp_path / "dir"
    make_adapter(adapter_dir / "q-only", targets=["q_proj"])
    make_adapter(adapter_dir / "qv")
    model = _model(adapter_dir=str(adapter_dir), lora_target_modules=["q_proj"])
    engine = FakeEngine(
        EngineConfig.from_spec(model, model_path="fake", settings=SETTINGS, kind="fake")
    )
    await engine.start()
    gw = Gateway(
        [ModelRoute("m", 64, adapter_dir=str(adapter_dir))],
        ApiKeyTable(model_tenants={"m": None}),
        LocalModelClient({"m": engine}),
    )
    async with client(gw, "") as c:
        assert (await c.post("/v1/chat/completions", json=chat("q-only"))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat("qv"))
        assert r.status_code == 400
        assert (
            "it targets v_proj, but this model's replicas apply LoRA to q_proj only"
            in (r.json()["error"]["message"])
        )


# --------------------------------------------------------------------------- routing


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    d = tmp_path / "dir"
    make_adapter(d / "found")
    return d


async def lora_gateway(adapter_dir: Path, tmp_path: Path) -> Gateway:
    static = make_adapter(tmp_path / "static-a")
    fleet = parse_spec(
        {
            "models": [
                {
                    "name": "base",
                    "source": "fake",
                    "adapter_dir": str(adapter_dir),
                    "adapters": [
                        {"name": "ad-a", "source": str(static)},
                        {"name": "ad-b", "source": "org/ad-b", "tenant": "team-b"},
                    ],
                },
                {"name": "other", "source": "fake", "tenant": "team-b"},
            ],
            "tenants": [
                {"name": "team-a", "api_keys": ["${KEY_A}"]},
                {"name": "team-b", "api_keys": ["${KEY_B}"]},
            ],
        }
    )
    engines = {}
    for m in fleet.models:
        engine = FakeEngine(
            EngineConfig.from_spec(m, model_path="fake", settings=SETTINGS, kind="fake")
        )
        await engine.start()
        engines[m.name] = engine
    routes = [
        ModelRoute(
            m.name,
            SETTINGS.max_model_len,
            adapters=tuple(a.name for a in m.adapters),
            adapter_dir=m.adapter_dir,
        )
        for m in fleet.models
    ]
    keys = ApiKeyTable.from_spec(fleet, {"KEY_A": "sk-a", "KEY_B": "sk-b"})
    return Gateway(routes, keys, LocalModelClient(engines))


def client(gateway: Gateway, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_api(gateway)),
        base_url="http://test",
        headers={"authorization": f"Bearer {key}"},
    )


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_models_lists_adapters_with_their_parent_per_tenant(
    adapter_dir: Path, tmp_path: Path
) -> None:
    gw = await lora_gateway(adapter_dir, tmp_path)
    async with client(gw, "sk-a") as c:
        cards = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
        assert set(cards) == {"base", "ad-a", "found"}
        assert cards["ad-a"]["parent"] == "base"
        assert cards["found"]["parent"] == "base"
        assert cards["base"]["parent"] is None
        assert (await c.get("/v1/models/ad-a")).json()["parent"] == "base"
    async with client(gw, "sk-b") as c:
        ids = {m["id"] for m in (await c.get("/v1/models")).json()["data"]}
        assert ids == {"base", "ad-a", "ad-b", "found", "other"}


async def test_adapter_is_called_by_its_id_and_as_base_colon_adapter(
    adapter_dir: Path, tmp_path: Path
) -> None:
    gw = await lora_gateway(adapter_dir, tmp_path)
    async with client(gw, "sk-a") as c:
        for asked, served in [
            ("ad-a", "ad-a"),
            ("base:ad-a", "ad-a"),
            ("found", "found"),
            ("base:found", "found"),
            ("base", "base"),
        ]:
            r = await c.post("/v1/chat/completions", json=chat(asked))
            assert r.status_code == 200, (asked, r.text)
            assert r.json()["model"] == served  # the engine saw the bare adapter id


async def test_an_adapter_added_to_adapter_dir_is_servable_without_restart(
    adapter_dir: Path, tmp_path: Path
) -> None:
    gw = await lora_gateway(adapter_dir, tmp_path)
    async with client(gw, "sk-a") as c:
        r = await c.post("/v1/chat/completions", json=chat("late"))
        assert r.status_code == 404
        make_adapter(adapter_dir / "late")
        r = await c.post("/v1/chat/completions", json=chat("late"))
        assert r.status_code == 200
        assert r.json()["model"] == "late"
        assert "late" in {m["id"] for m in (await c.get("/v1/models")).json()["data"]}


async def test_another_tenants_adapter_is_indistinguishable_from_an_unknown_one(
    adapter_dir: Path, tmp_path: Path
) -> None:
    gw = await lora_gateway(adapter_dir, tmp_path)
    async with client(gw, "sk-a") as c:
        hidden = await c.post("/v1/chat/completions", json=chat("ad-b"))
        unknown = await c.post("/v1/chat/completions", json=chat("ad-zz"))
        assert hidden.status_code == unknown.status_code == 404
        assert hidden.json()["error"]["message"].replace("ad-b", "X") == unknown.json()["error"][
            "message"
        ].replace("ad-zz", "X")
        assert (await c.get("/v1/models/ad-b")).status_code == 404
        assert (await c.post("/v1/chat/completions", json=chat("base:ad-b"))).status_code == 404
    async with client(gw, "sk-b") as c:
        r = await c.post("/v1/chat/completions", json=chat("base:ad-b"))
        assert r.status_code == 200
        assert r.json()["model"] == "ad-b"


async def test_adapter_under_the_wrong_base_or_unknown_is_404(
    adapter_dir: Path, tmp_path: Path
) -> None:
    gw = await lora_gateway(adapter_dir, tmp_path)
    async with client(gw, "sk-b") as c:
        for asked in ["other:ad-a", "base:nope", "nope", "base:../dir/found", "../found"]:
            r = await c.post("/v1/chat/completions", json=chat(asked))
            assert r.status_code == 404, asked
            assert r.json()["error"]["type"] == "NotFoundError"


async def test_fake_engine_refuses_an_unknown_adapter_like_vllm(tmp_path: Path) -> None:
    model = parse_spec(
        {"models": [{"name": "m", "source": "x", "adapters": [{"name": "a", "source": "org/a"}]}]}
    ).models[0]
    engine = FakeEngine(
        EngineConfig.from_spec(model, model_path="fake", settings=SETTINGS, kind="fake")
    )
    await engine.start()
    gw = Gateway(
        [ModelRoute("m", 64)],
        ApiKeyTable(model_tenants={"m": None, "a": None, "b": None}),
        LocalModelClient({"m": engine}),
    )
    # the ingress believes in 'b'; the engine does not
    gw.adapters = AdapterTable({"a": "m", "b": "m"}, {})
    async with client(gw, "") as c:
        assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat("b"))
        assert r.status_code == 404
        assert r.json()["error"] == {
            "message": "The model `b` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }


# --------------------------------------------------------------------------- body splice


def test_splice_replaces_only_the_model_token() -> None:
    body = (
        b'{"messages":[{"role":"user","content":"say \\"model\\": \\"m:a\\""}],'
        b'  "model" :  "m:a","n":1.50}'
    )
    out = splice_model(body, json.loads(body), "a")
    assert out == body.replace(b'"model" :  "m:a"', b'"model" :  "a"')
    assert json.loads(out)["model"] == "a"


def test_splice_re_encodes_when_the_token_is_ambiguous() -> None:
    body = b'{"model":"m:a","tools":[{"function":{"parameters":{"model":"m:a"}}}]}'
    out = json.loads(splice_model(body, json.loads(body), "a"))
    assert out["model"] == "a"
    assert out["tools"][0]["function"]["parameters"]["model"] == "m:a"


# --------------------------------------------------------------------------- hot-add misfits


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A real safetensors file (zero data) with these tensor shapes."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))


def lora_tensors(hidden: int, q_out: int, v_out: int, rank: int = 8) -> dict[str, list[int]]:
    prefix = "base_model.model.model.layers.0.self_attn"
    return {
        f"{prefix}.q_proj.lora_A.weight": [rank, hidden],
        f"{prefix}.q_proj.lora_B.weight": [q_out, rank],
        f"{prefix}.v_proj.lora_A.weight": [rank, hidden],
        f"{prefix}.v_proj.lora_B.weight": [v_out, rank],
    }


@pytest.fixture
def misfits(tmp_path: Path) -> tuple[Path, Path]:
    """A base model directory (hidden 64) and an adapter_dir with one fitting adapter and
    one of each misfit an operator can drop in after start."""
    base = make_base(tmp_path / "base", hidden=64)
    write_safetensors(
        base / "model.safetensors",
        {
            "model.layers.0.self_attn.q_proj.weight": [64, 64],
            "model.layers.0.self_attn.v_proj.weight": [32, 64],
        },
    )
    other_base = make_base(tmp_path / "other-base", hidden=128)
    d = tmp_path / "dir"
    write_safetensors(
        make_adapter(d / "fits") / "adapter_model.safetensors", lora_tensors(64, 64, 32)
    )
    write_safetensors(
        make_adapter(d / "rank-32", rank=32) / "adapter_model.safetensors",
        lora_tensors(64, 64, 32, rank=32),
    )
    write_safetensors(
        make_adapter(d / "wider-base") / "adapter_model.safetensors", lora_tensors(128, 128, 32)
    )
    write_safetensors(
        make_adapter(d / "narrower-out") / "adapter_model.safetensors", lora_tensors(64, 16, 32)
    )
    foreign = lora_tensors(64, 64, 32)
    foreign["base_model.model.model.layers.0.self_attn.c_attn.lora_A.weight"] = [8, 64]
    write_safetensors(make_adapter(d / "foreign-module") / "adapter_model.safetensors", foreign)
    make_adapter(d / "other-arch", base=str(other_base))
    (make_adapter(d / "broken") / "adapter_config.json").write_text("{not json")
    return base, d


@pytest.mark.parametrize(
    ("adapter", "reason"),
    [
        ("rank-32", "its rank 32 is above this model's max_lora_rank (16)"),
        ("wider-base", "q_proj lora_A has 128 in-features, the served model's"),
        ("narrower-out", "q_proj lora_B has 16 out-features"),
        ("foreign-module", "layers.0.self_attn.c_attn, a module the served model does not have"),
        ("other-arch", "hidden_size 128), the served model has hidden_size 64"),
        ("broken", "cannot read"),
    ],
)
async def test_a_hot_added_adapter_that_does_not_fit_the_base_is_a_400(
    misfits: tuple[Path, Path], adapter: str, reason: str
) -> None:
    base, adapter_dir = misfits
    model = parse_spec(
        {"models": [{"name": "m", "source": "x", "adapter_dir": str(adapter_dir)}]}
    ).models[0]
    engine = FakeEngine(
        EngineConfig.from_spec(model, model_path=str(base), settings=SETTINGS, kind="fake")
    )
    await engine.start()
    gw = Gateway(
        [ModelRoute("m", 64, adapter_dir=str(adapter_dir))],
        ApiKeyTable(model_tenants={"m": None}),
        LocalModelClient({"m": engine}),
    )
    async with client(gw, "") as c:
        for asked in (adapter, f"m:{adapter}"):
            r = await c.post("/v1/chat/completions", json=chat(asked))
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "BadRequestError"
            assert error["param"] == "model"
            assert error["code"] == 400
            assert error["message"].startswith(
                f"LoRA adapter '{adapter}' cannot be served by model 'm': "
            )
            assert reason in error["message"]
        # the replica keeps serving: the base and an adapter that fits
        for ok in ("m", "fits"):
            assert (await c.post("/v1/chat/completions", json=chat(ok))).status_code == 200


# --------------------------------------------------------------------------- held adapters


async def test_engine_reports_the_adapters_it_holds_lru_within_max_cpu_loras(
    adapter_dir: Path, tmp_path: Path
) -> None:
    for name in ("d1", "d2", "d3"):
        make_adapter(adapter_dir / name)
    static = make_adapter(tmp_path / "static")
    model = parse_spec(
        {
            "models": [
                {
                    "name": "m",
                    "source": "x",
                    "adapter_dir": str(adapter_dir),
                    "adapters": [{"name": "s", "source": str(static)}],
                    "max_loras": 1,
                    "max_cpu_loras": 3,
                }
            ]
        }
    ).models[0]
    engine = FakeEngine(
        EngineConfig.from_spec(model, model_path="fake", settings=SETTINGS, kind="fake")
    )
    await engine.start()
    gw = Gateway(
        [ModelRoute("m", 64, adapters=("s",), adapter_dir=str(adapter_dir))],
        ApiKeyTable(model_tenants={"m": None, "s": None}),
        LocalModelClient({"m": engine}),
    )
    assert await engine.adapters() == ("s",)  # static adapters load at start
    async with client(gw, "") as c:
        for asked in ("m", "d1", "m:d2", "nope"):
            await c.post("/v1/chat/completions", json=chat(asked))
        assert await engine.adapters() == ("d1", "d2", "s")  # the base is no adapter
        await c.post("/v1/chat/completions", json=chat("d3"))
        assert await engine.adapters() == ("d1", "d2", "d3")  # 's' was least recently used
