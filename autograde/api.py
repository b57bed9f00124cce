"""The step checks from Python: for notebook cells and nbgrader grade cells."""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Sequence

from autograde import cache, checks
from autograde.runs import Workspace

Step = str | int | float


def normalise(step: Step) -> str:
    """'6.5', 6.5, 4, '4' and 'Optional' as the names the checks use."""
    text = str(step).strip().lower()
    if text.endswith(".0"):
        text = text[:-2]
    if text not in checks.STEPS:
        raise ValueError(f"unknown step {step!r}: choose from {', '.join(checks.STEPS)}")
    return text


def gpu_count() -> int:
    """GPUs that PyTorch can use here. Without GPU device files there are none, and the answer
    comes without importing torch (seconds, in every notebook kernel that checks a step)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not (glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd")):
        return 0
    import torch  # only for the device: the checker never imports the learner's script

    return torch.cuda.device_count()


def check_steps(steps: Sequence[Step] | None = None, script: str | Path | None = None,
                procs_per_node: int = 2, nodes: int = 2, fresh: bool = False) -> list[checks.Result]:
    """Check the given steps (all of them if None) of `script`; one verdict per step, in lab order.

    Verdicts already known for this exact file and layout are reused (see autograde/cache.py),
    unless `fresh`; the runs made for the steps asked also answer, and keep, every other step
    that reads only those runs.
    """
    wanted = [s for s in checks.STEPS if s in ({normalise(s) for s in steps} if steps else set(checks.STEPS))]
    path = checks.script_path(script)
    if not path.is_file():
        raise FileNotFoundError(f"no script at {path}: pass script='path/to/fashion_mnist.py'")
    layout = (procs_per_node, nodes, gpu_count() >= 2)
    known = {} if fresh else cache.load(path, *layout)
    if any(step not in known for step in wanted):
        with Workspace(path, procs_per_node, nodes, on_gpu=layout[2]) as ws:
            for step in wanted:
                known[step] = checks.check(ws, step)
            for step in checks.answered_by(set(ws.made())):
                if step not in known:
                    known[step] = checks.check(ws, step)
            if not ws.ran_out_of_time:
                cache.save(path, *layout, known)
    return [known[step] for step in wanted]


def assert_step(step: Step, script: str | Path | None = None, procs_per_node: int = 2,
                nodes: int = 2) -> None:
    """Print the verdict on `step`; raise AssertionError with what is wrong unless it passes (or
    cannot apply here). For check cells and grade cells, which must show no return value.

    `procs_per_node` and `nodes` choose the simulated layout of Steps 3-9 (default 2 x 2).
    """
    (result,) = check_steps([step], script, procs_per_node, nodes)
    if result.passed is False:
        raise AssertionError(f"Step {result.step}: {result.observed}" + (f". Hint: {result.hint}" if result.hint else ""))
    print(f"Step {result.step}: {result.status}: {result.observed}")


def report(results: Sequence[checks.Result]) -> str:
    """The verdicts as the command line prints them: a line per step, a hint under a failure."""
    return "\n".join(f"Step {r.step:<8} {r.status:<4}  {r.observed}" + (f"\n{'':15}hint: {r.hint}" if r.hint else "")
                     for r in results)


def progress(script: str | Path | None = None) -> list[checks.Result]:
    """Print every step's verdict at once, and how many of the graded steps pass."""
    results = check_steps(None, script)
    graded = [r for r in results if r.step != "optional"]
    print(report(results))
    print(f"\n{sum(r.passed is True for r in graded)} of {len(graded)} steps pass"
          + ("" if all(r.passed for r in graded) else f"; next: Step {next(r.step for r in graded if not r.passed)}"))
    return results
