"""Part launching (notebooks 14-16) inside the learner's processes: checkpoints traced, the faults
the checker injects, and the SLURM jobs' tasks.

- torch.save, torch.load, os.replace and os.rename are traced: who wrote and read which file, when,
  and which temporary file became which checkpoint. On request, faults are injected in the first
  life of a torchrun group: a save slowed down ($DDP_LAB_SLOW_SAVE), a process killed halfway
  through writing ($DDP_LAB_TEAR_SAVE) or right after an optimizer step ($DDP_LAB_KILL_AT_STEP).
- `slurm_task` (a SlurmTask): one task of the
  slurm_env check's job runs the learner's file as `__main__` and writes down, when it joins its
  group, the task's SLURM variables and the PyTorch variables it joins with (`DIR/slurm-<task>.json`).
- `slurm_probe` (a SlurmProbeTask): the $TRAIN_SCRIPT of the slurm_job
  check's jobs: each task writes down its variables in its trace folder (`slurm-<task>.json`),
  then joins a gloo group with env:// and makes one all_reduce; with $DDP_LAB_SLURM_FAIL set, the
  job's last task fails at its start instead.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from autograde.inprocess import tracer
from autograde.parts.launching.reports import TORCH_VARIABLES, SlurmProbeTask, SlurmTask
from autograde.protocol import performs
from autograde.settings import KILL_AT_STEP, SLOW_SAVE, SLURM_FAIL, TEAR_SAVE, TRACE_DIR


def _target(f: Any) -> str | None:
    """The file a torch.save/torch.load reads or writes, as an absolute path (None: in memory)."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) else None


def _targeted(spec: str, count: int) -> bool:
    """Whether a fault "<rank>:<n>" is meant for this process now: its rank, at its n-th step or
    save (`count`), in the group's first life (a restarted group must be left to recover)."""
    return bool(spec) and tracer.life() == 0 and [tracer.rank(), count] == [int(x) for x in spec.split(":")]


def _trace_checkpoints() -> None:
    """torch.save, torch.load, os.replace and os.rename, traced: who wrote and read which file,
    when, and which temporary file became which checkpoint. Faults are injected here on request
    (SLOW_SAVE, TEAR_SAVE): a save slowed down, and a process killed halfway through writing."""
    import io

    import torch

    original_save, original_load = torch.save, torch.load
    tear = os.environ.get(TEAR_SAVE, "")
    tear_rank, tear_at, checkpoint = tear.split(":", 2) if tear else ("", "", "")
    complete = [0]  # checkpoints this process completed: saved straight into the file, or renamed onto it

    def completed(path: str | None) -> None:
        if checkpoint and path == os.path.abspath(checkpoint):
            complete[0] += 1

    @functools.wraps(original_save)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _target(f)
        tracer.emit("save_enter", path=path)
        if os.environ.get(SLOW_SAVE):
            time.sleep(float(os.environ[SLOW_SAVE]))
        if tear and _targeted(f"{tear_rank}:{int(tear_at) - 1}", complete[0]):
            buffer = io.BytesIO()
            original_save(obj, buffer, *args, **kwargs)
            half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
            if path is not None and not hasattr(f, "write"):
                with open(path, "wb") as out:
                    out.write(half)
                    out.flush()
                    os.fsync(out.fileno())
            elif hasattr(f, "write"):
                f.write(half)
                f.flush()
            tracer.emit("killed", path=path)
            os.kill(os.getpid(), signal.SIGKILL)
        result = original_save(obj, f, *args, **kwargs)
        tracer.emit("save_exit", path=path)
        completed(path)
        return result

    @functools.wraps(original_load)
    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _target(f)
        tracer.emit("load_enter", path=path, map_location=repr(kwargs.get("map_location", args[0] if args else None)))
        try:
            result = original_load(f, *args, **kwargs)
        except BaseException as err:  # a load that raised (no file yet, say) has ended all the same
            tracer.emit("load_exit", path=path, error=f"{type(err).__name__}: {err}"[:200])
            raise
        tracer.emit("load_exit", path=path)
        return result

    torch.save, torch.load = save, load
    for name in ("replace", "rename"):
        original = getattr(os, name)

        def make(original: Callable[..., Any], name: str) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(src, dst, *args, **kwargs)
                if isinstance(src, (str, os.PathLike)) and isinstance(dst, (str, os.PathLike)):
                    tracer.emit("moved", src=os.path.abspath(os.fspath(src)), dst=os.path.abspath(os.fspath(dst)))
                    completed(os.path.abspath(os.fspath(dst)))
                return result
            return wrapper

        setattr(os, name, make(original, name))


def _kill_at_step(optimizer: Any) -> None:
    if _targeted(os.environ.get(KILL_AT_STEP, ""), tracer.optimizer_steps()):  # that rank, after that step
        tracer.emit("killed", steps=tracer.optimizer_steps())
        os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """Trace checkpoints, and inject the faults the environment asks for."""
    _trace_checkpoints()
    if os.environ.get(KILL_AT_STEP):
        tracer.hook("optimizer_step", _kill_at_step, last=True)  # after what the other parts trace of the step


def _write_task_variables(folder: str) -> str:
    """Write down this SLURM task's SLURM variables and the PyTorch variables it has, in
    `folder/slurm-<task>.json`; the task's number."""
    seen: dict[str, str | None] = {k: v for k, v in os.environ.items() if k.startswith("SLURM")}
    seen.update({k: os.environ.get(k) for k in TORCH_VARIABLES})
    task = os.environ.get("SLURM_PROCID", "0")
    Path(folder, f"slurm-{task}.json").write_text(json.dumps(seen))
    return task


@performs(SlurmTask)
def slurm_task(task: SlurmTask, out: str) -> None:
    """One task of the checker's job: run the learner's file as `__main__`; when it joins the
    group, write down the task's SLURM variables and the PyTorch variables it joins with
    (`out/slurm-<task>.json`)."""
    script = task.script
    import torch.distributed as dist

    traced = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        _write_task_variables(out)
        return traced(*args, **kwargs)

    dist.init_process_group = init_process_group
    sys.argv = [script]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")


PROBE_GROUP_TIMEOUT = 60.0  # seconds a probe task waits in init_process_group for the others


@performs(SlurmProbeTask)
def slurm_probe(task: SlurmProbeTask, out: str) -> None:
    """The checker's $TRAIN_SCRIPT for the learner's batch script (stdlib and torch only)."""
    number = _write_task_variables(os.environ[TRACE_DIR])
    if os.environ.get(SLURM_FAIL) and int(number) == int(os.environ.get("SLURM_NTASKS", "1")) - 1:
        sys.exit("the checker's probe: task " + number + " fails on purpose")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=PROBE_GROUP_TIMEOUT))
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()

