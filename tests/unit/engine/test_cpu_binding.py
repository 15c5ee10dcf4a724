"""CPU engines on one host claim disjoint cores (vLLM's auto binding pins them all to the
same ones), a dead engine's cores come back, and too few free cores means unpinned."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetserve.engine.cpu_binding import (
    BIND_ENV,
    NO_BIND,
    claim_cores,
    claimable,
    cores_wanted,
    format_cores,
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
