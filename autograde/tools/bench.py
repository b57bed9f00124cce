"""`make bench`: how long checking and grading take on this machine, against the course's targets,
and speed ratios measured side by side in one run.

Every time is also given as a ratio to the floor, one import of torch in a new interpreter
(`python -c "import torch"`), measured in the same run: no check that launches a process can take
less, and the ratio travels between machines better than seconds do.

- items: each item's check, cold (`python -m autograde check --step ID --fresh`, an empty verdict
  folder, a checker process of its own and so a warm-start server of its own), on its finished file
  (the lab's solution, an exercise's solution): the time, its target, and what took it (the runs
  the check made, each with its time); then `check --all`. Targets, in imports of torch: a lab
  step 4, Step 10 (three runs) 8, an exercise item 9, `check --all` 15. The SLURM items run on the
  course's cluster (brought up for them where there is none).
- grading: one learner's part graded by `make grade` (released from the files as they are, the
  finished files handed in): the seconds grading says it took that learner; target 45 imports.
- ratios: each of two things timed in alternating order (A, B, B, A, A, B), the median of the three
  pairs (autograde/parts/scaling/checks_speed.py: the clock starts after the warm-up steps; a run's time is its
  slowest rank's): the finished lab script with 1 process over the starter (DDP's overhead on one
  process); 2 processes over 1 (the speedup check's own measurement); demos/speed_fixes.py with the
  data preloaded as tensors over the DataLoader.
- notebooks: every notebook under nbval in quick mode with an empty verdict folder, as in CI;
  target 10 minutes.
- capstone: the handed-out baseline and the course's reference solution side by side, timed to the
  target as grading times them (every seed of the rules in force, the full ones unless
  DDP_LAB_CAPSTONE_RULES=reduced or quick mode; the baseline's seeds first, one process, then the
  solution's, one per GPU or 2 on the CPU): each seed's time, the medians and the speedup; target: the
  reference earns both of the class's speedups ($DDP_LAB_CAPSTONE_SPEEDUPS, else the course's), which an
  instructor sets in class.toml from this measurement on the class's own machines.

    python -m autograde.tools.bench [--only items grading ratios notebooks capstone] [--items pi ring]

The exit status is 0 exactly when every target measured is met.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

from autograde import data, settings
from autograde.course import assignment
from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.verdicts import Failed
from autograde.engine.workspace import Workspace
from autograde.grading import api, registry
from autograde.parts.scaling import checks_speed as speed
from autograde.parts.scaling import checks_timed as scaling
from autograde.settings import STOP_AT_STEP, TRACE_STEPS
from autograde.tools import nbval_runner

COURSE = [processes.PYTHON, "-m", assignment.__name__.rpartition(".")[0]]  # `python -m autograde.course`

ROOT, SOLUTION = settings.REPO, settings.SOLUTION


# Targets in imports of torch (the floor, measured in the same run), except the notebooks' (seconds)
STEP_TARGET, LAST_STEP_TARGET, ITEM_TARGET, ALL_TARGET, GRADE_TARGET = 4.0, 8.0, 9.0, 15.0, 45.0
NOTEBOOKS_TARGET = 600.0
SECTIONS = ("items", "grading", "ratios", "notebooks", "capstone")


def check(*args: str, script: Path = SOLUTION, env: dict[str, str] | None = None) -> processes.Result:
    """`python -m autograde check --script SCRIPT ARGS`, as a learner runs it."""
    return processes.run([processes.PYTHON, "-m", "autograde", "check", "--script", str(script), *args],
                         timeout=600, cwd=ROOT, env={"OMP_NUM_THREADS": "1", **(env or {})})


def time_check(*args: str, script: Path = SOLUTION, env: dict[str, str] | None = None) -> float:
    result = check(*args, script=script, env=env)
    if result.returncode != 0:
        sys.exit(f"error: the check {' '.join(args)} failed on the solution:\n{result.stdout}{result.stderr}")
    return result.seconds


def floor() -> float:
    """One import of torch in a new interpreter: the median of three."""
    return processes.torch_import_seconds()


def target(item: registry.Item) -> float:
    """The item's target, in imports of torch."""
    if item.part == registry.FIRST:
        return LAST_STEP_TARGET if item.id == registry.FIRST_ITEMS[-1] else STEP_TARGET
    return ITEM_TARGET


def finished_file(item: registry.Item, lab_script: Path) -> Path:
    return lab_script if item.part == registry.FIRST else ROOT / str(item.checkpoint)


