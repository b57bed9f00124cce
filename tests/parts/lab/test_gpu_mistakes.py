"""On NVIDIA GPUs, catalogued mistakes checked for real: each fails its step with its words, and
the one that only the checker's GPU mode shows is caught there. `make gpu-check`
(autograde/tools/gpu_check.py) runs this file with pytest and reports each case; without GPUs the
cases skip (CI has none: tests/core/test_checks_recorded.py covers the mistakes on the CPU)."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SOLUTION
from mistakes import GPU_MISTAKES, MISTAKES

from autograde.engine import processes
from autograde.grading import api
from autograde.parts.lab import runs

CATALOGUE = {m.name: m for m in [*MISTAKES, *GPU_MISTAKES]}
# Step 4's rank arithmetic, the device a process never pins (GPU-only), and Step 6.5's sampler epoch
ON_GPUS = ["rank_is_local_rank", "device_not_pinned", "no_set_epoch"]


@pytest.mark.launch
@pytest.mark.parametrize("name", ON_GPUS)
def test_a_mistake_is_caught_on_gpus(name: str, tmp_path: Path) -> None:
    gpus = processes.gpu_count()
    if gpus == 0:
        pytest.skip("no GPU on this machine: `make gpu-check` runs this on a machine with NVIDIA GPUs")
    mistake = CATALOGUE[name]
    if name in {m.name for m in GPU_MISTAKES} and not any(runs.devices_plan(gpus, 2, 2).values()):
        pytest.skip("shows only in a run on GPUs (2 GPUs or more)")
    script = tmp_path / f"{name}.py"
    script.write_text(mistake.apply(SOLUTION.read_text()))
    (result,) = api.check_steps([mistake.step], script, fresh=True, quiet=True)
    caught = result.passed is False and mistake.expect in result.observed
    assert caught, f"NOT caught (Step {result.step}): {result.observed}"
    print(f"caught (Step {result.step}): {result.observed}")  # the report's detail
