"""The runtime every notebook of every part uses: this machine's resources, the data to train on,
and launching scripts. (The core lab's figures are in autograde/parts/lab/notebook.py; each later part has its own
module: talk.py, launching.py, scaling.py, inside.py.)

Launches go through `run`, which streams the output into the cell and raises when the command
fails or runs past its time limit. A `!python ...` cell would do neither: it reports success
whatever the exit status, so a broken script would look fine in a notebook and in CI.

DDP_LAB_QUICK=1 (set by `make test` and `make grade`) makes every run tiny: a small stand-in
data set, the narrow model and two epochs, so that all notebooks run in minutes on a CPU.
"""
from __future__ import annotations

import importlib.util
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from autograde import data, settings
from autograde.engine import processes
from autograde.engine.run import HEARTBEAT  # a quiet launch shows it is alive as often as a check's run

QUICK = settings.quick()
processes.warm_launches()  # a notebook's launches start as fast as its checks' runs (engine/processes.py)
QUICK_SIZE = (1024, 256)  # training and validation images of the quick mode's stand-in
SHOWN_ON_FAILURE = 30  # lines of a hidden output (echo=False) that a failed run shows


class LaunchError(RuntimeError):
    """A launched command exited with a non-zero status or ran out of time."""


@dataclass(frozen=True)
class Machine:
    """What this machine offers the lab."""

    torch_version: str
    gpus: list[str]
    cpu_cores: int

    @property
    def max_processes(self) -> int:
        """How many training processes to launch at most: one per GPU, else one per core (at most 4)."""
        return len(self.gpus) if self.gpus else max(1, min(self.cpu_cores, 4))


def machine() -> Machine:
    import torch  # slow: only when asked

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return Machine(torch.__version__, gpus, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)


course_file = settings.course_file  # notebooks: runtime.course_file("exercises/...")


def handed_out(relative: str) -> bool:
    """Whether the learner's folder holds this file of the course: solutions/ comes with the course's
    repository, not with an nbgrader assignment, so a fallback on a solution must ask first."""
    try:
        settings.course_file(relative)
    except FileNotFoundError:
        return False
    return True


def script() -> Path:
    """The learner's fashion_mnist.py (the one the checks look at)."""
    path = settings.learner_script()
    if not path.is_file():
        raise FileNotFoundError(f"no fashion_mnist.py here ({Path.cwd()}) or one folder up")
    return path.resolve()


def data_dir() -> tuple[Path, bool]:
    """Where to train, and whether it is the synthetic stand-in (written on first use).

    Real Fashion-MNIST is used when it is in $DDP_LAB_DATA_DIR (or the course's data/);
    otherwise the stand-in, full size, in data/synthetic; in quick mode a small stand-in.
    """
    if QUICK:
        quick = Path(os.environ.get(settings.QUICK_DATA, Path(os.environ.get("TMPDIR", "/tmp")) / "ddp-lab-quick-data"))
        return data.choose(quick, quick, *QUICK_SIZE, seed=5)[0], True
    real = Path(os.environ[settings.DATA_DIR]) if os.environ.get(settings.DATA_DIR) else _course_data()
    return data.choose(real, say=print)


def _course_data() -> Path:
    try:
        return settings.course_file("Makefile").parent / "data"
    except FileNotFoundError:
        return Path.cwd() / "data"


def environment_report() -> Machine:
    """Print what the lab will run on, and return it."""
    m = machine()
    print(f"PyTorch {m.torch_version}")
    if m.gpus:
        print(f"{len(m.gpus)} GPU(s): {', '.join(m.gpus)}: the lab runs one process per GPU, over NCCL")
    else:
        print("No GPU: the lab runs CPU processes that talk over gloo (real DDP, just slower)")
    print(f"{m.cpu_cores} CPU core(s) for this notebook; training runs here use up to {m.max_processes} processes")
    root, synthetic = data_dir()
    print(f"Data: {'the SYNTHETIC STAND-IN (not Fashion-MNIST)' if synthetic else 'Fashion-MNIST'} in {root}")
    print("Quick mode (DDP_LAB_QUICK): tiny runs, for CI and grading" if QUICK else "Full runs (quick mode is off)")
    return m


