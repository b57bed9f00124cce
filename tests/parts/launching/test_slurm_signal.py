"""Notebook 16's `#SBATCH --signal=USR1@120`, under a real SLURM (the `slurm` fixture: the course's
cluster of emulated nodes n1, n2): the signal saves a checkpoint only in a task that handles it.
`scancel --signal=USR1 JOB` sends SIGUSR1 to the same processes as `--signal=USR1@SECONDS` does
before the time limit (every process of the job's steps, not the batch shell), and at once, so that
no test waits for a limit: with the handler of demos/slurm/save_on_usr1.py (the file the notebook
shows) each task saves and the step ends cleanly; without it the tasks die, nothing saved. With
`B:` (`scancel --batch`) only the batch shell is signalled, and a shell without a trap dies and
takes its step with it. torchrun, the task of demos/slurm/srun_torchrun_per_node.sbatch, does not
handle SIGUSR1 unless told to (`--signals-to-handle`): it dies of it."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Slurm

from autograde.engine import processes

DEMO = ROOT / "demos" / "slurm" / "save_on_usr1.py"  # the handler the notebook shows
BATCH = ROOT / "demos" / "slurm" / "save_on_usr1.sbatch"  # the batch script it submits
NOTEBOOK = ROOT / "notebooks" / "16_slurm.ipynb"
TASKS = 2


def _signalled(slurm: Slurm, tmp_path: Path, batch: Path, *args: str | Path, scancel: tuple[str, ...] = ()) -> tuple[str, str]:
    """Submit `batch ARGS`, wait until its TASKS training processes have started, signal the job
    with `scancel --signal=USR1 SCANCEL...`, and wait for its end: the job's output and its state."""
    env = processes.child_env({**slurm.env, "OMP_NUM_THREADS": "1"})
    output = tmp_path / "job.out"
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={output}", batch, *args], capture_output=True,
                               text=True, env=env, cwd=ROOT, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while not output.exists() or output.read_text(errors="replace").count("starting at step") < TASKS:
            assert time.monotonic() < deadline, f"the tasks never started: {output.read_text() if output.exists() else ''}"
            time.sleep(0.1)
        subprocess.run(["scancel", "--signal=USR1", *scancel, job], env=env, check=True, timeout=30)
        deadline = time.monotonic() + 90  # on a loaded machine SLURM may take KillWait and more to end a step
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=env, timeout=30).stdout.strip():
            assert time.monotonic() < deadline, f"the job did not end: {output.read_text()}"
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30)  # nothing left running if the test failed
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env, timeout=30)
    state = re.search(r"JobState=(\S+)", shown.stdout)
    return output.read_text(errors="replace"), state.group(1) if state else shown.stdout


def _step(tmp_path: Path, step: str) -> Path:
    """A batch script of TASKS tasks on one node whose one step is `step`."""
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --ntasks-per-node={TASKS}\n{step}\necho \"step ended with $?\"\n")
    return script


def _saved(tmp_path: Path) -> list[int]:
    return sorted(json.loads(p.read_text())["step"] for p in tmp_path.glob("ckpt-*.json"))


@pytest.mark.launch
def test_with_the_handler_every_task_saves_and_the_step_ends_cleanly(slurm: Slurm, tmp_path: Path) -> None:
    """The notebook's batch script (#SBATCH --signal=USR1@120, no B:) and handler: every task
    saves a checkpoint and exits 0, and the job ends COMPLETED."""
    out, state = _signalled(slurm, tmp_path, BATCH, "--checkpoint", tmp_path / "ckpt.json")
    assert out.count("SIGUSR1, saved step") == TASKS, out
    assert state == "COMPLETED", (state, out)
    assert len(_saved(tmp_path)) == TASKS and all(step >= 1 for step in _saved(tmp_path)), out


@pytest.mark.launch
def test_without_a_handler_sigusr1_kills_the_tasks_and_nothing_is_saved(slurm: Slurm, tmp_path: Path) -> None:
    """The same job with the handler left out: srun reports its tasks ended by the signal, the job
    fails, nothing is saved."""
    out, state = _signalled(slurm, tmp_path, BATCH, "--checkpoint", tmp_path / "ckpt.json", "--no-handler")
    assert "User defined signal 1" in out, out  # srun: how its tasks ended
    assert state == "FAILED" and "finished all" not in out, (state, out)
    assert not _saved(tmp_path), out


@pytest.mark.launch
def test_with_b_only_the_batch_shell_is_signalled_and_without_a_trap_it_dies(slurm: Slurm, tmp_path: Path) -> None:
    """`--signal=B:USR1@120` signals the batch shell only (here `scancel --batch`): the tasks' own
    handlers never run, the shell dies of the signal, and SLURM ends its step: nothing saved."""
    step = f"srun python {DEMO} --checkpoint {tmp_path / 'ckpt.json'}"
    out, state = _signalled(slurm, tmp_path, _step(tmp_path, step), scancel=("--batch",))
    assert "SIGUSR1" not in out and "step ended with" not in out, out
    assert state == "FAILED" and not _saved(tmp_path), (state, out)


@pytest.mark.launch
def test_torchrun_by_default_dies_of_sigusr1(slurm: Slurm, tmp_path: Path) -> None:
    """The one-torchrun-per-node launch: torchrun handles SIGTERM, SIGINT, SIGHUP and SIGQUIT only
    (its --signals-to-handle), so the step's task, torchrun itself, is ended by SIGUSR1."""
    # one torchrun (--ntasks=1: the job's TASKS slots are its workers), so that every worker has
    # started, its handler set, before the signal: a second torchrun could still be starting its own
    step = f"srun --ntasks=1 torchrun --nproc-per-node {TASKS} {DEMO} --checkpoint {tmp_path / 'ckpt.json'}"
    out, _ = _signalled(slurm, tmp_path, _step(tmp_path, step))
    assert "User defined signal 1" in out and "step ended with 0" not in out, out


def _markdown(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown")


def test_the_notebook_says_the_signal_needs_a_handler() -> None:
    """Wherever notebook 16 mentions `--signal=`, it shows the handler (the demo) and says what
    happens without one, with `B:` and under torchrun; and no batch script of the course asks for
    a signal that nothing of the course would handle."""
    text = _markdown(NOTEBOOK)
    assert "--signal=USR1@" in text
    for needed in ("B:", "--signals-to-handle", "SIGTERM, SIGINT, SIGHUP and SIGQUIT", "terminate"):
        assert needed in text, needed
    assert "time enough to save a checkpoint first" not in text
    code = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code")
    assert "demos/slurm/save_on_usr1.py" in code and "demos/slurm/save_on_usr1.sbatch" in code  # what the tests run
    for batch in (ROOT / "demos" / "slurm").glob("*.sbatch"):  # a signal asked for only where it is handled
        assert ("--signal" in batch.read_text()) is (batch == BATCH), batch
    assert "signal.signal(signal.SIGUSR1" in DEMO.read_text() and f"python {DEMO.relative_to(ROOT)}" in BATCH.read_text()


def test_torchrun_handles_four_signals_unless_told_otherwise() -> None:
    """What the notebook cites: torchrun's --signals-to-handle defaults to SIGTERM, SIGINT, SIGHUP and
    SIGQUIT (torch/distributed/run.py), and its process context registers a handler for those only
    unless TORCHELASTIC_SIGNALS_TO_HANDLE says more (torch/distributed/elastic/multiprocessing/api.py)."""
    import inspect

    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.run import get_args_parser

    assert get_args_parser().parse_args(["train.py"]).signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    assert '"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"' in inspect.getsource(api.PContext.start)
