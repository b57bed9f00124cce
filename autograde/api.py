"""The step checks from Python: for notebook cells and nbgrader grade cells."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from autograde import checks
from autograde.runs import Workspace


def normalise(step: str | int | float) -> str:
    """'6.5', 6.5, 4, '4' and 'Optional' as the names the checks use."""
    text = str(step).strip().lower()
    if text.endswith(".0"):
        text = text[:-2]
    if text not in checks.STEPS:
        raise ValueError(f"unknown step {step!r}: choose from {', '.join(checks.STEPS)}")
    return text


def check_steps(steps: Sequence[str | int | float] | None = None, script: str | Path | None = None,
                procs_per_node: int = 2, nodes: int = 2) -> list[checks.Result]:
    """Check the given steps (all of them if None) of `script`; one verdict per step, in lab order."""
    wanted = {normalise(s) for s in steps} if steps else set(checks.STEPS)
    path = checks.script_path(script)
    if not path.is_file():
        raise FileNotFoundError(f"no script at {path}: pass script='path/to/fashion_mnist.py'")
    import torch  # only for the device: the checker never imports the learner's script
    with Workspace(path, procs_per_node, nodes, on_gpu=torch.cuda.device_count() >= 2) as ws:
        return [checks.check(ws, step) for step in checks.STEPS if step in wanted]


def assert_step(step: str | int | float, script: str | Path | None = None) -> checks.Result:
    """Raise AssertionError with the failure's message unless `step` passes (or cannot apply here)."""
    (result,) = check_steps([step], script)
    if result.passed is False:
        raise AssertionError(f"Step {result.step}: {result.observed}" + (f". Hint: {result.hint}" if result.hint else ""))
    return result
