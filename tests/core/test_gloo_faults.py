"""The two faults of gloo itself that the course forgives a launch, once (processes.GLOO_FAULTS): a
process aborted as it leaves, and a connection found closed as the processes meet. Both are rare
(once each in a CI run of the suite), so each is played by a script that fails with its sign on
its first run and succeeds on the second; a script failing in any other way must still fail. They
are tried in each place that forgives them: the tests' run_script, the notebooks' runtime.run, and the
checker's judgement of a learner's run (Run.outside_cause)."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Sequence

import pytest
from conftest import recorded_trace, run_script

from autograde.engine import processes
from autograde.engine.run import Run
from autograde.jupyter import runtime

# What each fault printed in CI (the mesh line shortened to its parts that matter), and how it ended.
ABORT = (processes.TEARDOWN_ABORT, "os.abort()")
MESH = ("RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
        "tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:44740. This is typically caused by a remote "
        "worker crashing.", "sys.exit(1)")
FAULTS = pytest.mark.parametrize("fault", [ABORT, MESH], ids=["teardown_abort", "mesh"])


def _fails_first(tmp_path: Path, message: str, ending: str) -> Path:
    """A script that prints `message` to stderr and ends with `ending` on its first run, then succeeds."""
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys\n"
        f"mark = {str(tmp_path / 'ran')!r}\n"
        "if not os.path.exists(mark):\n"
        "    open(mark, 'w').close()\n"
        f"    sys.stderr.write({message!r} + '\\n'); sys.stderr.flush(); {ending}\n"
        "print('done')\n")
    return script


@pytest.mark.launch
@FAULTS
def test_the_tests_make_such_a_run_once_more(tmp_path: Path, fault: tuple[str, str]) -> None:
    result = run_script(_fails_first(tmp_path, *fault), timeout=30)
    assert result.returncode == 0 and result.stdout == "done\n", result.output


@pytest.mark.launch
def test_what_the_first_run_recorded_is_gone_when_it_is_made_again(tmp_path: Path) -> None:
    """A test that reads files the processes write (each rank's weights, who printed what) reads the second run's."""
    records = tmp_path / "records"
    records.mkdir()
    script = _fails_first(tmp_path, MESH[0], "sys.exit(1)")
    script.write_text(f"import os\nopen(os.path.join({str(records)!r}, str(os.getpid())), 'w').close()\n"
                      + script.read_text())
    result = run_script(script, timeout=30, records=[records])
    assert result.returncode == 0 and len(list(records.iterdir())) == 1, result.output


@pytest.mark.launch
def test_any_other_failure_stands(tmp_path: Path) -> None:
    result = run_script(_fails_first(tmp_path, "Assertion failed: weights differ", "os.abort()"), timeout=30)
    assert result.returncode == -signal.SIGABRT and "weights differ" in result.stderr, result.output


@pytest.mark.launch
@FAULTS
def test_a_notebook_cell_makes_it_once_more_and_says_why(tmp_path: Path, fault: tuple[str, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    text = runtime.run([processes.PYTHON, _fails_first(tmp_path, *fault)], timeout=30)
    why = processes.gloo_fault(fault[0])
    assert why and text.endswith("done\n")
    assert f"({why}: a rare PyTorch fault, not this script's doing; running it once more)" in capsys.readouterr().out


@pytest.mark.launch
def test_a_notebook_cell_fails_on_any_other_failure_and_shows_its_hidden_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With echo=False a cell shows nothing while it runs: a failure shows what was hidden."""
    script = _fails_first(tmp_path, "RuntimeError: Gloo connectFullMesh failed with [pair.h:301] Connect timeout",
                          "sys.exit(1)")
    with pytest.raises(runtime.LaunchError, match="Connect timeout"):  # a peer that never came: the script's
        runtime.run([processes.PYTHON, script], timeout=30, echo=False)
    shown = capsys.readouterr().out
    assert "running it once more" not in shown and "Connect timeout" in shown


def _recorded(returncode: int, output: str = "", crashes: Sequence[str] = ()) -> Run:
    """A run as the checker records it: its command's exit status and output, and the error that
    each of its processes raised (one process per crash)."""
    result = processes.Result(returncode=returncode, stdout=output, stderr="", timed_out=False, seconds=3.0, leftover=False)
    traces = {pid: recorded_trace({"ev": "crash", "error": error}, pid=pid) for pid, error in enumerate(crashes, 7)}
    return Run("workers run", [result], traces)


def test_the_checker_makes_a_run_again_when_gloo_failed_as_the_processes_met() -> None:
    assert _recorded(1, crashes=[MESH[0], MESH[0]]).outside_cause() == processes.gloo_fault(MESH[0])
    assert _recorded(1, MESH[0]).outside_cause() == processes.gloo_fault(MESH[0])  # the checker's own processes


def test_the_checker_blames_the_script_when_any_process_failed_of_its_own() -> None:
    """A rank that raised on its own can close its connections under the others' handshake: the
    others' mesh failures then follow from the script's error, which is what is judged."""
    assert _recorded(1, crashes=["ValueError: bad batch size (line 40)", MESH[0]]).outside_cause() is None
    assert _recorded(1, crashes=["RuntimeError: Gloo connectFullMesh failed with [pair.h:301] Connect timeout"]
                     ).outside_cause() is None


def test_a_run_that_succeeded_has_nothing_to_make_again() -> None:
    """torchrun can restart a group past a lost connection: what its run printed then is history."""
    assert _recorded(0, MESH[0]).outside_cause() is None


ENFORCE = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
           "gloo/transport/tcp/pair.cc:464] op.preamble.length <= op.nbytes. 2004 vs 2000. Received data size "
           "doesn't match expected size. Is there a distributed collective mismatch in your code?\n")


def test_an_abort_is_the_scripts_unless_its_output_is_one_of_gloos_faults() -> None:
    """A C++ abort leaves no Python crash behind, so 'every crash is gloo's' would hold of it
    vacuously: a message of the wrong size is the script's mistake, gloo's teardown abort is not."""
    assert _recorded(-signal.SIGABRT, ENFORCE).outside_cause() is None
    assert "aborted by PyTorch's C++ code: op.preamble.length" in (_recorded(-signal.SIGABRT, ENFORCE).problem() or "")
    assert _recorded(-signal.SIGABRT, processes.TEARDOWN_ABORT).outside_cause() == processes.gloo_fault(processes.TEARDOWN_ABORT)
    assert _recorded(-signal.SIGKILL).outside_cause() == "a process was killed by signal SIGKILL"  # the OOM killer, say
