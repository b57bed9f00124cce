"""Debugging hangs (notebook 23): demos/hangs.py really hangs, and the notebook's helpers find
where each rank waits (py-spy, and faulthandler without it), read TORCH_DISTRIBUTED_DEBUG=DETAIL's
verdict and a timeout's message, and leave no process behind; the learner's project
(exercises/hang_training.py) hangs first where the notebook's answer cell expects, and a script
that ends by itself is said so in a line. (The project fixed runs in the notebook under the course's
grading test, tests/course/test_course.py, with every exercise solved.)"""
from __future__ import annotations

import re

import pytest
from conftest import ROOT, left_running, run_python

from autograde.engine import processes
from autograde.parts.inside import notebook as inside

pytestmark = pytest.mark.launch  # every test here starts processes

SCRIPT = ROOT / inside.HANGS


def test_a_barrier_on_rank_0_alone_is_found_where_each_rank_waits() -> None:
    stacks = inside.where_they_wait("one_rank_collective", settle=3)
    assert inside.waiting_line(stacks[0]).startswith("in barrier (")
    assert inside.waiting_line(stacks[1]).startswith("in all_reduce (")
    assert all("(hangs.py:" in inside.waiting_line(frames) for frames in stacks.values())
    assert not left_running("hangs.py", "py-spy")


def test_without_py_spy_faulthandler_gives_the_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inside, "_py_spy", lambda: None)
    stacks = inside.where_they_wait("uneven_batches", settle=3)
    assert inside.waiting_line(stacks[0]).startswith("in barrier (")
    assert any("backward" in frame for frame in stacks[1]), stacks[1]  # rank 1: its extra batch's backward()
    assert not left_running("hangs.py", "py-spy")


def test_detail_names_the_collectives_the_ranks_disagree_on() -> None:
    said = inside.detail("early_stop_rank0")
    assert said.startswith("Detected mismatch between collectives on ranks") and "Rank 0" in said and "Rank 1" in said, said


def test_the_project_hangs_first_in_its_validation_on_rank_0_and_at_the_epoch_s_barrier_on_rank_1() -> None:
    """The answer the instructor expects in notebook 23's first answer cell: rank 0 has one validation
    batch more (19 samples and 18, in batches of 6) and waits in that batch's all_reduce; rank 1 has
    gone on to the barrier that starts the first epoch."""
    stacks = inside.stacks_of("exercises/hang_training.py", settle=3)
    assert inside.waiting_line(stacks[0], "hang_training.py").startswith("in all_reduce ("), stacks[0]
    assert any(frame.startswith("evaluate (hang_training.py:") for frame in stacks[0]), stacks[0]
    assert inside.waiting_line(stacks[1], "hang_training.py").startswith("in barrier ("), stacks[1]
    assert any(frame.startswith("worker (hang_training.py:") for frame in stacks[1]), stacks[1]
    assert not left_running("hangs.py", "py-spy")


def test_a_run_that_does_not_hang_is_said_in_one_line() -> None:
    with pytest.raises(inside.HangError, match="ended by itself"):
        inside.where_they_wait("none", settle=30)
    assert not left_running("hangs.py", "py-spy")


def test_the_fix_for_uneven_batches_needs_ddp() -> None:
    result = run_python(SCRIPT, "--bug", "uneven_batches", "--fix", "--by-hand", timeout=60)
    assert result.returncode == 2 and "Join" in result.stderr and "Traceback" not in result.output, result.output


def test_a_hang_that_times_out_ends_in_one_line() -> None:
    """docs/course.md's `--bug uneven_batches --timeout N`: the job hangs until the process group gives
    up, then says which rank stopped waiting and why in one line, not a traceback per rank; notebook 23
    shows that line (gloo's message names the operation and the time, not the other rank)."""
    result = run_python(SCRIPT, "--world-size", "2", "--bug", "uneven_batches", "--timeout", "5", timeout=90)
    assert result.returncode == 1 and not result.timed_out and "Traceback" not in result.output, result.output[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("hangs.py:")]
    assert re.fullmatch(r"hangs\.py: rank [01] stopped waiting: .*Timed out waiting 5000ms for recv operation.*", line), line
    assert not left_running("hangs.py", "py-spy")


def test_the_notebook_s_timeout_message_is_that_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """inside.timeout_message picks the line out of the demo's output (its run stubbed here: the test
    above launches the demo)."""
    said = "hangs.py: rank 1 stopped waiting: RuntimeError: [gloo] Timed out waiting 5000ms for recv operation"
    monkeypatch.setattr(inside.processes, "run", lambda *a, **k: processes.Result(1, "", f"W...\n{said}\n", False, 9.0, False))
    assert inside.timeout_message("uneven_batches", seconds=5) == said


def test_the_demo_s_fix_for_uneven_batches_finishes() -> None:
    """docs/course.md: `--bug uneven_batches --fix` (Join) finishes."""
    result = run_python(SCRIPT, "--world-size", "2", "--bug", "uneven_batches", "--fix", "--timeout", "30", timeout=120)
    assert result.returncode == 0 and "done: final loss" in result.stdout, result.output[-3000:]
