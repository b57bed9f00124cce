"""What notebook 16 (SLURM) calls: a real SLURM on this machine (the course's cluster of emulated
nodes, autograde/cluster/slurm.py, or the system's where there is one), batch scripts
submitted to it and followed to their end, the queue, and a job cancelled. Every command goes
through runtime.run or processes.run: a time limit, the output in the cell, nothing left running."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from autograde.cluster import slurm as slurm_cluster
from autograde.engine import processes
from autograde.jupyter import runtime

_started: list[Path] = []  # the cluster this kernel brought up, to take down again at the end


def slurm_up() -> bool:
    """Make SLURM reachable from this kernel and every command it starts (SLURM_CONF): the system's
    where there is one, else the course's cluster, brought up where it is not running. Shows the
    nodes (`sinfo`); where there can be no SLURM here, says why in one line and returns False."""
    if not slurm_cluster.system_slurm():
        cluster = slurm_cluster.running()
        if cluster is None:
            try:
                started = time.monotonic()
                cluster = slurm_cluster.up()
            except slurm_cluster.ClusterError as err:
                print(f"No SLURM here: {err}. The cells that submit jobs will fail; on a cluster, run them there.")
                return False
            _started.append(cluster.folder)
            print(f"The course's SLURM came up in {time.monotonic() - started:.1f} s.")
        os.environ["SLURM_CONF"] = str(cluster.conf)
    shell("sinfo", "-N", "-o", "%N %T %c %G")
    return True


def slurm_down() -> None:
    """Take down the cluster this kernel brought up (one it found running is left as it was)."""
    while _started:
        slurm_cluster.down(_started.pop())
        os.environ.pop("SLURM_CONF", None)
        print("The course's SLURM is down: every daemon it started has stopped.")


def shell(*command: str) -> str:
    """A SLURM command (sinfo, squeue, scontrol, scancel), shown as typed, its output in the cell."""
    print("$ " + " ".join(command))
    return runtime.run(list(command), timeout=60)


def _folder(batch: str) -> Path:
    """Where sbatch is called from: the course folder that holds `batch` (a learner's checkout, or an
    nbgrader assignment, whose notebooks lie in the folder itself rather than in notebooks/)."""
    return runtime.course_file(batch).resolve().parents[len(Path(batch).parts) - 1]


def _train_env(train_script: str) -> dict[str, str]:
    return {"TRAIN_SCRIPT": str(runtime.course_file(train_script).resolve())}


def sbatch(batch: str, *args: str | int, options: tuple[str, ...] = (),
           train_script: str = "exercises/fashion_mnist_torchrun.py", timeout: float | None = None) -> str:
    """`sbatch OPTIONS BATCH ARGS`, followed to the end of the job (the course's `job` runner): the
    job's output in the cell as it comes; cancelled if the cell is stopped."""
    print(f"$ sbatch {' '.join(options)} {batch} {' '.join(map(str, args))}".replace("  ", " "))
    command: list[str | Path] = [processes.PYTHON, "-m", slurm_cluster.__name__, "job", *options,
               runtime.course_file(batch).resolve(), *map(str, args)]
    return runtime.run(command, timeout=timeout if timeout is not None else (300 if runtime.QUICK else None),
                       env=_train_env(train_script), cwd=_folder(batch))


def submit(batch: str, *args: str | int, options: tuple[str, ...] = (),
           train_script: str = "exercises/fashion_mnist_torchrun.py") -> tuple[str, Path]:
    """`sbatch` as on a cluster: the job is queued and sbatch returns at once. Its id, and the file
    its output goes to (the batch script's #SBATCH --output, here in a folder of its own)."""
    out = Path(tempfile.mkdtemp(prefix="ddp-lab-slurm-out-")) / "%x-%j.out"
    print(f"$ sbatch {' '.join(options)} {batch} {' '.join(map(str, args))}".replace("  ", " "))
    result = processes.run(["sbatch", "--parsable", f"--output={out}", *options, runtime.course_file(batch).resolve(),
                            *map(str, args)], timeout=60, cwd=_folder(batch),
                           env={**_train_env(train_script), **({"SLURM_CONF": os.environ["SLURM_CONF"]}
                                                               if "SLURM_CONF" in os.environ else {})})
    if result.returncode != 0:
        raise runtime.LaunchError(result.output.strip().splitlines()[-1] if result.output.strip() else "sbatch failed")
    job = result.stdout.strip().split(";")[0]
    print(f"Submitted batch job {job}")
    return job, out


def wait_until(job: str, state: str, seconds: float = 60) -> None:
    """Wait until `squeue` shows the job in `state` (RUNNING, ...), or it has left the queue."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        shown = processes.run(["squeue", "-h", "-j", job, "-o", "%T"], timeout=30).stdout.strip()
        if shown in ("", state):
            return
        time.sleep(0.2)
    raise runtime.LaunchError(f"job {job} was not {state} after {seconds:.0f} s")


def wait_for_end(job: str, seconds: float = 60) -> None:
    """Wait until the job has left the queue (`squeue` lists running and waiting jobs only)."""
    wait_until(job, "(gone)", seconds)


def sacct(job: str) -> str:
    """`sacct -j JOB`: the job's accounting record, or what sacct says where SLURM keeps none."""
    print(f"$ sacct -j {job}")
    result = processes.run(["sacct", "-j", job], timeout=60)
    print(result.output.strip())
    return result.output


def signalled(batch: str, *args: str | int, tasks: int, scancel: tuple[str, ...] = ("--signal=USR1",),
              seconds: float = 60) -> str:
    """Submit `batch` (`submit`), wait until its `tasks` tasks have each printed "starting", then
    `scancel SCANCEL JOB`: a signal now, where `#SBATCH --signal` would send it before the time
    limit. Shows the job's output and its end (`squeue --states=all`); returns the output."""
    job, out = submit(batch, *args)
    deadline = time.monotonic() + seconds
    while (len(found := sorted(out.parent.glob(f"*-{job}.out"))) != 1
           or found[0].read_text(errors="replace").count("starting") < tasks):
        if time.monotonic() > deadline:
            shell("scancel", job)
            raise runtime.LaunchError(f"job {job}'s {tasks} tasks had not started after {seconds:.0f} s")
        time.sleep(0.1)
    shell("scancel", *scancel, job)
    wait_for_end(job, seconds)
    text = found[0].read_text(errors="replace")
    print(text, end="")
    shell("squeue", "--states=all", "-j", job, "-o", "%i %T %r")
    return text
