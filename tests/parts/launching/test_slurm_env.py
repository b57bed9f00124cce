"""The exercise of notebook 16 (exercises/slurm_env.py, item slurm_env) and the claims the notebook
makes about it, each checked against the installed PyTorch or by running it: what env:// reads,
where the rendezvous' store runs, what torchrun sets, how the untouched file fails, and that the
made-up tasks the check calls the function with are the tasks a real srun gives, their node lists
expanded as SLURM's own `scontrol` expands them (the `slurm` fixture: the course's cluster).

The check itself is judged on recordings (tests/core/test_checks_recorded.py -k slurm_env)."""
from __future__ import annotations

import importlib
import inspect
import json
import socket
import time
from pathlib import Path

import pytest
from conftest import ROOT, Slurm, assert_clean_error

from autograde.engine import processes
from autograde.engine.verdicts import Failed
from autograde.parts.launching import checks_slurm as checks

pytestmark = pytest.mark.timeout(120)

EXERCISE = ROOT / "exercises" / "slurm_env.py"

# One process joining a gloo group from the environment alone: init_process_group with no init_method.
JOIN = """\
import datetime, sys
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
print("joined", dist.get_rank(), dist.get_world_size(), flush=True)
dist.destroy_process_group()
"""


def _python(code: str, env: dict[str, str], timeout: float = 60) -> processes.Result:
    return processes.run([processes.PYTHON, "-c", code], timeout=timeout, cwd=ROOT, env=env)


