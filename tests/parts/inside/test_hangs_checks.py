"""The hang checks of notebook 23 (autograde/parts/inside/checks_hangs.py) on traces made by hand: how a run
that still hangs is reported (where each rank waits, and what it printed last), and how rank 0's
validation lines are read. (The checks on real runs: tests/core/test_checks_recorded.py replays
exercises/hang_training.py, its solution, the styles of tests/styles/exercises/hang_*.py and the
catalogued mistakes.)"""
from __future__ import annotations

import pytest
from conftest import recorded_trace

from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.verdicts import Failed
from autograde.parts.inside import checks_hangs as hangs

pytestmark = pytest.mark.timeout(120)


def _joined(rank: int) -> dict:
    return {"ev": "exit", "call": "init_process_group", "rank": rank, "rank_joined": rank}


def _run(stalled: bool, *traces: list[dict]) -> Run:
    found = {pid: recorded_trace(*events, pid=pid) for pid, events in enumerate(traces, start=1)}
    return Run("run with --world-size 2", [processes.Result(1 if stalled else 0, "", "", False, 20.0, False)], found,
               stalled=stalled)


def test_a_run_that_still_hangs_names_each_rank_s_waiting_call_or_its_training_step() -> None:
    waiting_at_barrier = [_joined(1), {"ev": "print", "rank": 1, "text": "rank 1: epoch 0, loss 1.5"},
                          {"ev": "enter", "rank": 1, "call": "barrier", "line": 71}]
    in_backward = [_joined(0), *({"ev": "step", "rank": 0, "n": n} for n in range(1, 6))]
    with pytest.raises(Failed) as failed:
        hangs.require_finished(_run(True, waiting_at_barrier, in_backward), "fix it")
    observed = failed.value.observed
    assert "deadlocked" in observed and "waiting were rank 1 in dist.barrier() (line 71)" in observed, observed
    assert "rank 0 in no torch.distributed call of the script, after its 5th optimizer step" in observed, observed
    # which hang it is: how far each rank had got
    assert "the last line each rank printed: rank 0: nothing, rank 1: 'rank 1: epoch 0, loss 1.5'" in observed, observed


def test_a_run_that_finished_passes_require_finished() -> None:
    hangs.require_finished(_run(False, [{"ev": "print", "rank": 0, "text": "done"}]), "fix it")


def test_rank_0_s_validation_lines_are_read_by_the_epochs_trained_before_them() -> None:
    lines = ["rank 0 (pid 12) started", "validation after 0 epochs: loss 1.438940, accuracy 0.2162",
             "rank 0: epoch 1, 10 steps, 2 skipped, loss 1.160059",
             "validation after 1 epochs: loss 0.911045, accuracy 0.6757 (0.23 s)",
             "validation after 2 epochs: loss nan, accuracy 0.0000 (0.20 s)"]
    trace = recorded_trace(_joined(0), *[{"ev": "print", "rank": 0, "text": text} for text in lines], pid=1)
    run = Run("run with --world-size 2", [processes.Result(0, "", "", False, 20.0, False)], {1: trace})
    found = hangs._validation(run)
    assert found[0] == (1.43894, 0.2162) and found[1] == (0.911045, 0.6757), found
    assert found[2][0] != found[2][0] and not hangs._same(found[2], found[2])  # NaN: never equal to a reference
    assert hangs._same((1.438941, 0.2162), (1.43894, 0.2162)) and not hangs._same((1.439061, 0.2164), (1.43894, 0.2162))
