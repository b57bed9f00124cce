"""`make bench`: how long the step checks and the notebooks take, as a learner and CI meet them.

Each step is checked in a fresh process (`python -m autograde check --step S --fresh`: no kept
verdicts), on the finished solution; then every step at once (`--all --fresh`), then one step
again without --fresh (answered from the verdicts the runs kept). Last, every notebook runs
under nbval in quick mode with an empty verdict folder, as in CI. The report compares the
median step, the whole run and the notebooks with the course's targets on a 2-core machine:
15 s for one step, 2 minutes for all of them, 10 minutes for all notebooks.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from autograde import launch, paths, registry
from autograde.tools import nbval_runner

from autograde.tools import nbval_runner

ROOT, SOLUTION = paths.REPO, paths.SOLUTION
STEP_TARGET, ALL_TARGET, NOTEBOOKS_TARGET = 15.0, 120.0, 600.0


def time_check(*args: str, script: Path = SOLUTION) -> float:
    result = launch.run([launch.PYTHON, "-m", "autograde", "check", "--script", str(script), *args],
                        timeout=600, cwd=ROOT, env={"OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        sys.exit(f"error: the check {' '.join(args)} failed on the solution:\n{result.stdout}{result.stderr}")
    return result.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.tools.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=SOLUTION, help="the script to check (a correct one)")
    args = parser.parse_args(argv)
    times = {}
    for step in registry.LAB_STEPS:  # the lab's steps, on the lab's script
        times[step] = time_check("--step", step, "--fresh", script=args.script)
        print(f"step {step:<8} {times[step]:6.1f} s", flush=True)
    every = time_check("--all", "--fresh", script=args.script)
    kept = time_check("--step", "4", script=args.script)
    with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-") as folder:
        course = nbval_runner.learner_copy(Path(folder) / "course", args.script)
        names = sorted(p.name for p in nbval_runner.NOTEBOOKS.glob("*.ipynb"))
        run = nbval_runner.nbval(course / "notebooks", *names, timeout=1800, env={"DDP_LAB_CACHE_DIR": folder})
    if run.returncode != 0:
        sys.exit(f"error: the notebooks failed under nbval:\n{run.stdout[-3000:]}")
    median = statistics.median(times.values())
    print(f"\none step, median {median:.1f} s (slowest: step {max(times, key=times.__getitem__)}, "
          f"{max(times.values()):.1f} s): {median / STEP_TARGET:.2f} x the {STEP_TARGET:.0f} s target")
    print(f"--all {every:.1f} s: {every / ALL_TARGET:.2f} x the {ALL_TARGET:.0f} s target")
    print(f"step 4 again, from kept verdicts: {kept:.1f} s ({kept / median:.2f} x the median cold step)")
    print(f"all {len(names)} notebooks under nbval, quick mode: {run.seconds:.1f} s: "
          f"{run.seconds / NOTEBOOKS_TARGET:.2f} x the {NOTEBOOKS_TARGET:.0f} s target")
    return 0 if median <= STEP_TARGET and every <= ALL_TARGET and run.seconds <= NOTEBOOKS_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
