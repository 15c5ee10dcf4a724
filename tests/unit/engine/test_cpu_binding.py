"""CPU engines on one host claim disjoint cores (vLLM's auto binding pins them all to the
same ones), a dead engine's cores come back, and too few free cores means unpinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetserve.engine.cpu_binding import (
    BIND_ENV,
    HOST_CPUS_ENV,
    NO_BIND,
    claim_cores,
    claimable,
    cores_wanted,
    engine_cores,
    format_cores,
    host_cores,
    parse_cores,
    serving_cores,
    spawned_on,
)


@pytest.mark.parametrize(
    ("share", "cores"), [(None, 1), (0.0, 1), (0.5, 1), (1.0, 1), (2.0, 2), (3.9, 3)]
)
def test_cores_follow_the_ray_cpu_share(share: float | None, cores: int) -> None:
    assert cores_wanted(share) == cores


def test_one_core_stays_unclaimed_when_there_are_several() -> None:
    assert claimable([1, 0]) == [0]
    assert claimable([0, 1, 2, 3]) == [0, 1, 2]
    assert claimable([5]) == [5]


def test_vllm_list_syntax() -> None:
    assert format_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_cores([3]) == "3"


def test_two_engines_on_a_two_core_host_do_not_share_a_pinned_core(tmp_path: Path) -> None:
    first = claim_cores(1, [0, 1], tmp_path)
    assert first.env == {BIND_ENV: "0"}
    # Core 1 is kept for the scheduler and serving layer; core 0 is held: run unpinned.
    second = claim_cores(1, [0, 1], tmp_path)
    assert second.env == {BIND_ENV: NO_BIND, "OMP_NUM_THREADS": "1"}
    first.release()
    assert claim_cores(1, [0, 1], tmp_path).env == {BIND_ENV: "0"}


def test_engines_get_disjoint_core_sets(tmp_path: Path) -> None:
    cores = list(range(8))
    a = claim_cores(3, cores, tmp_path)
    b = claim_cores(3, cores, tmp_path)
    assert (a.env[BIND_ENV], b.env[BIND_ENV]) == ("0-2", "3-5")
    c = claim_cores(2, cores, tmp_path)  # only core 6 is left (7 is kept)
    assert c.env[BIND_ENV] == NO_BIND
    a.release()
    assert claim_cores(2, cores, tmp_path).env[BIND_ENV] == "0-1"


def test_a_killed_engines_cores_are_free_again(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; "
        "from fleetserve.engine.cpu_binding import claim_cores; "
        "c = claim_cores(1, [0, 1], Path(sys.argv[1])); print(c.env, flush=True); "
        "time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert "'0'" in child.stdout.readline()
        assert claim_cores(1, [0, 1], tmp_path).env[BIND_ENV] == NO_BIND
    finally:
        child.kill()
        child.wait(10)
    deadline = time.monotonic() + 10
    while claim_cores(1, [0, 1], tmp_path).env[BIND_ENV] != "0":
        assert time.monotonic() < deadline, "the dead process's lock was not dropped"
        time.sleep(0.1)


def test_lock_directory_is_private(tmp_path: Path) -> None:
    where = tmp_path / "locks"
    claim_cores(1, [0], where)
    assert os.stat(where).st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("host", "engine_cores", "serving"),
    [
        ([0, 1], 1, [1]),  # one engine on core 0: the rest on core 1
        ([0, 1], 0, [0, 1]),  # no engine claims: nothing moves
        ([0, 1], 3, [1]),  # more wanted than claimable: the kept core only
        (list(range(8)), 3, [3, 4, 5, 6, 7]),
        ([4, 5, 6, 7], 2, [6, 7]),
        ([3], 1, [3]),  # one core: nothing to keep off
    ],
)
def test_serving_cores_are_the_ones_engines_never_claim(
    host: list[int], engine_cores: int, serving: list[int]
) -> None:
    assert serving_cores(host, engine_cores) == serving


def test_engine_claims_land_outside_the_serving_cores(tmp_path: Path) -> None:
    """The invariant serving_cores relies on: claims of at most N cores in all, each the
    lowest free, stay within the lowest N claimable cores, also after releases."""
    host = list(range(8))
    a = claim_cores(2, host, tmp_path)
    b = claim_cores(1, host, tmp_path)
    a.release()
    c = claim_cores(2, host, tmp_path)
    held = set(b.cores) | set(c.cores)
    assert held.isdisjoint(serving_cores(host, 3))


def test_core_lists_parse_in_vllms_syntax() -> None:
    assert parse_cores("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    assert format_cores(parse_cores("3,1,2")) == "1-3"
    for bad in ("", "a", "3-1", "-1", "1,,2"):
        with pytest.raises(ValueError, match="not a core list"):
            parse_cores(bad)


def test_host_cores_come_from_the_driver_when_it_narrowed_this_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(HOST_CPUS_ENV, raising=False)
    assert host_cores() == sorted(os.sched_getaffinity(0))
    monkeypatch.setenv(HOST_CPUS_ENV, "0-7")
    assert host_cores() == list(range(8))
    # An engine in a process started on the serving cores claims from the host's cores.
    assert claim_cores(1, directory=tmp_path).env == {BIND_ENV: "0"}


def _child_affinity() -> set[int]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(json.loads(out))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_processes_started_inside_spawned_on_get_its_cores() -> None:
    mine = os.sched_getaffinity(0)
    # the highest core: engines claim the lowest (cpu_binding), and `make test` runs a real
    # engine beside this test, whose busy-polling core made each child here take ~15 s
    one = [max(mine)]
    with spawned_on(one):
        assert _child_affinity() == set(one)
    assert os.sched_getaffinity(0) == mine  # this thread is given its cores back
    assert _child_affinity() == mine


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_spawned_on_leaves_the_other_threads_of_this_process_alone() -> None:
    seen: list[set[int]] = []
    entered, done = threading.Event(), threading.Event()

    def other() -> None:
        entered.wait(10)
        seen.append(os.sched_getaffinity(0))
        done.set()

    mine = os.sched_getaffinity(0)
    thread = threading.Thread(target=other)
    thread.start()
    with spawned_on([min(mine)]):
        entered.set()
        done.wait(10)
    thread.join(10)
    assert seen == [mine]


def test_an_engine_starts_on_its_claimed_cores_else_the_hosts(tmp_path: Path) -> None:
    host = list(range(4))
    claim = claim_cores(2, affinity=host, directory=tmp_path)
    try:
        assert engine_cores(claim, host) == [0, 1]
    finally:
        claim.release()
    # more engines than cores (nobind), or vLLM's own binding: the host's cores
    held = claim_cores(3, affinity=host, directory=tmp_path)
    try:
        unpinned = claim_cores(1, affinity=host, directory=tmp_path)
        assert unpinned.env[BIND_ENV] == NO_BIND
        assert engine_cores(unpinned, host) == host
    finally:
        held.release()
    assert engine_cores(None, host) == host


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_an_engines_processes_get_the_cores_it_claimed(tmp_path: Path) -> None:
    host = sorted(os.sched_getaffinity(0))
    claim = claim_cores(1, affinity=host, directory=tmp_path)
    try:
        with spawned_on(engine_cores(claim, host)):
            assert _child_affinity() == set(claim.cores) == {host[0]}
    finally:
        claim.release()
