"""The lab's central claim, on 2 real gloo processes: DDP with batch b per process is one process with batch 2b."""
from __future__ import annotations

import re

import pytest
from conftest import ROOT, run_script

pytestmark = pytest.mark.launch  # every test here starts processes

SCRIPT = ROOT / "demos" / "big_batch_equivalence.py"


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
