"""`make bench`: how long the step checks take, as a learner meets them.

Each step is checked in a fresh process (`python -m autograde check --step S`), as the
notebook's check cell does, on the finished solution; then every step at once (`--all`).
The report compares the median step and the whole run with the course's targets:
15 s for one step, 2 minutes for all of them, on a 2-core machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from autograde import checks, launch

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "fashion_mnist_solution.py"
STEP_TARGET, ALL_TARGET = 15.0, 120.0


def time_check(*args: str, script: Path = SOLUTION) -> float:
    result = launch.run([launch.PYTHON, "-m", "autograde", "check", "--script", str(script), *args],
                        timeout=600, cwd=ROOT, env={"OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        sys.exit(f"error: the check {' '.join(args)} failed on the solution:\n{result.stdout}{result.stderr}")
    return result.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=SOLUTION, help="the script to check (a correct one)")
    args = parser.parse_args(argv)
    times = {}
    for step in checks.STEPS:
        times[step] = time_check("--step", step, script=args.script)
        print(f"step {step:<8} {times[step]:6.1f} s", flush=True)
    every = time_check("--all", script=args.script)
    median = statistics.median(times.values())
    print(f"\none step, median {median:.1f} s (slowest: step {max(times, key=times.__getitem__)}, "
          f"{max(times.values()):.1f} s): {median / STEP_TARGET:.2f} x the {STEP_TARGET:.0f} s target")
    print(f"--all {every:.1f} s: {every / ALL_TARGET:.2f} x the {ALL_TARGET:.0f} s target")
    return 0 if median <= STEP_TARGET and every <= ALL_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
