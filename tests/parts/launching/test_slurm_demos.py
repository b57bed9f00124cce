"""The SLURM batch scripts of "launching for real" (demos/slurm/) under a real SLURM: the course's
cluster of two emulated nodes n1 and n2 on this machine (autograde/cluster/slurm.py; the
`slurm` fixture of tests/conftest.py), submitted with sbatch through the course's `job` runner.
Both ways (one task per GPU; one torchrun per node) on 1 node and on 2 nodes, the finished script
trains and every rank ends with the same weights; a failing task ends the job
(--kill-on-bad-exit); scancel stops every process; a job past its time limit is signalled, and the
next job resumes from its checkpoint."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Slurm, again_on_gloo_fault

from autograde import data
from autograde.engine import processes

pytestmark = pytest.mark.launch  # every test submits jobs

PER_GPU = ROOT / "demos" / "slurm" / "srun_one_task_per_gpu.sbatch"  # srun: one task per GPU
PER_NODE = ROOT / "demos" / "slurm" / "srun_torchrun_per_node.sbatch"  # srun: one torchrun per node
SCRIPTS = pytest.mark.parametrize("script", [PER_GPU, PER_NODE], ids=["task-per-gpu", "torchrun-per-node"])
FINISHED = ROOT / "solutions" / "fashion_mnist_torchrun.py"
RESUMING = ROOT / "solutions" / "resume_training.py"

# Stands in for the training script (TRAIN_SCRIPT) where a test needs no training: joins the group
# the way the lab's script does (init_process_group from the environment), and writes down what it
# was told and what it saw; with PROBE_FAIL_RANK, that rank fails once another waits for it.
PROBE = """\
import datetime, json, os, sys, time
from pathlib import Path
joining = Path(os.environ["PROBE_OUT"], "joining")
if os.environ.get("PROBE_FAIL_RANK") == os.environ["RANK"]:
    while not joining.exists():  # fails once another rank waits for it in init_process_group
        time.sleep(0.05)
    time.sleep(0.5)
    sys.exit(3)
import torch
import torch.distributed as dist
joining.touch()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
dist.destroy_process_group()
"""

# TRAIN_SCRIPT that runs the real training script ($RECORDED_SCRIPT) as __main__, then writes down
# the process's variables, its place in the group and a digest of the weights it ended with: DDP's
# __init__ is wrapped to keep the model it was given (the script's own names are not needed).
RECORDER = """\
import hashlib, json, os, runpy, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
wrapped, models = DistributedDataParallel.__init__, []
def init(self, module, *args, **kwargs):
    wrapped(self, module, *args, **kwargs)
    models.append(module)
