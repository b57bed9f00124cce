"""Launching for real (part 3): the torchrun form of the lab, the kill test, a node that never
arrives, two jobs on one port, the debugging variables, and torchrun's workers cleaned up.

The checks' verdicts on the exercises, their mistakes and other styles are replayed from
recordings in tests/core/test_checks_recorded.py; here the things that only a launch proves."""
from __future__ import annotations

import os
import queue
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_clean_error, left_running, run_python

from autograde.engine import processes
from autograde.engine.verdicts import Failed
from autograde.grading import api
from autograde.parts.launching import notebook as launching

TORCHRUN_SCRIPT = ROOT / "solutions" / "fashion_mnist_torchrun.py"


@pytest.mark.launch
def test_the_kill_test_passes_on_the_solution() -> None:
    """Made for real: rank 1 killed with SIGKILL in the middle of epoch 2 under torchrun
    --max-restarts 3, and rank 0 killed halfway through a save. The restarted group goes on from
    the last complete checkpoint and ends with an undisturbed run's weights; nothing is left."""
    (checkpoint, resume) = api.check_steps(["checkpoint", "resume"], ROOT / "solutions" / "resume_training.py",
                                           fresh=True, quiet=True)
    assert checkpoint.passed is True, checkpoint.observed
    assert resume.passed is True, resume.observed
    assert "went on from epoch 2" in resume.observed and "identical" in resume.observed, resume.observed
    assert not left_running("resume_training.py")


@pytest.mark.launch
def test_the_torchrun_script_refuses_to_run_without_torchrun() -> None:
    assert "RANK" not in os.environ
    result = run_python(TORCHRUN_SCRIPT, "--epochs", "1", timeout=60)
    assert_clean_error(result, "torchrun")


@pytest.mark.launch
def test_a_node_that_never_arrives_fails_in_one_line_at_its_timeout(stand_in: Path) -> None:
    """Rank 0 of a group of 2 started alone, --timeout 3: one clear line after a few seconds, not a hang."""
    env = launching.as_rank(0, 2, processes.free_port())
    result = run_python(TORCHRUN_SCRIPT, "--data-dir", stand_in, "--widen-factor", "1", "--timeout", "3",
                        timeout=60, env=env)
    assert_clean_error(result, "1/2 clients joined")
    assert result.seconds < 40


