"""`make bench`: speed ratios measured side by side in one run, and how long the step checks and
the notebooks take, as a learner and CI meet them.

First the ratios, each of two things timed in alternating order (A, B, B, A, A, B) on this
machine, the median of the three pairs (autograde/checker/speed.py: the clock starts after the
warm-up steps; a run's time is its slowest rank's):
- the finished lab script with 1 process over the starter (DDP's overhead on one process);
- the finished script with 2 processes over 1 (the speedup check's own measurement);
- demos/speed_fixes.py with the data preloaded as tensors over the DataLoader.
The full run then adds a step's check over the whole `check --all` (a step's latency against all).

Each step is checked in a fresh process (`python -m autograde check --step S --fresh`: no kept
verdicts), on the finished solution; then every step at once (`--all --fresh`), then one step
again without --fresh (answered from the verdicts the runs kept). Last, every notebook runs
under nbval in quick mode with an empty verdict folder, as in CI. The report compares the
median step, the whole run and the notebooks with the course's targets on a 2-core machine:
15 s for one step, 2 minutes for all of them, 10 minutes for all notebooks.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable

from autograde import data, processes, paths, registry
from autograde.checker import speed
from autograde.checker.runs import Family, Workspace
from autograde.protocol import STOP_AT_STEP, TRACE_STEPS
from autograde.checks import scaling
from autograde.tools import nbval_runner

ROOT, SOLUTION = paths.REPO, paths.SOLUTION
STEP_TARGET, ALL_TARGET, NOTEBOOKS_TARGET = 15.0, 120.0, 600.0


def time_check(*args: str, script: Path = SOLUTION) -> float:
    result = processes.run([processes.PYTHON, "-m", "autograde", "check", "--script", str(script), *args],
                        timeout=600, cwd=ROOT, env={"OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        sys.exit(f"error: the check {' '.join(args)} failed on the solution:\n{result.stdout}{result.stderr}")
    return result.seconds


PAIRS, WARMUP, STEPS, BATCH = 3, 3, 30, 32
CORES = str(os.cpu_count() or 1)


def _lab_rate(ws: Workspace, key: str, data_dir: Path, argv: list[str]) -> float:
    """Images per second of a lab script (steps x batch: no DDP needed), stopped after WARMUP + STEPS steps."""
    run = ws.launched(Family.SPEED, key, key, ["--widen-factor", "1", "--batch-size", str(BATCH), "--epochs", "1",
                                 "--target-accuracy", "0", "--data-dir", str(data_dir), *argv],
                      # every core for both (the finished script gives its one process all of them itself;
                      # the starter takes what OMP_NUM_THREADS and MKL_NUM_THREADS allow, 1 by default here)
                      env={TRACE_STEPS: "1", STOP_AT_STEP: str(WARMUP + STEPS), "OMP_NUM_THREADS": CORES,
                           "MKL_NUM_THREADS": CORES})
    if not run.ok:
        sys.exit(f"error: the {key} run failed: {run.problem()}")
    measured = speed.throughput(run, WARMUP)
    return measured.steps * BATCH * measured.processes / measured.seconds


def _alternating(first: Callable[[int], float], second: Callable[[int], float]) -> tuple[float, list[float]]:
    """The median ratio second / first over PAIRS pairs made in alternating order."""
    ratios = [b / a for a, b in speed.alternating(first, second, PAIRS)]
    return statistics.median(ratios), ratios


def _fixes_rate(data_dir: Path, *options: str) -> float:
    result = processes.run([processes.PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         ROOT / "demos" / "speed_fixes.py", "--data-dir", data_dir, "--widen-factor", "1",
                         "--steps", str(STEPS), "--warmup-steps", str(WARMUP), *options],
                        timeout=300, env={"OMP_NUM_THREADS": "1"})
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        sys.exit(f"error: speed_fixes.py {' '.join(options)} failed:\n{result.output[-2000:]}")
    return float(json.loads(lines[-1])["images_per_sec"])


def ratios() -> list[str]:
    """Each ratio as a line of the report (see the module's docstring)."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-") as folder, \
            Workspace(paths.STARTER) as starter, Workspace(SOLUTION) as finished:
        data_dir = Path(folder)
        data.write_synthetic(data_dir, 4096, 64, seed=7)
        ratio, each = _alternating(lambda i: _lab_rate(starter, f"starter-{i}", data_dir, []),
                                   lambda i: _lab_rate(finished, f"solution-{i}", data_dir, ["--num-gpus", "1"]))
        lines.append(f"finished script, 1 process, over the starter: {ratio:.2f} (pairs {_show(each)}; DDP's overhead)")
        with Workspace(ROOT / scaling.STUDY_SOLUTION) as ws:
            found = scaling.measure_speedup(ws, 2, PAIRS, BATCH, 1, WARMUP, STEPS)
        lines.append(f"2 processes over 1 (large_batch_training.py, the speedup check's measure): "
                     f"{speed.median_ratio(found):.2f} (pairs {_show([p.ratio for p in found])})")
        ratio, each = _alternating(lambda i: _fixes_rate(data_dir), lambda i: _fixes_rate(data_dir, "--preload"))
        lines.append(f"data preloaded as tensors over the DataLoader (speed_fixes.py, 2 processes): {ratio:.2f} "
                     f"(pairs {_show(each)})")
    return lines


def _show(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.tools.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=SOLUTION, help="the script to check (a correct one)")
    parser.add_argument("--ratios-only", action="store_true", help="only the speed ratios (a few minutes)")
    args = parser.parse_args(argv)
    measured = ratios()
    print("\n".join(measured), flush=True)
    if args.ratios_only:
        return 0
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
    print(f"one step's latency over all steps: {median:.1f} s / {every:.1f} s = {median / every:.2f}")
    print("\n".join(measured))
    print(f"all {len(names)} notebooks under nbval, quick mode: {run.seconds:.1f} s: "
          f"{run.seconds / NOTEBOOKS_TARGET:.2f} x the {NOTEBOOKS_TARGET:.0f} s target")
    return 0 if median <= STEP_TARGET and every <= ALL_TARGET and run.seconds <= NOTEBOOKS_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
