"""How a run's ending is told, on recorded traces (no launch: these are the words, not the runs)."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import recorded_trace

from autograde import protocol as formats
from autograde.engine import processes
from autograde.engine.run import Run, progress

JOINED = [{"ev": "enter", "call": "init_process_group"}, {"ev": "exit", "call": "init_process_group", "rank_joined": 0}]


def _stalled(*process_traces: formats.ProcessTrace) -> Run:
    result = processes.Result(returncode=-9, stdout="", stderr="", timed_out=False, seconds=13.0, leftover=False)
    return Run("two-node run", [result], {t.pid: t for t in process_traces}, stalled=True)


def test_a_stall_inside_a_collective_names_the_call_and_its_line() -> None:
    run = _stalled(recorded_trace(*JOINED, {"ev": "enter", "call": "barrier", "line": 170}, pid=7))
    assert run.problem() == ("the two-node run deadlocked (nothing happened for 12 s or more): "
                             "waiting were rank 0 in dist.barrier() (line 170)")


def test_a_stall_outside_any_collective_says_what_each_process_did_last() -> None:
    """A hang after the last collective (at exit, say) is told apart from one before the first."""
    run = _stalled(recorded_trace(*JOINED, {"ev": "enter", "call": "destroy_process_group"},
                                  {"ev": "exit", "call": "destroy_process_group"}, pid=7),
                   recorded_trace({"ev": "spawn", "nprocs": 1}, pid=8))
    problem = run.problem()
    assert problem is not None and "no process was in a torch.distributed call" in problem
    assert "rank 0: dist.destroy_process_group() returned" in problem and "process 8: spawn" in problem
    assert run.outside_cause() is None  # a deadlock is the script's, and is not made again


def test_a_long_run_says_how_far_its_processes_have_got() -> None:
    """The line a run prints every HEARTBEAT seconds: the processes, and what the one furthest
    along did last (its last printed line, a known stage, or its last call)."""
    joined = {"ev": "exit", "call": "init_process_group", "rank_joined": 1}
    assert progress({}).startswith("starting the processes")
    launcher = recorded_trace({"ev": "spawn"}, pid=3)
    assert progress({3: launcher}) == "1 process running; the first process started the others (mp.spawn)"
    worker = recorded_trace(joined, {"ev": "print", "text": "epoch 2: loss 0.41"}, {"ev": "step", "n": 14}, pid=4)
    said = progress({3: launcher, 4: worker})
    assert said == "2 processes running, 14 optimizer steps; rank 1 printed 'epoch 2: loss 0.41'", said


def _port_taken(*process_traces: formats.ProcessTrace) -> Run:
    result = processes.Result(returncode=1, stdout="", stderr="RuntimeError: ... EADDRINUSE: address already in use",
                              timed_out=False, seconds=4.0, leftover=False)
    return Run("job with the layout the script asks for", [result], {t.pid: t for t in process_traces})


def claims(rank: object, env_rank: object, pid: int, lasting: int = 3) -> formats.ProcessTrace:
    """A process that sets out to join as `rank` (given to init_process_group) or `env_rank` (RANK)."""
    enter = {"ev": "enter", "call": "init_process_group", "rank": rank, "env_rank": env_rank}
    return recorded_trace(enter, *[{"ev": "print", "text": "..."}] * lasting, pid=pid)


def test_a_port_taken_by_the_runs_own_processes_is_the_scripts_doing() -> None:
    """Two tasks told the same rank both host rank 0's store on one port: the learner's mistake (a batch
    script that expanded the variables once, say), judged as such, not made again and blamed on the checker."""
    same = _port_taken(claims(None, "0", pid=5), claims(None, "0", pid=6))
    assert same.one_rank_twice() == 0 and same.outside_cause() is None
    given = _port_taken(claims(1, None, pid=5), claims(1, "3", pid=6))  # the rank given wins over RANK
    assert given.one_rank_twice() == 1 and given.outside_cause() is None
    first, second = claims(None, "0", pid=5, lasting=0), claims(None, "0", pid=6, lasting=0)
    second.events = [{**e, "t": e["t"] + 0.05} for e in second.events]  # each died inside init_process_group
    assert _port_taken(first, second).one_rank_twice() == 0
    distinct = _port_taken(claims(None, "0", pid=5), claims(None, "1", pid=6))
    assert distinct.one_rank_twice() is None
    assert distinct.outside_cause() == "a port it was given was taken by another program"


def test_ranks_claimed_again_after_a_restart_are_not_claimed_twice() -> None:
    """torchrun's restarted group claims the ranks of the group it replaces, one life after the other."""
    first, restarted = claims(None, "0", pid=5, lasting=1), claims(None, "0", pid=6)
    restarted.events = [{**e, "t": e["t"] + 10} for e in restarted.events]
    assert _port_taken(first, restarted).one_rank_twice() is None


def test_a_run_whose_first_try_failed_is_made_again_from_an_empty_folder(tmp_path: Path) -> None:
    """at_once goes on past a maker that failed; the check then asks for the run itself, and the
    folder of the failed try is in the way: that second try must start afresh, and fail or pass on
    its own (under load it once failed with FileExistsError, blamed on the checker)."""
    from autograde.engine.workspace import RunKind, Workspace

    ws = Workspace(tmp_path / "fashion_mnist.py")
    tries: list[Path] = []

    def commands(folder: Path) -> list[list[str]]:
        (folder / "left by this try").write_text("")
        tries.append(folder)
        raise RuntimeError(f"try {len(tries)} failed")

    try:
        for n in (1, 2):
            with pytest.raises(RuntimeError, match=f"try {n} failed"):
                ws.once(RunKind("pi"), "2", "the run with 2 processes", commands, [])
            assert [p.name for p in tries[-1].iterdir()] == ["left by this try"]  # the first try's file is gone
    finally:
        ws.close()