def what_took_it(script: Path, seconds: float) -> str:
    """The runs the last check of `script` made (from its recording), each with its time, and
    what the rest of the time went on."""
    recorded = api.recorded_runs(script)
    if recorded is None:
        return "its runs were not recorded"
    try:
        made = {key: max((r.seconds for r in run.results), default=0.0) for key, run in recorded.made().items()}
        starting = {key: _before_first_event(run, made[key]) for key, run in recorded.made().items()}
    finally:
        recorded.close()
    if not made:
        return "no run: it reads the file"
    each = ", ".join(f"{key} {took:.1f} s ({starting[key]:.1f} s of it before its first traced call)"
                     for key, took in made.items())
    return (f"{len(made)} run{'s' if len(made) > 1 else ''} ({each}); the checker itself "
            f"{max(0.0, seconds - sum(made.values())):.1f} s")


def _before_first_event(run: Run, seconds: float) -> float:
    """How long the run took to reach its first traced call (starting Python, importing torch and
    what the program imports): its time less the span of its trace events."""
    times = [e["t"] for trace in run.traces.values() for e in trace.events]
    return max(0.0, seconds - (max(times) - min(times))) if times else seconds


def line(name: str, seconds: float, floor_s: float, goal: float, detail: str = "") -> str:
    """A line of the report; `goal` in imports of torch."""
    verdict = "met" if seconds <= goal * floor_s else "MISSED"
    return (f"{name:<17} {seconds:6.1f} s  {seconds / floor_s:5.1f} x floor  target {goal:2.0f} x: {verdict:<6}"
            + (f"  {detail}" if detail else ""))


def items(chosen: list[str], lab_script: Path, floor_s: float) -> tuple[list[str], bool]:
    """Each chosen item's cold check on its finished file, then `check --all` on the lab's (when
    every lab step is chosen): a line each, and whether every target was met."""
    lines, met = [], True
    with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-") as verdicts, _slurm() as slurm_env, \
            mock.patch.dict(os.environ, **{settings.CACHE_DIR: verdicts}):  # where this process reads the runs' recordings
        env = {settings.CACHE_DIR: verdicts, **slurm_env}
        for item_id in chosen:
            item = registry.item(item_id)
            script = finished_file(item, lab_script)
            result = check("--step", item.id, "--fresh", "--json", script=script, env=env)
            try:
                status = json.loads(result.stdout)[0]["status"]
            except (ValueError, LookupError):
                status = f"no verdict (exit status {result.returncode})"
            if status == "n/a":
                lines.append(f"{item.id:<17} {result.seconds:6.1f} s  n/a here: not judged on this machine")
                print(lines[-1], flush=True)
                continue
            detail = what_took_it(script, result.seconds) + ("" if status == "pass" else f"; verdict {status}!")
            met = met and result.seconds <= target(item) * floor_s and status == "pass"
            lines.append(line(item.id, result.seconds, floor_s, target(item), detail))
            print(lines[-1], flush=True)
        if set(registry.FIRST_ITEMS) <= set(chosen):
            every = time_check("--all", "--fresh", script=lab_script, env=env)
            met = met and every <= ALL_TARGET * floor_s
            lines.append(line("check --all", every, floor_s, ALL_TARGET, "the lab's steps at once"))
            print(lines[-1], flush=True)
    return lines, met


@contextlib.contextmanager
def _slurm() -> Iterator[dict[str, str]]:
    """The course's SLURM for the SLURM items (none: they are n/a, and say so)."""
    from autograde.cluster import slurm as slurm_cluster

    try:
        with slurm_cluster.available() as env:
            yield env
    except slurm_cluster.ClusterError:
        yield {}


TIME_COLUMN = re.compile(r"^(?P<learner>\S+) +\S+ +(?P<seconds>\d+) s ", re.M)