def training_args(**overrides: object) -> list[str]:
    """Command-line arguments for a training run of the right size for this machine.

    GPUs: the script's own defaults (the wide model, up to 40 epochs). CPU: the narrow model
    (--widen-factor 1) for 3 epochs. Quick mode: that, for 2 epochs on the small stand-in.
    `overrides` replace or add options: training_args(epochs=5, batch_size=64).
    """
    options: dict[str, object] = {"data_dir": data_dir()[0]}
    if QUICK:
        options.update(widen_factor=1, epochs=2, batch_size=32)
    elif processes.gpu_count() == 0:
        options.update(widen_factor=1, epochs=3)
    options.update(overrides)
    argv: list[str] = []
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv




def run(command: Sequence[str | Path], timeout: float | None = None, echo: bool = True,
        env: dict[str, str] | None = None, cwd: str | Path | None = None) -> str:
    """Run `command`, print its output as it comes, and return it; raise LaunchError when it fails.

    The command gets its own process group, which is killed at the end, at the time limit or
    when the cell is interrupted, so that no training process outlives the cell. A run that
    failed only because of gloo itself (`processes.gloo_fault`: a process aborted as it left,
    a connection lost as the processes met) is made once more, and the cell says so. A failed
    run whose output was not shown (`echo=False`) shows its last lines, so that the cell says
    what happened; while it runs, it says every HEARTBEAT seconds how long it has run and its
    last line so far.
    """
    returncode, seen = _run_once(command, timeout, echo, env, cwd)
    why = processes.gloo_fault("".join(seen)) if returncode != 0 else None
    if why:
        print(f"({why}: a rare PyTorch fault, not this script's doing; running it once more)", flush=True)
        returncode, seen = _run_once(command, timeout, echo, env, cwd)
    if returncode != 0:
        if not echo:
            print("".join(seen[-SHOWN_ON_FAILURE:]), end="", flush=True)
        last = next((line.strip() for line in reversed(seen) if line.strip()), "(no output)")
        raise LaunchError(f"exit status {returncode}: {last}")
    return "".join(seen)


def _run_once(command: Sequence[str | Path], timeout: float | None, echo: bool,
              env: dict[str, str] | None, cwd: str | Path | None) -> tuple[int, list[str]]:
    """One run of `command` for `run`: its exit status and its lines of output."""
    limit = timeout if timeout is not None else (600.0 if QUICK else 24 * 3600.0)
    cmd = [str(c) for c in command]
    proc = processes.start(cmd, env=env, cwd=cwd, merge_stderr=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    started = time.monotonic()
    deadline, next_word = started + limit, started + HEARTBEAT
    try:
        while True:
            if not echo and time.monotonic() >= next_word:  # a quiet run still shows it is alive, and how far
                next_word += HEARTBEAT
                last = next((line.strip() for line in reversed(seen) if line.strip()), "")
                print(f"  ... {time.monotonic() - started:.0f} s" + (f": {last[:100]}" if last else ""), flush=True)
            try:
                line = lines.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise LaunchError(f"stopped after {limit:.0f} s (the time limit): {' '.join(cmd)}") from None
                continue
            if line is None:
                break
            seen.append(line)
            if echo:
                print(line, end="", flush=True)
        proc.wait()
    finally:
        processes.kill_group(proc.pid)
        proc.wait()
    return proc.returncode, seen


def _pump(stream: object, lines: "queue.Queue[str | None]") -> None:
    """Hand the lines of `stream` to the cell's thread, then None at the end."""
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)
    lines.put(None)


TORCHRUN: list[str | Path] = [processes.PYTHON, "-m", "torch.distributed.run"]  # `torchrun`, with this course's Python


def torchrun(script: str, *args: str | int, nproc: int = 2, restarts: int = 0, env: dict[str, str] | None = None,
             timeout: float | None = None) -> str:
    """`torchrun --standalone --nproc-per-node N [--max-restarts K] SCRIPT ARGS`, its output in the cell."""
    options = ["--standalone", "--nproc-per-node", str(nproc)] + (["--max-restarts", str(restarts)] if restarts else [])
    command = [*TORCHRUN, *options, course_file(script).resolve(), *map(str, args)]
    print("$ torchrun " + " ".join(map(str, command[3:])))
    return run(command, timeout=timeout if timeout is not None else (300 if QUICK else None), env=env)


def exercise(path: str) -> ModuleType:
    """Your exercise file as a module, read afresh (its `__main__` block does not run): for the
    notebook to use your functions. The checks never do this: they call them in processes of their own."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, course_file(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a program's JSON-lines log (--log-file), one per epoch."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
