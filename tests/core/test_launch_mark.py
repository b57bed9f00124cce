"""The `launch` mark holds (tests/conftest.py): a test not marked `launch` cannot start a process,
by any of the ways there are, and fails even when it catches the refusal; a marked test can. So
`make test-fast` (pytest -m "not launch") cannot hold a test that launches."""
from __future__ import annotations

import _posixsubprocess
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAUNCHERS, ROOT, LaunchInUnmarkedTest, launches_refused

REAL = {what: getattr(owner, name) for owner, name, what in LAUNCHERS}  # read at import, outside any test


def test_an_unmarked_test_is_refused_every_way_of_starting_a_process(request: pytest.FixtureRequest) -> None:
    with launches_refused(request.node) as tried:  # the guard again, its list this test's to read
        for owner, name, what in LAUNCHERS:
            assert getattr(owner, name) is not REAL[what], f"{what} is not guarded"
        with pytest.raises(LaunchInUnmarkedTest, match="not marked @pytest.mark.launch"):
            subprocess.run(["true"])
        with pytest.raises(LaunchInUnmarkedTest):
            os.system("true")
        with pytest.raises(LaunchInUnmarkedTest):
            os.posix_spawn("/bin/true", ["true"], os.environ)
        for method in ("fork", "spawn", "forkserver"):
            with pytest.raises(LaunchInUnmarkedTest):
                multiprocessing.get_context(method).Process(target=print).start()
        with pytest.raises(LaunchInUnmarkedTest):
            os.fork()  # guarded: checked above, so this test never forks the test run
        assert _posixsubprocess.fork_exec is not REAL["_posixsubprocess.fork_exec"]
    assert sorted(set(tried)) == ["multiprocessing's Process.start", "os.fork", "os.posix_spawn", "os.system",
                                  "subprocess.Popen"]
    assert all(getattr(owner, name) is not REAL[what] for owner, name, what in LAUNCHERS)  # this test's own guard


@pytest.mark.launch
def test_a_marked_test_starts_processes() -> None:
    assert all(getattr(owner, name) is REAL[what] for owner, name, what in LAUNCHERS)
    assert subprocess.run(["true"]).returncode == 0


UNMARKED = """
import subprocess

import pytest


def test_catches_the_refusal():
    try:
        subprocess.run(["true"])
    except Exception:
        pass


@pytest.mark.launch
def test_marked():
    subprocess.run(["true"], check=True)
"""


@pytest.mark.launch
def test_an_unmarked_test_that_catches_the_refusal_still_fails(tmp_path: Path) -> None:
    """A pytest run of its own, with tests/conftest.py as a plugin: the unmarked test fails with the
    launcher it tried, the marked one passes."""
    (tmp_path / "test_unmarked.py").write_text(UNMARKED)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}  # where conftest.py is
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                          "test_unmarked.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout
    assert "test_catches_the_refusal tried to start processes (subprocess.Popen) but is not marked" in run.stdout, run.stdout
