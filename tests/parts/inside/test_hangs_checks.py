"""The hang checks of notebook 23 (autograde/parts/inside/checks_hangs.py) on traces made by hand: how a run
that still hangs is reported, and how the printed results are read, whatever their wording. (The
checks on real runs: tests/core/test_checks_recorded.py replays the exercises, their solutions, the
styles of tests/styles/exercises/hang_*.py and the catalogued mistakes.)"""
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


def test_a_run_that_finished_passes_require_finished() -> None:
    hangs.require_finished(_run(False, [{"ev": "print", "rank": 0, "text": "done"}]), "fix it")


def test_the_numbers_after_mean_or_validation_are_read_in_any_wording() -> None:
    trace = recorded_trace(*[{"ev": "print", "rank": 0, "text": text} for text in (
        "rank 0: epoch 0, loss 2.547745",  # a rank's own loss: neither word
        "epoch 0: mean loss over 2 ranks 2.421263",  # the count of ranks is not the mean
        "epoch 1: mean loss 0.965821 (ranks: 1.0253, 0.9064)",  # the first number with decimals after the word
        "validation loss after epoch 2 = 0.239994")])
    assert hangs._after("mean", trace) == {0: 2.421263, 1: 0.965821}
    assert hangs._after("validation", trace) == {2: 0.239994}
