"""What the notebooks of the part "how processes talk" call: launching an exercise with N
processes and timing it (through lab.run: output in the cell, a time limit, nothing left running)."""
from __future__ import annotations

import time
from pathlib import Path

from autograde import launch
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
