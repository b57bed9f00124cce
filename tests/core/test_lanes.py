"""The rules by which `make test` runs in two lanes (tests/conftest.py, "Two lanes"): which tests share
a lane's unit, and which processes a lane counts as its own. The lanes themselves run in every `make test`."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import FIRST, MACHINE_WIDE, _unit, launched_here

from autograde.engine import processes

TESTS = Path(__file__).resolve().parent.parent

# What a test file does that changes or counts what the whole machine shares: a hub (its users, the
# checkout's modes, the sudo rule), the course's SLURM cluster, Unix users, the notebooks (notebook 16
# starts the cluster). Such a file must run in the machine's unit, never beside another of its kind.
MACHINE_WIDE_USE = re.compile(r"need_a_hub|ClassHub|slurm: Slurm|slurm_cluster\.up\(|useradd|--nbval")


def test_every_machine_wide_file_exists() -> None:
    missing = [path for path in MACHINE_WIDE if not (TESTS / path).is_file()]
    assert not missing, f"MACHINE_WIDE names files that are not there (renamed?): {missing}"


def test_every_file_that_changes_what_the_machine_shares_is_in_the_machines_unit() -> None:
    found = {path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")
             if MACHINE_WIDE_USE.search(path.read_text()) and path.resolve() != Path(__file__).resolve()}
    assert found, "the pattern finds no file: it no longer says what the machine-wide tests do"
    assert found <= set(MACHINE_WIDE), f"add to MACHINE_WIDE in tests/conftest.py: {sorted(found - set(MACHINE_WIDE))}"


def test_a_file_is_a_unit_and_the_machine_wide_files_are_one() -> None:
    assert {_unit(f"tests/{path}") for path in MACHINE_WIDE} == {"machine"}
    assert _unit("tests/course/test_course.py") == "course/test_course.py"
    assert _unit("tests/core/test_lanes.py") == "core/test_lanes.py"
    assert _unit("tests/course/test_class_hub.py::test_x[a::b]") == "machine"  # a test id: its file decides
    assert FIRST[0] == "machine" and all(unit == "machine" or (TESTS / unit).is_file() for unit in FIRST)


@pytest.mark.parametrize("own, mark, ours", [
    (None, None, False),  # not launched by any session
    (None, "abc", True),  # run alone: every launch's process is the session's
    (None, "lane-gw1-7:abc", True),
    ("lane-gw0-5", "lane-gw0-5:abc", True),  # this lane's launch
    ("lane-gw0-5", "lane-gw0-5:abc:def", True),  # a launch inside it
    ("lane-gw0-5", "lane-gw1-7:abc", False),  # the other lane's
    ("lane-gw0-5", "lane-gw0-5", False),  # the lane's own process, not a launch of it
    ("lane-gw0-5", "lane-gw0-50:abc", False),  # another lane whose mark begins the same
])
def test_a_lane_counts_the_processes_it_launched_and_no_others(
        monkeypatch: pytest.MonkeyPatch, own: str | None, mark: str | None, ours: bool) -> None:
    if own is None:
        monkeypatch.delenv(processes.MARK, raising=False)
    else:
        monkeypatch.setenv(processes.MARK, own)
    assert launched_here(mark) is ours
