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
* Markers ``engine`` and ``ray`` come from the fixtures a test uses (``FIXTURE_MARKERS``),
  never from a hand-written mark, so ``-m "not engine"`` selects exactly the tests that start
  no vLLM engine. Tests of a shared server run together, after the rest (``SHARED_ORDER``),
  and a shared server registered with :func:`release_after_last_use` stops after its last
  test instead of idling (a loaded 2-core host) until the session ends.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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


#: Fixture -> markers of every test that uses it, directly or through another fixture
#: (``item.fixturenames`` is the closure). ``own_ray``: the test starts a Ray cluster
#: (``fleetserve serve``, ``serve run``, a Ray head, ``ray.init``; integration's ``servers``
#: requests it); ``real_engine`` (tests/integration/conftest.py): a vLLM engine on the
#: default model's weights.
FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    "own_ray": ("ray", "slow"),
    "real_engine": ("engine", "slow"),
}


@pytest.fixture(scope="session")
def own_ray() -> None:
    """Requested by a test or fixture that starts a Ray cluster of its own: marks its tests
    ``ray`` (FIXTURE_MARKERS)."""


#: Markers only FIXTURE_MARKERS may set: a hand-written one would lie as soon as the test's
#: fixtures change.
DERIVED_MARKERS = frozenset({"engine", "ray"})
#: Shared servers, in the order their tests run after all other tests: the tests of one
#: server run together, so it is released (``release_after_last_use``) soon. A test goes
#: with the last fixture of this list that it uses, and within that group the tests that
#: also use an earlier one go first (the parity tests, which ask both frontends, open the
#: ``process_fleet`` group). ``retiring_process_fleet`` stops that fleet after its other
#: users; ``retiring_engine_fleet`` ends the session's default real-engine fleet (a kill
#: test), so it runs after every other user.
SHARED_ORDER = (
    "fake_fleet",
    "engine_fleet",
    "process_fleet",
    "retiring_process_fleet",
    "retiring_engine_fleet",
)


def _shared_group(item: pytest.Item) -> tuple[int, int]:
    names = getattr(item, "fixturenames", ())
    used = [i for i, name in enumerate(SHARED_ORDER) if name in names]
    if not used:
        return (0, 0)
    return (1 + max(used), 0 if min(used) < max(used) else 1)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        hand = sorted(m.name for m in item.iter_markers() if m.name in DERIVED_MARKERS)
        if hand:
            raise pytest.UsageError(
                f"{item.nodeid}: marker(s) {', '.join(hand)} are set from the fixtures a test "
                "uses (tests/conftest.py FIXTURE_MARKERS); remove the hand-written mark"
            )
        for fixture, markers in FIXTURE_MARKERS.items():
            if fixture in names:
                for marker in markers:
                    item.add_marker(marker)
    items[:] = sorted(items, key=_shared_group)  # stable: each group keeps its file order


#: Fixture name -> node id of the last test (in run order) that uses it.
_LAST_USE = pytest.StashKey[dict[str, str]]()
#: Fixture name -> what stops the server it set up.
_RELEASES = pytest.StashKey[dict[str, Callable[[], object]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    last: dict[str, str] = {}
    for item in session.items:  # the final selection, in run order
        for name in getattr(item, "fixturenames", ()):
            last[name] = item.nodeid
    session.config.stash[_LAST_USE] = last
    session.config.stash[_RELEASES] = {}


Release = Callable[[pytest.FixtureRequest, Callable[[], object]], None]


@pytest.fixture(scope="session")
def release_after_last_use() -> Release:
    """``release_after_last_use(request, stop)`` in a session fixture: ``stop`` runs once the
    last test that uses that fixture has run, not at session end (the fixture's own teardown
    still runs then: ``stop`` must be idempotent)."""

    def register(request: pytest.FixtureRequest, stop: Callable[[], object]) -> None:
        assert request.fixturename is not None
        request.config.stash[_RELEASES][request.fixturename] = stop

    return register


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    result = yield
    last = item.config.stash.get(_LAST_USE, {})
    releases = item.config.stash.get(_RELEASES, {})
    for name in [n for n in releases if last.get(n) == item.nodeid]:
        releases.pop(name)()
    return result
