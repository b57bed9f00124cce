"""What the notebooks of the part "how processes talk" call: launching an exercise with N
processes and timing it, and the checker's runner of collectives and rings (all through lab.run:
output in the cell, a time limit, nothing left running)."""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

from autograde import processes, paths
from autograde.learner_processes import tasks as functions
from autograde.protocol import CollectivesReport, RingReport
from autograde.notebook import lab


def exercise(name: str) -> Path:
    """The learner's exercise file, exercises/<name>, found from the notebook's folder."""
    return lab.course_file(f"exercises/{name}").resolve()


def launch_exercise(name: str, *args: str | int, echo: bool = True) -> tuple[str, float]:
    """`python exercises/<name> ARGS`, as in a terminal: its output, and its wall time in seconds."""
    started = time.perf_counter()
    text = lab.run([processes.PYTHON, exercise(name), *map(str, args)], timeout=300 if lab.QUICK else 1800, echo=echo)
    return text, time.perf_counter() - started


def wall_times(name: str, world_sizes: list[int], *args: str | int) -> dict[int, float]:
    """The wall time of `python exercises/<name> --world-size N ARGS` for each N (one run each)."""
    seconds = {}
    for n in world_sizes:
        _, seconds[n] = launch_exercise(name, "--world-size", n, *args, echo=False)
        print(f"--world-size {n}: {seconds[n]:.1f} s")
    return seconds


def backends(world_sizes: list[int]) -> dict[int, str]:
    """The backend the exercises' runs use with each number of processes: NCCL where this machine
    has a GPU for every process, gloo otherwise (the exercises' own rule). On a GPU node, small
    runs are NCCL's and larger ones gloo's: their times are fitted apart."""
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {n: "nccl" if gpus >= n else "gloo" for n in world_sizes}


def _call(task: str, *options: str | Path, timeout: float) -> list[dict[str, Any]]:
    """The checker's runner (autograde/learner_processes/tasks.py) made to do `task` in processes of
    its own, through lab.run (a time limit, nothing left running): what each rank reported."""
    with tempfile.TemporaryDirectory() as out:
        lab.run([processes.PYTHON, "-m", "autograde.learner_processes.tasks", task, *map(str, options), "--out", out],
                timeout=timeout, echo=False, env={"PYTHONPATH": str(paths.REPO), "OMP_NUM_THREADS": "1"})
        return functions.read_reports(Path(out))


def ring_times(world_sizes: list[int], sizes: list[int], repeats: int = 5) -> dict[int, dict[int, tuple[float, float]]]:
    """Time the learner's ring_all_reduce (exercises/ring_allreduce.py) beside dist.all_reduce:
    seconds[N][floats] = (ring, all_reduce), each the median of `repeats` calls, slowest rank's.
    The calls are made by the checker's runner (autograde/learner_processes/tasks.py), in processes of
    their own; a ring that gives wrong results is said so (its times mean little)."""
    reports = [RingReport.from_json(r) for r in _call("ring", "--script", exercise("ring_allreduce.py"),
                                                      "--world-sizes", *map(str, world_sizes), "--sizes",
                                                      *map(str, sizes), "--repeats", str(repeats), "--ops", "sum",
                                                      timeout=600)]
    seconds: dict[int, dict[int, tuple[float, float]]] = {}
    for report in reports:
        for case in report.cases:
            ring, reference = seconds.setdefault(report.world_size, {}).get(case.numel, (0.0, 0.0))
            seconds[report.world_size][case.numel] = (max(ring, case.seconds), max(reference, case.reference_seconds))
    wrong = sorted({r.world_size for r in reports for c in r.cases if c.error > 1e-5})
    if wrong:
        print(f"careful: your ring's results differ from dist.all_reduce's with {wrong} processes; its times mean little")
    return seconds


def arrival_orders(runs: int | None = None, world_size: int = 4) -> list[list[int]]:
    """Run demos/hello_ranks.py `runs` times (3; 2 in quick mode) and note the order of the
    ranks' hello lines."""
    orders = []
    for k in range(runs or (2 if lab.QUICK else 3)):
        text, _ = launch_exercise("hello_ranks.py", "--world-size", world_size, echo=k == 0)
        orders.append([int(m.group(1)) for m in re.finditer(r"hello from rank (\d+)", text)])
        print(f"run {k + 1}: ranks in the order {orders[-1]}")
    return orders


def collectives() -> dict[str, list[list[list[float]]]]:
    """Every collective of the course's scenarios (autograde/learner_processes/tasks.py, SCENARIOS),
    made for real on 4 processes: buffers[name][rank] = [before, after]."""
    reports = sorted((CollectivesReport.from_json(r) for r in _call("collectives", "--world-sizes", "4", timeout=300)),
                     key=lambda r: r.rank)
    return {name: [r.buffers[name] for r in reports] for name in reports[0].buffers}
