"""Fixtures shared by every test directory.

* Tests never reach a model hub (nor GitHub for CRDs: ``FLEETSERVE_OFFLINE``):
  ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` are set for
  the whole session (before transformers/huggingface_hub are imported by any test), so a
  test that would download something fails instead of silently using the network.
* ``default_model_dir``: the built-in default model (Gemma 3 270M), prepared once per
  machine into the normal cache (``$FLEETSERVE_CACHE`` or ``~/.cache/fleetserve``) and
  shared by all engine tests; preparing takes about a minute the first time, then nothing.
* The session fails if the test process itself is left a Ray driver (see
  ``RAY_DRIVER_THREADS``): tests ask a Ray cluster through a probe process instead
  (``integration/conftest.py``, ``RayProbe``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from fleetserve.errors import ModelPreparationError
from fleetserve.modelstore import ModelStore
from fleetserve.spec import DEFAULT_MODEL_SOURCE

# fleetserve's imports above load neither transformers nor huggingface_hub, so these are
# in place before anything reads them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Nor the CRDs of a KubeRay release (doctor validates with schemas by default; the doctor tests
# serve them from ../shared/k8s/crds, the download is tested against 127.0.0.1).
os.environ.setdefault("FLEETSERVE_OFFLINE", "1")

# Property tests judge correctness, never speed (speed lives in benchmarks/): Hypothesis'
# per-example deadline and too-slow health check fail on a loaded 2-core CI host.
settings.register_profile("fleetserve", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fleetserve")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """Directory of the prepared default model (prepared on first use, then reused)."""
    store = ModelStore()
    try:
        return Path(store.resolve(DEFAULT_MODEL_SOURCE))
    except ModelPreparationError as e:
        pytest.fail(f"cannot prepare the default model: {e}", pytrace=False)


#: Native threads a Ray driver leaves in its process even after ``ray.shutdown()``. With them
#: alive, interpreter exit ran one into freed memory: pytest segfaulted after every test had
#: passed (``make test`` then fails). Thread names as Linux reports them (15 characters).
RAY_DRIVER_THREADS = frozenset({"gcs_client_io_s"})


def native_thread_names() -> set[str]:
    """The names of this process's threads (Linux ``/proc``; empty elsewhere)."""
    names: set[str] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for task in tasks:
        try:
            names.add(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:
            continue  # the thread ended meanwhile
    return names


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = sorted(RAY_DRIVER_THREADS & native_thread_names())
    if left and exitstatus == pytest.ExitCode.OK:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            f"the test process joined a Ray cluster itself (threads left: {', '.join(left)}); "
            "they can crash interpreter exit - ask the cluster through a RayProbe process"
        )
        if reporter is not None:
            reporter.write("\n")
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
