"""The real SLURM cluster of autograde/tools/slurm_cluster.py: two emulated nodes come up idle, srun
and sbatch lay tasks out as SLURM does (each task sees its node's name and its SLURM_* variables,
the node names resolve for a rendezvous), and `down` leaves no daemon, job step or /etc/hosts line
behind. Where SLURM cannot be installed (not root, no apt-get), the test skips with the reason."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from autograde.tools import slurm_cluster

pytestmark = pytest.mark.launch  # it starts daemons


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.Cluster]:
    why = slurm_cluster.install()
    if why is not None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("slurm")
    start = time.monotonic()
    found = slurm_cluster.up(folder, nodes=2)
    print(f"the cluster came up in {time.monotonic() - start:.1f} s")
    try:
        yield found
    finally:
        slurm_cluster.down(folder)


def _run(cluster: slurm_cluster.Cluster, *command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=cluster.env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_srun_gives_each_task_its_node_and_its_slurm_variables(cluster: slurm_cluster.Cluster) -> None:
    out = _run(cluster, "srun", "-N2", "-n4", "bash", "-c",
               'echo "$(hostname) $SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $SLURM_NODEID $(getent hosts $(hostname))"')
    tasks = sorted(line.split() for line in out.splitlines())
    assert [t[:5] for t in tasks] == [["n1", "0", "0", "4", "0"], ["n1", "1", "1", "4", "0"],
                                      ["n2", "2", "0", "4", "1"], ["n2", "3", "1", "4", "1"]], out
    assert {t[0]: t[5] for t in tasks} == {"n1": "127.0.0.1", "n2": "127.0.0.2"}, out  # names resolve


def test_a_batch_job_on_two_nodes_runs_one_task_on_each(cluster: slurm_cluster.Cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    out = tmp_path / "job.out"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                      f"#SBATCH --output={out}\n"
                      'srun bash -c \'echo "task $SLURM_PROCID on $(hostname)"\'\n'
                      'echo "first node $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n')
    _run(cluster, "sbatch", "--wait", str(script))
    lines = sorted(out.read_text().splitlines())
    assert lines == ["first node n1", "task 0 on n1", "task 1 on n2"], lines


def test_down_leaves_nothing_behind(cluster: slurm_cluster.Cluster) -> None:
    """The module's cluster, brought down with a job step running: every daemon and job step gone,
    /etc/hosts as it was before the cluster came up (this test runs last: the fixture's down is then
    a no-op)."""
    subprocess.Popen(["srun", "-N2", "sleep", "300"], env=cluster.env, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while "sleep 300" not in subprocess.run(["ps", "-eo", "cmd"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "the job step never started"
        time.sleep(0.2)
    slurm_cluster.down(cluster.folder)
    deadline = time.monotonic() + 30
    while True:  # the steps end as their daemons do: wait for them, with a deadline
        left = [line for line in subprocess.run(["ps", "-eo", "stat,cmd"], capture_output=True, text=True)
                .stdout.splitlines() if not line.startswith("Z") and (str(cluster.folder) in line
                or any(word in line for word in ("slurmstepd", "sleep 300", "srun -N2")))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, left
    assert not any(slurm_cluster._alive(pid) for pid in cluster.pids.values()), cluster.pids
    assert cluster.hosts_marker and cluster.hosts_marker not in slurm_cluster.HOSTS.read_text()
