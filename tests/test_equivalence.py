"""The lab's central claim, on 2 real gloo processes: DDP with batch b per process is one process with batch 2b.
And the one thing the tests and the notebooks forgive such a launch: gloo's rare abort as a process leaves
(launch.aborted_leaving; conftest.run_script, lab.run)."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from autograde import launch
from autograde.notebook import lab
from conftest import ROOT, run_script

SCRIPT = ROOT / "exercises" / "big_batch_equivalence.py"


def difference(*args: str) -> float:
    result = run_script(SCRIPT, "--processes", "2", "--batch-size", "8", "--steps", "5", *args, timeout=120)
    assert result.returncode == 0, result.output
    match = re.search(r"largest relative difference between the weights: (\S+)", result.stdout)
    assert match, result.stdout
    return float(match.group(1))


def test_ddp_with_batch_b_equals_one_process_with_batch_2b() -> None:
    assert difference() < 1e-5


def test_batchnorm_in_training_mode_breaks_the_equivalence() -> None:
    # Each process normalises with the statistics of its own 8 samples, not of all 16.
    assert difference("--batchnorm") > 1e-3


def _aborts_first(tmp_path: Path, message: str) -> Path:
    """A script that ends its first run as gloo's teardown abort does (or with `message`), then succeeds."""
    script = tmp_path / "leaves.py"
    script.write_text(
        "import os, sys\n"
        f"mark = {str(tmp_path / 'ran')!r}\n"
        "if not os.path.exists(mark):\n"
        "    open(mark, 'w').close()\n"
        f"    sys.stderr.write({message!r} + '\\n'); sys.stderr.flush(); os.abort()\n"
        "print('done')\n")
    return script


def test_a_teardown_abort_is_made_again_once(tmp_path: Path) -> None:
    result = run_script(_aborts_first(tmp_path, launch.TEARDOWN_ABORT), timeout=30)
    assert result.returncode == 0 and result.stdout == "done\n", result.output


def test_any_other_failure_stands(tmp_path: Path) -> None:
    result = run_script(_aborts_first(tmp_path, "Assertion failed: weights differ"), timeout=30)
    assert result.returncode == -signal.SIGABRT and "weights differ" in result.stderr, result.output


def test_a_notebook_cell_makes_it_again_once_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = lab.run([launch.PYTHON, _aborts_first(tmp_path, launch.TEARDOWN_ABORT)], timeout=30)
    assert text.endswith("done\n") and "running it once more" in capsys.readouterr().out


def test_a_notebook_cell_fails_on_any_other_abort(tmp_path: Path) -> None:
    with pytest.raises(lab.LaunchError, match="weights differ"):
        lab.run([launch.PYTHON, _aborts_first(tmp_path, "Assertion failed: weights differ")], timeout=30)