def _rendezvous(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.launch
def test_env_is_the_default_and_reads_rank_world_size_master_addr_and_port() -> None:
    """Notebook 16: init_process_group("gloo") with no init_method reads RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT from the environment: without any one of them it stops, naming
    it ("environment variable RANK expected, but not set"); with all four, it joins."""
    tries = """\
import datetime, os
import torch.distributed as dist
given = dict(os.environ)
for missing in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(missing)
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    except ValueError as err:
        print("refused:", err, flush=True)
    os.environ[missing] = given[missing]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
print("joined", dist.get_rank(), dist.get_world_size(), flush=True)
dist.destroy_process_group()
"""
    result = _python(tries, _rendezvous(0, 1, processes.free_port()))
    assert result.returncode == 0, result.output
    refused = [line for line in result.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 4, result.output
    for line, name in zip(refused, ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        assert f"environment variable {name} expected, but not set" in line, line
    assert "joined 0 1" in result.stdout, result.output


@pytest.mark.launch
def test_rank_0_starts_the_rendezvous_store_at_master_addr_and_port() -> None:
    """Notebook 16 and the TODO: rank 0 hosts the rendezvous at MASTER_ADDR:MASTER_PORT, where the
    others connect: alone, rank 0 listens there; rank 1 alone does not, and joins once rank 0 is up."""
    port = processes.free_port()
    one = processes.start([processes.PYTHON, "-c", JOIN], cwd=ROOT, env=_rendezvous(1, 2, port))
    try:
        time.sleep(4)  # time for rank 1 to import torch and try to connect
        assert not _listening(port), "rank 1 listened on MASTER_PORT: it is not the one that hosts the store"
        zero = processes.start([processes.PYTHON, "-c", JOIN], cwd=ROOT, env=_rendezvous(0, 2, port))
        try:
            deadline = time.monotonic() + 60
            while not _listening(port) and zero.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            results = [processes.finish(p, 60, time.monotonic()) for p in (zero, one)]
        finally:
            processes.kill_group(zero.pid)
    finally:
        processes.kill_group(one.pid)
    assert all(r.returncode == 0 for r in results), [r.output for r in results]
    assert "joined 0 2" in results[0].stdout and "joined 1 2" in results[1].stdout


def test_torchrun_sets_local_rank_and_local_world_size_for_its_workers() -> None:
    """Notebook 16: LOCAL_RANK and LOCAL_WORLD_SIZE are the two more variables torchrun sets (its
    agent writes them into each worker's environment); env:// itself does not read them."""
    from torch.distributed.elastic.agent.server import local_elastic_agent

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the package's name for it is a function

    agent = inspect.getsource(local_elastic_agent.LocalElasticAgent)
    assert '"LOCAL_RANK"' in agent and '"LOCAL_WORLD_SIZE"' in agent
    env_handler = inspect.getsource(rendezvous._env_rendezvous_handler)
    assert "LOCAL_RANK" not in env_handler and "LOCAL_WORLD_SIZE" not in env_handler
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert f'_get_env_or_raise("{name}")' in env_handler, name


@pytest.mark.launch
def test_the_untouched_exercise_fails_in_init_process_group_as_the_notebook_says(slurm: Slurm) -> None:
    result = processes.run([processes.PYTHON, EXERCISE, "--nodes", "1", "--ntasks-per-node", "1"], timeout=90, cwd=ROOT,
                           env=slurm.env)
    assert result.returncode != 0, result.output
    assert "environment variable RANK expected, but not set" in result.output, result.output
    assert "srun: error: n1: task 0" in result.output, result.output
    assert not result.leftover


@pytest.mark.launch
@pytest.mark.parametrize("args, words", [(["--nodes", "0"], ["--nodes", "below 1"]),
                                         (["--ntasks-per-node", "two"], ["--ntasks-per-node", "not a whole number"])])
def test_the_exercise_refuses_a_bad_layout_in_one_line(args: list[str], words: list[str]) -> None:
    assert_clean_error(processes.run([processes.PYTHON, EXERCISE, *args], timeout=60, cwd=ROOT), *words)


@pytest.mark.launch
def test_the_checks_made_up_tasks_are_the_tasks_srun_gives(slurm: Slurm, tmp_path: Path) -> None:
    """The check calls the learner's function with task_environ(): the SLURM variables a real srun
    gives each task of a 2 x 2 batch job, with the same values (the nodes n1 and n2)."""
    dump = tmp_path / "dump.py"
    dump.write_text("import json, os, sys\nfrom pathlib import Path\n"
                    "Path(sys.argv[1], os.environ['SLURM_PROCID']).write_text(json.dumps(dict(os.environ)))\n")
    out = tmp_path / "out"
    out.mkdir()
    batch = tmp_path / "env.sbatch"
    batch.write_text(f"#!/bin/bash\nsrun {processes.PYTHON} {dump} {out}\n")
    result = slurm.job("--nodes=2", "--ntasks-per-node=2", batch, timeout=60)
    assert result.returncode == 0, result.output
    for task in range(4):
        given = json.loads((out / str(task)).read_text())
        made_up = checks.task_environ(int(given["SLURM_JOB_ID"]), "n[1-2]", ("n1", "n2"), 2, task)
        # not compared: the job's name, and the host and address sbatch and srun were started from
        skip = ("SLURM_JOB_NAME", "SLURM_SUBMIT_HOST", "SLURM_LAUNCH_NODE_IPADDR")
        shared = sorted(k for k in made_up if k in given and k not in skip)
        assert len(shared) >= 15, shared
        assert {k: made_up[k] for k in shared} == {k: given[k] for k in shared}, task
        # what the function needs is all there
        for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_PROCID",
                     "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME"):
            assert name in shared, name


@pytest.mark.launch
def test_the_made_up_jobs_hosts_are_what_scontrol_expands_their_node_lists_to(slurm: Slurm) -> None:
    """The check's table of made-up jobs holds each node list's hosts: SLURM's own expansion."""
    for _, nodelist, hosts, _ in checks.JOBS:
        shown = processes.run(["scontrol", "show", "hostnames", nodelist], timeout=30, env=slurm.env)
        assert tuple(shown.stdout.split()) == hosts, shown.output


def test_the_solution_is_right_for_every_made_up_job_and_the_judge_catches_a_wrong_one() -> None:
    """judge_job, the check's rules, in this process on plain data: the right mapping passes for
    every job the check makes up; a rank taken from SLURM_LOCALID fails."""
    for job_id, nodelist, hosts, per_node in checks.JOBS:
        tasks = checks._job_tasks(job_id, nodelist, hosts, per_node)
        right = [{"RANK": t["SLURM_PROCID"], "LOCAL_RANK": t["SLURM_LOCALID"], "WORLD_SIZE": t["SLURM_NTASKS"],
                  "LOCAL_WORLD_SIZE": t["SLURM_NTASKS_PER_NODE"], "MASTER_ADDR": hosts[0],
                  "MASTER_PORT": "29500"} for t in tasks]
        assert checks.judge_job(right, tasks, "job") == 29500
    tasks = checks._job_tasks(*checks.JOBS[0])
    wrong = [{"RANK": t["SLURM_LOCALID"], "LOCAL_RANK": t["SLURM_LOCALID"], "WORLD_SIZE": "8",
              "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n01", "MASTER_PORT": "29500"} for t in tasks]
    with pytest.raises(Failed, match="each of 0 to 7 must be given to one task"):
        checks.judge_job(wrong, tasks, "job")
