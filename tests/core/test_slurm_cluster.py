"""The real SLURM cluster of autograde/cluster/slurm.py: two emulated nodes come up idle, srun
and sbatch lay tasks out as SLURM does (each task sees its node's name and its SLURM_* variables,
the node names resolve for a rendezvous), the course's `job` runner ends with its job and its
exit status, and `down` leaves no daemon, job step or /etc/hosts line behind. Where SLURM cannot
be installed (not root, no apt-get), the tests skip with the reason."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Slurm

from autograde.cluster import slurm as slurm_cluster
from autograde.engine import processes

pytestmark = pytest.mark.launch  # it starts daemons


def _run(slurm: Slurm, *command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **slurm.env}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_cluster_comes_up_idle_with_the_course_scripts_resources() -> None:
    """Brought up afresh (down first if it is running): measured, every node idle, 32 CPUs and 4 GPUs."""
    if slurm_cluster.system_slurm():
        pytest.skip("SLURM_CONF names a SLURM of the system's: the course's cluster is not used")
    was_up = slurm_cluster.running() is not None
    start = time.monotonic()
    try:
        cluster = slurm_cluster.up()
    except slurm_cluster.ClusterError as err:
        pytest.skip(f"no SLURM here: {err}")
    print(f"the cluster came up in {time.monotonic() - start:.1f} s")
    try:
        shown = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t %c %G"], capture_output=True, text=True,
                               env=cluster.env, timeout=30).stdout.split("\n")
        assert sorted(filter(None, shown)) == ["n1 idle 32 gpu:4", "n2 idle 32 gpu:4"], shown
    finally:
        if not was_up:
            slurm_cluster.down()


def test_srun_gives_each_task_its_node_and_its_slurm_variables(slurm: Slurm) -> None:
    out = _run(slurm, "srun", "-N2", "--ntasks-per-node=2", "bash", "-c",
               'echo "$(hostname) $SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $SLURM_NODEID $(getent hosts $(hostname))"')
    seen = sorted(line.split()[:6] for line in out.splitlines())
    assert seen == [["n1", "0", "0", "4", "0", "127.0.0.1"], ["n1", "1", "1", "4", "0", "127.0.0.1"],
                    ["n2", "2", "0", "4", "1", "127.0.0.2"], ["n2", "3", "1", "4", "1", "127.0.0.2"]], out


def test_the_job_runner_ends_with_its_job_and_its_exit_status(slurm: Slurm, tmp_path: Path) -> None:
    """One task on each of 2 nodes; the batch script's arguments reach it; a failing job's status comes back."""
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1\n"
                      "srun bash -c 'echo \"task $SLURM_PROCID on $(hostname): $1\"' bash \"$1\"\nexit \"$2\"\n")
    result = slurm.job(script, "two words", "0", cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("task")) == [
        "task 0 on n1: two words", "task 1 on n2: two words"], result.output
    assert result.seconds < 10, f"the runner took {result.seconds:.1f} s to see a job of a second end"
    assert slurm.job(script, "x", "7", cwd=tmp_path).returncode == 7


def test_the_job_runner_cancels_its_job_when_stopped(slurm: Slurm, tmp_path: Path) -> None:
    """SIGTERM to the runner (a checker's time limit, Ctrl-C in a notebook) cancels the job: no task is left."""
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\n"
                      f"srun bash -c 'touch {tmp_path}/$SLURM_PROCID; exec sleep 300'\n")
    proc = processes.start([processes.PYTHON, "-m", "autograde.cluster.slurm", "job", script], cwd=ROOT,
                           env=slurm.env)
    deadline = time.monotonic() + 30
    while not (started := all((tmp_path / str(t)).exists() for t in range(4))) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    result = processes.finish(proc, timeout=40)
    assert started, result.output
    assert result.returncode == 128 + signal.SIGTERM, result.output
    queue = lambda: subprocess.run(["squeue", "-h", "-o", "%i %T %r"], capture_output=True, text=True,  # noqa: E731
                                   env={**os.environ, **slurm.env}, timeout=30).stdout
    left = _left("exec sleep 300", "sleep 300")
    assert not left, f"tasks outlived their cancelled job: {left}; squeue: {queue()!r}"


def _left(*commands: str, seconds: float = 60) -> list[str]:
    """The processes running one of `commands` ('pid seconds-old state command') once every one has gone
    or `seconds` have passed: a loaded machine can take a while to end a cancelled job's tasks."""
    deadline = time.monotonic() + seconds
    while True:
        found = subprocess.run(["ps", "-eo", "pid=,etimes=,stat=,args="], capture_output=True, text=True,
                               timeout=10).stdout.splitlines()
        left = [line.strip() for line in found if line.split(None, 3)[-1].strip() in commands]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_down_leaves_nothing_behind(slurm: Slurm, tmp_path: Path) -> None:
    """With a job step running: every daemon, slurmstepd and task gone, the /etc/hosts lines removed
    (the module's next user brings the cluster up again)."""
    if slurm_cluster.system_slurm():
        pytest.skip("SLURM_CONF names a SLURM of the system's: the course's cluster is not used")
    env = {**os.environ, **slurm.env}
    cluster = slurm_cluster.running()
    assert cluster is not None
    subprocess.run(["sbatch", "-N2", f"--output={tmp_path}/out", "--wrap", "srun sleep 301"], env=env,
                   check=True, capture_output=True, timeout=30)
    deadline = time.monotonic() + 20
    while "sleep 301" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "the job's step never started"
        time.sleep(0.2)
    slurm_cluster.down()
    pids = list(cluster.pids.values())
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert not left, f"daemons still running: {left}"
    left = _left("sleep 301", "slurmstepd: [1.0]", "slurmstepd: [1.batch]")
    assert not left, f"job steps outlived the cluster: {left}"
    assert "ddp-lab-slurm" not in Path("/etc/hosts").read_text()