@pytest.mark.launch
def test_two_jobs_on_one_port_the_second_says_so(stand_in: Path) -> None:
    port = processes.free_port()
    env = launching.as_rank(0, 2, port)
    first = processes.start([processes.PYTHON, TORCHRUN_SCRIPT, "--data-dir", stand_in, "--timeout", "60"], env=env)
    try:
        deadline = time.monotonic() + 60
        while not launching.listening(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        second = run_python(TORCHRUN_SCRIPT, "--data-dir", stand_in, "--timeout", "20", timeout=60, env=env)
    finally:
        first_result = processes.finish(first, 0.1)
    assert_clean_error(second, "address already in use")
    assert not first_result.leftover


@pytest.mark.launch
def test_torch_distributed_debug_detail_names_the_disagreeing_ranks() -> None:
    said = launching.debug_variables()
    assert "Detected mismatch between collectives" in said["TORCH_DISTRIBUTED_DEBUG=DETAIL"]
    assert "TensorShape=[3]" in said["TORCH_DISTRIBUTED_DEBUG=DETAIL"]
    assert "mismatch" not in said["no variable"]


@pytest.mark.launch
def test_a_launch_that_is_stopped_takes_torchruns_workers_with_it(tmp_path: Path) -> None:
    """torchrun starts each worker in a session of its own, outside the launch's process group;
    the launch's mark (processes.MARK) still finds them when the launch is stopped."""
    program = tmp_path / "sleeper.py"
    # One write(2) per line: launches set PYTHONUNBUFFERED, under which print() writes its pieces one by one
    # and the two workers' lines can interleave ("workerworker  76107611").
    program.write_text("import os, time\nos.write(1, f'worker {os.getpid()}\\n'.encode())\ntime.sleep(300)\n")
    proc = processes.start([processes.PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         program], merge_stderr=True)
    lines: queue.Queue[str] = queue.Queue()  # read in a thread: readline() alone would ignore the deadline
    assert proc.stdout is not None
    threading.Thread(target=lambda out: [lines.put(line) for line in out], args=(proc.stdout,), daemon=True).start()
    output: list[str] = []
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            try:
                output.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                break
            workers += [int(pid) for pid in re.findall(r"worker (\d+)", output[-1])]
        assert len(workers) == 2, f"torchrun's workers did not both start within 60 s: {''.join(output)[-3000:]}"
        assert all(os.getsid(w) != os.getsid(proc.pid) for w in workers), "torchrun's workers share the launch's session"
    finally:
        processes.kill_group(proc.pid)
        proc.wait()
    time.sleep(0.5)
    alive = [w for w in workers if _alive(w)]
    assert not alive, f"workers left running: {alive}"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_rank_slow_to_reach_its_barrier_has_not_gone_on() -> None:
    """The checkpoint check's 'went on' is about what a rank did while rank 0 saved, not about when it
    reached its barrier: a rank held up (a loaded machine) does nothing in that time either."""
    from conftest import recorded_trace

    from autograde.parts.launching.checks import _went_on

    # rank 0 saves from t=2 to t=4 (recorded_trace times the events 0, 1, 2, ...)
    late = recorded_trace({"ev": "exit", "call": "all_reduce"}, {"ev": "print", "text": "x"},
                          {"ev": "print", "text": "y"}, {"ev": "print", "text": "z"}, {"ev": "print", "text": "w"},
                          {"ev": "enter", "call": "barrier"}, {"ev": "exit", "call": "barrier"})
    assert _went_on(late, 2, 4) is None
    gone = recorded_trace({"ev": "exit", "call": "all_reduce"}, {"ev": "set_epoch"}, {"ev": "set_epoch"},
                          {"ev": "sampler_iter", "epoch": 2}, {"ev": "loader_iter"})
    went = _went_on(gone, 2, 4)
    assert went is not None and went["ev"] == "sampler_iter"
    leaving = recorded_trace({"ev": "print"}, {"ev": "print"}, {"ev": "print"},
                             {"ev": "enter", "call": "destroy_process_group"})
    assert _went_on(leaving, 2, 4) is not None


def test_a_rank_that_reads_a_checkpoint_being_written_is_told_so_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the read half-file crashes the run, the other rank's collective fails with gloo's
    'Connection reset by peer': the verdict names the read, and the crash that caused the other."""
    from conftest import recorded_trace

    from autograde.engine.run import Run
    from autograde.parts.launching import checks

    path = "/tmp/run/checkpoint.pt"
    joined = {"ev": "exit", "call": "init_process_group", "life": 0}
    writer = recorded_trace({**joined, "rank": 0}, {"ev": "save_enter", "path": path}, {"ev": "enter", "call": "barrier"},
                            {"ev": "save_exit", "path": path}, {"ev": "crash", "error": "RuntimeError: [pair.cc:534] "
                                                                "Connection reset by peer"}, pid=7)
    reader = recorded_trace({**joined, "rank": 1}, {"ev": "wait"}, {"ev": "load_enter", "path": path},
                            {"ev": "crash", "error": "RuntimeError: PytorchStreamReader failed reading zip archive: "
                                                      "failed finding central directory (line 50)"}, pid=8)
    result = processes.Result(returncode=1, stdout="", stderr="", timed_out=False, seconds=9.0, leftover=False)
    run = Run("undisturbed torchrun run", [result], {7: writer, 8: reader}, argv=["--checkpoint", path])
    assert checks.read_while_written(run, path) == "rank 1 read checkpoint.pt while rank 0 was still writing the checkpoint of epoch 1"
    assert "PytorchStreamReader" in (run.problem() or "")  # the cause, not the peer's lost connection
    monkeypatch.setattr(checks, "_whole", lambda ws: run)
    with pytest.raises(Failed) as failed:
        checks.undisturbed(None)  # type: ignore[arg-type]
    assert failed.value.observed.startswith("rank 1 read checkpoint.pt while rank 0 was still writing")
    assert "half a file" in failed.value.observed and failed.value.step == "checkpoint"