DistributedDataParallel.__init__ = init
script = os.environ["RECORDED_SCRIPT"]
sys.argv = [script, *sys.argv[1:]]
runpy.run_path(script, run_name="__main__")
weights = b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in models[-1].parameters())
seen = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "SLURMD_NODENAME", "SLURM_JOB_ID")}
seen["digest"] = hashlib.sha256(weights).hexdigest()
Path(os.environ["PROBE_OUT"], f"{os.environ['RANK']}.json").write_text(json.dumps(seen))
"""


def layout(script: Path, nodes: int, per_node: int) -> list[str]:
    """sbatch's options for `nodes` x `per_node` training processes on the CPU: as many tasks per
    node as GPUs for the task-per-GPU script, one (torchrun, with the node's CPUs) for the other."""
    tasks, cpus = (per_node, 1) if script == PER_GPU else (1, per_node)
    return [f"--nodes={nodes}", f"--ntasks-per-node={tasks}", f"--gres=gpu:{per_node}", f"--cpus-per-task={cpus}"]


def submit(slurm: Slurm, script: Path, *args: str | Path, nodes: int, per_node: int, env: dict[str, str],
           timeout: float = 120) -> processes.Result:
    """`script` submitted with `nodes` x `per_node` training processes, to the end of its job; made
    once more on a fault of gloo's. A port known to be free: the scripts' default comes from the
    job id, and another program on this machine may hold it."""
    env = {"MASTER_PORT": str(processes.free_port()), "OMP_NUM_THREADS": "1", **env}
    return again_on_gloo_fault(lambda: slurm.job(*layout(script, nodes, per_node), script, *args, env=env,
                                                 timeout=timeout))


def none_left(word: str, seconds: float = 20) -> bool:
    """Whether every process whose command line holds `word` has gone, within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=10).stdout
        if word not in found:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic stand-in for Fashion-MNIST: one epoch takes seconds."""
    root = tmp_path_factory.mktemp("tiny")
    data.write_synthetic(root, 160, 67, seed=3)
    return root


def test_as_written_the_scripts_ask_for_two_nodes_of_four_gpus_and_start_eight_processes(
        slurm: Slurm, tmp_path: Path) -> None:
    """Their own #SBATCH lines, 2 nodes x 4 GPUs, dry: `python` and `torchrun` are stand-ins that
    print what they were given; the job's arguments come through unchanged (one of them has a space)."""
    for name in ("python", "torchrun"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "{name} $RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE '
                                     f'$SLURMD_NODENAME $MASTER_ADDR $*"\n')
        (tmp_path / name).chmod(0o755)
    path = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "MASTER_PORT": "29555"}
    train = "solutions/fashion_mnist_torchrun.py --epochs 5 x"

    result = slurm.job(PER_GPU, "--epochs", "5 x", env=path)
    assert result.returncode == 0 and not result.leftover, result.output
    runs = sorted(line.split(" ", 5) for line in result.stdout.splitlines() if line.startswith("python"))
    assert runs == sorted(["python", f"{rank}/8", f"{rank % 4}/4", f"n{rank // 4 + 1}", "n1", train]
                          for rank in range(8)), result.output

    result = slurm.job(PER_NODE, "--epochs", "5 x", env=path)
    assert result.returncode == 0 and not result.leftover, result.output
    runs = sorted(line for line in result.stdout.splitlines() if line.startswith("torchrun"))
    assert len(runs) == 2, result.output
    for node, run in zip(["n1", "n2"], runs):
        assert run.startswith(f"torchrun / / {node} n1 --nnodes 2 --nproc-per-node 4 --rdzv-id "), run
        assert "--rdzv-backend c10d --rdzv-endpoint n1:29555" in run and f"--local-addr {node} " in run, run
        assert run.endswith(train), run


@SCRIPTS
@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 2)], ids=["1x2", "2x2"])
def test_the_finished_script_trains_with_the_same_weights_on_every_rank(
        slurm: Slurm, script: Path, nodes: int, per_node: int, tiny_data: Path, tmp_path: Path) -> None:
    """The lab's finished script, one epoch: every process joins one group with its own rank;
    local ranks count from 0 on each node, ranks fill the nodes in order, rank 0 (the address) is
    the first node, and every rank ends with the same weights."""
    out = tmp_path / "out"
    out.mkdir()
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    result = submit(slurm, script, "--data-dir", tiny_data, "--epochs", "1", "--widen-factor", "1",
                    "--batch-size", "16", "--target-accuracy", "0", "--timeout", "60", nodes=nodes,
                    per_node=per_node, env={"TRAIN_SCRIPT": str(recorder), "RECORDED_SCRIPT": str(FINISHED),
                                            "PROBE_OUT": str(out)})
    assert result.returncode == 0 and not result.timed_out, result.output
    assert "epoch   1 |" in result.stdout, result.output
    size = nodes * per_node
    seen = [json.loads((out / f"{rank}.json").read_text()) for rank in range(size)]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {(str(size), str(per_node), "n1")}
    for node in range(nodes):  # ranks fill the nodes in order, as SLURM hands them out
        on_node = [s for s in seen if s["SLURMD_NODENAME"] == f"n{node + 1}"]
        assert [s["RANK"] for s in on_node] == [str(node * per_node + k) for k in range(per_node)], seen
        assert [s["LOCAL_RANK"] for s in on_node] == [str(k) for k in range(per_node)], seen
    assert len({s["digest"] for s in seen}) == 1, "the ranks ended with different weights"
    assert none_left(str(recorder)), "a training process outlived its job"


