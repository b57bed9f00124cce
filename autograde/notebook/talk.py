"""What the notebooks of the part "how processes talk" call: launching an exercise with N
processes and timing it (through lab.run: output in the cell, a time limit, nothing left running)."""
from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from autograde import launch, paths
from autograde.checker.formats import CollectivesReport, RingReport
from autograde.notebook import lab


def exercise(name: str) -> Path:
    """The learner's exercise file, exercises/<name>, found from the notebook's folder."""
    return lab.course_file(f"exercises/{name}").resolve()


def launch_exercise(name: str, *args: str | int, echo: bool = True) -> tuple[str, float]:
    """`python exercises/<name> ARGS`, as in a terminal: its output, and its wall time in seconds."""
    started = time.perf_counter()
    text = lab.run([launch.PYTHON, exercise(name), *map(str, args)], timeout=300 if lab.QUICK else 1800, echo=echo)
    return text, time.perf_counter() - started


def wall_times(name: str, world_sizes: list[int], *args: str | int) -> dict[int, float]:
    """The wall time of `python exercises/<name> --world-size N ARGS` for each N (one run each)."""
    seconds = {}
    for n in world_sizes:
        _, seconds[n] = launch_exercise(name, "--world-size", n, *args, echo=False)
        print(f"--world-size {n}: {seconds[n]:.1f} s")
    return seconds


def ring_times(world_sizes: list[int], sizes: list[int], repeats: int = 5) -> dict[int, dict[int, tuple[float, float]]]:
    """Time the learner's ring_all_reduce (exercises/ring_allreduce.py) beside dist.all_reduce:
    seconds[N][floats] = (ring, all_reduce), each the median of `repeats` calls, slowest rank's.
    The calls are made by the checker's runner (autograde/checker/functions.py), in processes of
    their own; a ring that gives wrong results is said so (its times mean little)."""
    with tempfile.TemporaryDirectory() as out:
        lab.run([launch.PYTHON, "-m", "autograde.checker.functions", "ring", "--script", exercise("ring_allreduce.py"),
                 "--world-sizes", *map(str, world_sizes), "--sizes", *map(str, sizes), "--repeats", str(repeats),
                 "--ops", "sum", "--out", out], timeout=600, echo=False,
                env={"PYTHONPATH": str(paths.REPO), "OMP_NUM_THREADS": "1"})
        reports = [RingReport.from_json(json.loads(p.read_text())) for p in Path(out).glob("*-*.json")]
    seconds: dict[int, dict[int, tuple[float, float]]] = {}
    for report in reports:
        for case in report.cases:
            ring, reference = seconds.setdefault(report.world_size, {}).get(case.numel, (0.0, 0.0))
            seconds[report.world_size][case.numel] = (max(ring, case.seconds), max(reference, case.reference_seconds))
    wrong = sorted({r.world_size for r in reports for c in r.cases if c.error > 1e-5})
    if wrong:
        print(f"careful: your ring's results differ from dist.all_reduce's with {wrong} processes; its times mean little")
    return seconds


def arrival_orders(runs: int = 3, world_size: int = 4) -> list[list[int]]:
    """Run exercises/hello_ranks.py `runs` times and note the order of the ranks' hello lines."""
    orders = []
    for k in range(runs):
        text, _ = launch_exercise("hello_ranks.py", "--world-size", world_size, echo=k == 0)
        orders.append([int(m.group(1)) for m in re.finditer(r"hello from rank (\d+)", text)])
        print(f"run {k + 1}: ranks in the order {orders[-1]}")
    return orders


def collectives() -> dict[str, list[list[list[float]]]]:
    """Every collective of the course's scenarios (autograde/checker/functions.py, SCENARIOS),
    made for real on 4 processes: buffers[name][rank] = [before, after]."""
    with tempfile.TemporaryDirectory() as out:
        lab.run([launch.PYTHON, "-m", "autograde.checker.functions", "collectives", "--world-sizes", "4", "--out", out],
                timeout=300, echo=False, env={"PYTHONPATH": str(paths.REPO), "OMP_NUM_THREADS": "1"})
        reports = sorted((CollectivesReport.from_json(json.loads(p.read_text())) for p in Path(out).glob("*-*.json")),
                         key=lambda r: r.rank)
    return {name: [r.buffers[name] for r in reports] for name in reports[0].buffers}