def grading(part: str, floor_s: float) -> tuple[list[str], bool]:
    """One learner's part, released from the files as they are and handed in finished, graded by
    `make grade`'s own command: the time grading says it took that learner."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-course-") as folder:
        course = Path(folder)
        env = {settings.COURSE_DIR: str(course), "OMP_NUM_THREADS": "1"}
        released = processes.run([*COURSE, "release", "--part", part,
                                  "--from", assignment.WORKING_COPY], timeout=600, cwd=ROOT, env=env)
        if released.returncode != 0:
            sys.exit(f"error: releasing {part} failed:\n{released.output[-2000:]}")
        handed_in = course / "submitted" / "learner" / part
        shutil.copytree(course / "release" / part, handed_in)
        for item in registry.ITEMS:
            if item.part == part and item.checkpoint:
                shutil.copy(ROOT / item.checkpoint, handed_in / item.file)
        graded = processes.run([*COURSE, "grade", "--part", part, "--jobs", "1"],
                               timeout=3600, cwd=ROOT, env=env)
        found = TIME_COLUMN.search(graded.stdout)
        if graded.returncode != 0 or found is None:
            sys.exit(f"error: grading {part} failed:\n{graded.output[-3000:]}")
        seconds = float(found["seconds"])
        score = graded.stdout[found.start():].splitlines()[0].split()[1]
        return [line(f"grading {part}", seconds, floor_s, GRADE_TARGET,
                     f"one learner, score {score} (make grade's own time; {graded.seconds:.0f} s with release "
                     "of feedback and export)")], seconds <= GRADE_TARGET * floor_s


PAIRS, WARMUP, STEPS, BATCH = 3, 3, 30, 32
CORES = str(os.cpu_count() or 1)


def _lab_rate(ws: Workspace, key: str, data_dir: Path, argv: list[str]) -> float:
    """Images per second of a lab script (steps x batch: no DDP needed), stopped after WARMUP + STEPS steps."""
    run = ws.launched(scaling.SPEED_RUNS, key, key, ["--widen-factor", "1", "--batch-size", str(BATCH), "--epochs", "1",
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
            Workspace(settings.STARTER) as starter, Workspace(SOLUTION) as finished:
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


def capstone(floor_s: float) -> tuple[list[str], bool]:
    """The capstone's baseline and reference solution, timed to the target as grading times them: a line
    each, the speedup's line, and whether the reference earns both of the class's speedups."""
    from autograde.parts.capstone import checks as capstone_checks

    r, wanted = capstone_checks.rules(), capstone_checks.speedups()
    solution = ROOT / str(registry.item("time_to_target").checkpoint)
    with Workspace(solution, gpus=processes.gpu_count()) as ws:
        try:
            baselines, solutions = capstone_checks.outcomes(ws)
        except Failed as failed:
            sys.exit(f"error: the reference solution broke the capstone's rules: {failed.observed}")
    lines, medians = [], {}
    for name, outcomes in (("baseline", baselines), ("solution", solutions)):
        times = [o.seconds for o in outcomes]
        if None in times:
            best = ", ".join(f"{min(o.losses, default=math.nan):.3f}" for o in outcomes)
            sys.exit(f"error: the capstone's {name} did not reach the target {r.target} (best losses: {best})")
        each = ", ".join(f"{t:.1f}" for t in times if t is not None)
        median = medians[name] = statistics.median(t for t in times if t is not None)
        lines.append(f"capstone {name:<8} {median:6.1f} s  {median / floor_s:5.1f} x floor  median of {len(times)} "
                     f"seed(s) ({each} s), {outcomes[0].processes} process(es), target loss {r.target}")
    speedup = medians["baseline"] / medians["solution"]
    met = speedup >= max(wanted)
    lines.append(f"capstone speedup {speedup:.2f}: the reference solution over the baseline; the class's speedups "
                 f"{wanted[0]:.2f} and {wanted[1]:.2f}: {'met' if met else 'MISSED (set lower ones in class.toml)'}")
    return lines, met


def _show(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.tools.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=SOLUTION, help="the lab script to check (a correct one)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="the sections to run")
    parser.add_argument("--items", nargs="+", choices=registry.IDS, default=registry.IDS, metavar="ID",
                        help="the items to time (default: every one)")
    parser.add_argument("--grade-part", choices=list(registry.PART), default=registry.FIRST,
                        help=f"the part graded (default {registry.FIRST})")
    args = parser.parse_args(argv)
    floor_s = floor()
    report = [f"floor: one import of torch, {floor_s:.2f} s (median of 3)"]
    print(report[0], flush=True)
    met = True
    if "items" in args.only:
        measured, ok = items(args.items, args.script.resolve(), floor_s)
        report += measured
        met = met and ok
    if "grading" in args.only:
        measured, ok = grading(args.grade_part, floor_s)
        print(measured[0], flush=True)
        report += measured
        met = met and ok
    if "ratios" in args.only:
        measured = ratios()
        print("\n".join(measured), flush=True)
        report += measured
    if "notebooks" in args.only:
        with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-") as folder:
            course = nbval_runner.learner_copy(Path(folder) / "course", args.script)
            names = sorted(p.name for p in nbval_runner.NOTEBOOKS.glob("*.ipynb"))
            run = nbval_runner.nbval(course / "notebooks", *names, timeout=1800, env={settings.CACHE_DIR: folder})
        if run.returncode != 0:
            sys.exit(f"error: the notebooks failed under nbval:\n{run.stdout[-3000:]}")
        report.append(line(f"{len(names)} notebooks", run.seconds, floor_s, NOTEBOOKS_TARGET / floor_s,
                           f"nbval, quick mode; target {NOTEBOOKS_TARGET:.0f} s"))
        met = met and run.seconds <= NOTEBOOKS_TARGET
    if "capstone" in args.only:
        measured, ok = capstone(floor_s)
        print("\n".join(measured), flush=True)
        report += measured
        met = met and ok
    missed = [entry.split()[0] for entry in report if "MISSED" in entry]
    print("\n" + "\n".join(report))
    print("every target met" if met else f"targets missed: {', '.join(missed) or 'a check that did not pass'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