def test_a_failing_task_stops_the_job(slurm: Slurm, probe: Path) -> None:
    """Rank 1 exits with 3 while rank 0 waits for it in init_process_group (for up to 60 s): srun
    (--kill-on-bad-exit) stops rank 0 (SIGTERM), and the job fails at once with srun's status, the
    highest of its tasks': 143 (128 + SIGTERM) for rank 0, above rank 1's 3."""
    result = submit(slurm, PER_GPU, nodes=1, per_node=2, timeout=90,
                    env={"TRAIN_SCRIPT": str(probe), "PROBE_OUT": str(probe.parent / "out"), "PROBE_FAIL_RANK": "1"})
    assert result.returncode == 143 and not result.timed_out, result.output
    assert "task 1: Exited with exit code 3" in result.stdout, result.output
    assert (probe.parent / "out" / "joining").exists(), "rank 0 never got to init_process_group"
    assert result.seconds < 30, f"took {result.seconds:.0f} s: rank 0 waited for rank 1 instead of being stopped"
    assert none_left(str(probe))


def test_scancel_stops_every_process(slurm: Slurm, tiny_data: Path, tmp_path: Path) -> None:
    """A 2-node job training for long, cancelled with scancel once every rank has trained an epoch:
    the job ends CANCELLED, and no training process, torchrun or job step is left."""
    env = processes.child_env({**slurm.env, "MASTER_PORT": str(processes.free_port()), "TRAIN_SCRIPT": str(RESUMING)})
    checkpoint = tmp_path / "long.pt"
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/job.out", *layout(PER_NODE, 2, 1),
                                PER_NODE, "--data-dir", str(tiny_data), "--epochs", "1000", "--checkpoint",
                                str(checkpoint)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    output, deadline = tmp_path / "job.out", time.monotonic() + 90
    while not output.exists() or "epoch 1 |" not in output.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"the job never trained an epoch: {output.read_text() if output.exists() else ''}"
        time.sleep(0.2)
    subprocess.run(["scancel", job], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 30
    while (state := subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                                   env=env, timeout=30).stdout.strip()):
        assert time.monotonic() < deadline, f"the job is still {state}"
        time.sleep(0.2)
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env, timeout=30)
    assert "JobState=CANCELLED" in shown.stdout, shown.stdout
    assert none_left(str(checkpoint)), "a process of the cancelled job is still running"


def test_a_job_past_its_time_limit_is_signalled_and_the_next_one_resumes(
        slurm: Slurm, tiny_data: Path, tmp_path: Path) -> None:
    """A job of 1 minute (SLURM's smallest limit) training without end: SLURM ends it (TIMEOUT,
    between 60 and 90 s: it looks at time limits every 30 s), its processes gone; the next job,
    the same command, resumes from the last checkpoint the first one saved, and finishes."""
    checkpoint = tmp_path / "ckpt.pt"
    args = ["--data-dir", tiny_data, "--checkpoint", checkpoint]
    env = {"TRAIN_SCRIPT": str(RESUMING)}
    first = slurm.job("--time=1", *layout(PER_GPU, 1, 2), PER_GPU, *args, "--epochs", "100000", timeout=180,
                      env={"MASTER_PORT": str(processes.free_port()), "OMP_NUM_THREADS": "1", **env})
    assert "DUE TO TIME LIMIT" in first.output, first.output[-3000:]
    assert 55 < first.seconds < 120, f"the job ended after {first.seconds:.0f} s"
    trained = [int(line.split()[1]) for line in first.stdout.splitlines() if line.startswith("epoch ")]
    assert trained and checkpoint.exists(), first.output[-3000:]
    assert none_left(str(checkpoint)), "a process outlived the job that ran out of time"
    last = max(trained)
    second = submit(slurm, PER_GPU, *args, "--epochs", str(last + 3), nodes=1, per_node=2, env=env)
    assert second.returncode == 0, second.output
    resumed = [line for line in second.stdout.splitlines() if line.startswith("resuming from")]
    assert resumed, second.output
    start = int(resumed[0].rsplit(" ", 1)[1])
    # the limit may fall between an epoch's line and its checkpoint: the epoch is then trained again
    assert start in (last, last + 1), f"resumed at epoch {start}, but the first job had trained epoch {last}"
    again = [int(line.split()[1]) for line in second.stdout.splitlines() if line.startswith("epoch ")]
    assert again == list(range(start, last + 4)), second.output
