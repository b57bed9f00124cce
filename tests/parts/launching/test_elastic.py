"""Elastic torchrun, as notebook 15's section "Elastic: nodes that come and go" runs it
(autograde/parts/launching/notebook_elastic.py): the course's checkpointing solution under
`torchrun --nnodes 1:2` with the c10d rendezvous, two torchrun agents on this machine standing for
two nodes (A on 127.0.0.1, hosting the rendezvous; B on 127.0.0.2). Each scenario runs for real:
about 30 s each on this 2-core machine, the bad inputs none."""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import ROOT

from autograde.parts.launching import notebook_elastic as elastic
from autograde.parts.launching.checks_elastic import outcome

SOLUTION = str(ROOT / "solutions" / "resume_training.py")
EPOCHS = 5


def running(marker: str) -> list[int]:
    """Processes of this machine whose command line holds `marker` (a run's own folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue
    return found


def assert_nothing_left(run: elastic.ElasticRun, seconds: float = 10) -> None:
    """No agent and no worker of `run` is alive once it has returned (a few seconds to exit)."""
    deadline = time.monotonic() + seconds
    while running(str(run.folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(str(run.folder)), f"processes left running: {running(str(run.folder))}"


@pytest.mark.launch
def test_a_node_that_joins_later_restarts_the_group_which_goes_on_from_the_checkpoint() -> None:
    run = elastic.join_later(SOLUTION, epochs=EPOCHS, after_epoch=1, echo=False)
    assert run.world_sizes == [1, 2], run.table()
    alone, both = run.lives
    assert alone.ranks == {"A": 0} and both.ranks == {"A": 0, "B": 1}, run.table()
    started_b = next(t for t, node, what in run.events if node == "B" and what == "started")
    assert alone.epochs[1] <= started_b, "B started before the first epoch was done"
    assert alone.ended_by == "a node joined", run.table()
    # from the checkpoint, not from epoch 1: the last epoch it saved (a restart during a save goes on
    # from the one before, whose checkpoint is whole)
    assert both.resumed_at is not None and both.resumed_at >= 2, run.table()
    assert max(alone.epochs) <= both.resumed_at <= max(alone.epochs) + 1, run.table()
    assert sorted(both.epochs) == list(range(both.resumed_at, EPOCHS + 1)), run.table()
    assert [life.restart_count for life in run.lives] == [0, 0], "a node that joins counts as no failure"
    assert run.finished and run.exit_status == {"A": 0, "B": 0}, run.table()
    assert_nothing_left(run)
    # what the item "elastic" compares the learner's node_joins with is what this run did
    told = outcome("node_joins", EPOCHS, 1)
    assert (told["world_sizes"], told["restarts"], told["rank_of_b"]) == (
        run.world_sizes, [life.restart_count for life in run.lives], both.ranks["B"]), run.table()
    assert told["resumes_at"] <= both.resumed_at, run.table()  # the earliest it can be


@pytest.mark.launch
def test_a_lost_node_leaves_the_survivor_to_go_on_alone_from_the_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    run = elastic.lose_node(SOLUTION, epochs=EPOCHS, after_epoch=2, echo=False)
    assert run.world_sizes == [2, 1], run.table()
    both, alone = run.lives
    assert both.ranks == {"A": 0, "B": 1} and alone.ranks == {"A": 0}, run.table()
    # B was killed once rank 0 had finished epoch 2 and said so, after its checkpoint was complete
    assert sorted(both.epochs) == [1, 2] and both.ended_by == "a worker failed", run.table()
    assert alone.resumed_at == 3 and sorted(alone.epochs) == list(range(3, EPOCHS + 1)), run.table()
    assert [life.restart_count for life in run.lives] == [0, 1], run.table()
    assert run.finished and run.exit_status == {"A": 0, "B": -9}, run.table()
    assert_nothing_left(run)
    assert outcome("node_lost", EPOCHS, 2) == {  # what the item "elastic" compares node_lost with
        "world_sizes": run.world_sizes, "restarts": [life.restart_count for life in run.lives],
        "resumes_at": alone.resumed_at, "rank_of_a": alone.ranks["A"]}, run.table()
    capsys.readouterr()
    elastic.compare({"world_sizes": [2, 2], "resumes_at": 3}, run)  # a prediction beside the run, key by key
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(rows) == {"world_sizes", "restarts", "resumes_at"}, rows  # rank_of_a: not predicted, not shown
    assert "predicted [2, 2]" in rows["world_sizes"] and rows["world_sizes"].endswith("measured [2, 1]"), rows
    assert "(not predicted)" in rows["restarts"] and rows["resumes_at"].endswith("measured 3"), rows
    # the picture: a bar per node and life, the kill on B's row, the checkpoint loaded in the last life
    fig = elastic.timeline(run)
    shown = [text.get_text() for ax in fig.axes for text in ax.texts]
    assert {"life 1: rank 0 of 2", "life 1: rank 1 of 2", "life 2: rank 0 of 1", "killed"} <= set(shown), shown
    assert "checkpoint loaded: goes on at epoch 3" in shown, shown


@pytest.mark.launch
def test_a_run_past_its_time_limit_is_stopped_in_one_line_with_every_process(tmp_path: Path) -> None:
    """Stopped mid-training (8 s: node A's worker is running), nothing of it is left: the agents, and
    the workers torchrun started in sessions of their own. Their command lines name the data folder."""
    data_dir = tmp_path / "data"
    started = time.monotonic()
    with pytest.raises(RuntimeError) as stopped:
        elastic.join_later(SOLUTION, epochs=EPOCHS, timeout=8, data_dir=data_dir, echo=False)
    assert "stopped after 8 s (the time limit)" in str(stopped.value) and "\n" not in str(stopped.value)
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 10
    while running(str(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(str(data_dir)), f"processes left running: {running(str(data_dir))}"


@pytest.mark.parametrize("call, words", [
    (lambda port: elastic.join_later(SOLUTION, port=port, echo=False), ["port {port} is busy", "port=None"]),
    (lambda _: elastic.join_later(SOLUTION, epochs=2, after_epoch=1, echo=False), ["epochs must be at least after_epoch + 2 = 3", "not 2"]),
    (lambda _: elastic.lose_node(SOLUTION, after_epoch=0, echo=False), ["after_epoch must be at least 1"]),
    (lambda _: elastic.lose_node(SOLUTION, how="pause", echo=False), ["'kill' or 'freeze'"]),  # type: ignore[arg-type]
    (lambda _: elastic.join_later("exercises/no_such_file.py", echo=False), ["no_such_file.py is neither here"]),
], ids=["busy-port", "too-few-epochs", "no-epoch-to-resume", "unknown-loss", "no-script"])
def test_bad_input_is_refused_in_one_line_before_anything_starts(call: Callable[[int], object], words: list[str]) -> None:
    """Refused at once: nothing is started (the test is not marked `launch`, so a start would fail it)."""
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises((ValueError, FileNotFoundError)) as refused:
            call(port)
    message = str(refused.value)
    assert "\n" not in message, message
    for word in words:
        assert word.format(port=port) in message, message
