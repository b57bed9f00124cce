"""The SLURM batch scripts of "launching for real" (demos/slurm/), run without SLURM under the
fake cluster of autograde/tools/fake_slurm.py: nodes are loopback addresses of this machine."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from autograde import data, processes
from autograde.tools import fake_slurm
from conftest import ROOT, again_on_gloo_fault, assert_clean_error

PER_GPU = ROOT / "demos" / "slurm" / "srun_one_task_per_gpu.sbatch"  # srun: one task per GPU
PER_NODE = ROOT / "demos" / "slurm" / "srun_torchrun_per_node.sbatch"  # srun: one torchrun per node
SCRIPTS = pytest.mark.parametrize("script", [PER_GPU, PER_NODE], ids=["task-per-gpu", "torchrun-per-node"])

# Stands in for the training script (TRAIN_SCRIPT): joins the group the way the lab's script does
# (init_process_group from the environment), and writes down what it was told and what it saw.
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
total = torch.tensor([dist.get_rank()])
dist.all_reduce(total)
seen = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "SLURMD_NODENAME")}
seen.update(group_rank=dist.get_rank(), group_size=dist.get_world_size(), all_reduce=int(total), args=sys.argv[1:])
Path(os.environ["PROBE_OUT"], f"{dist.get_rank()}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
"""


def sbatch(script: Path, *args: str | Path, nodes: int, per_node: int, env: dict[str, str],
           timeout: float) -> processes.Result:
    """`script` under the fake SLURM with `nodes` x `per_node` training processes: as many tasks
    per node as GPUs for the task-per-GPU script, one (torchrun) for the other."""
    tasks = per_node if script == PER_GPU else 1
    cmd = [processes.PYTHON, "-m", "autograde.tools.fake_slurm", "--nodes", str(nodes),
           "--ntasks-per-node", str(tasks), "--gpus-per-node", str(per_node), script, *args]
    # a port known to be free: the scripts' default comes from the job id, here a process id
    env = {"MASTER_PORT": str(processes.free_port()), **env}
    return again_on_gloo_fault(lambda: processes.run(cmd, timeout=timeout, cwd=ROOT, env=env))


def fake(*args: str | Path, env: dict[str, str] | None = None) -> processes.Result:
    """The fake SLURM's command line, for quick runs that start no training."""
    return processes.run([processes.PYTHON, "-m", "autograde.tools.fake_slurm", *args], timeout=30, cwd=ROOT, env=env)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    """The probe as a file, with an empty folder `out` beside it for what it writes."""
    (tmp_path / "out").mkdir()
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


@pytest.mark.parametrize("hostlist, names", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a,b", ["a", "b"]),
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
    ("gpu[9-11]", ["gpu9", "gpu10", "gpu11"]),
    ("r[1-2]n[1-2],login", ["r1n1", "r1n2", "r2n1", "r2n2", "login"]),
    ("node7", ["node7"]),
])
def test_hostlists_expand_as_slurm_writes_them(hostlist: str, names: list[str]) -> None:
    assert fake_slurm.expand_hostlist(hostlist) == names


@pytest.mark.parametrize("hostlist", ["node[1-", "node]", "node[3-1]", "node[a-b]", "a,,b", "n[[1]]"])
def test_a_broken_hostlist_is_refused(hostlist: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        fake_slurm.expand_hostlist(hostlist)


def test_sbatch_lines_are_read_up_to_the_first_command() -> None:
    script = """#!/bin/bash
# a comment
#SBATCH --nodes=4           # nb nodes
#SBATCH --ntasks-per-node 3 --gres=gpu:a100:3
#SBATCH -J pi -c 6
#SBATCH --exclusive
#SBATCH --nodes=2
echo hello
#SBATCH --nodes=8
"""
    options = fake_slurm.parse_sbatch_lines(script)
    assert options == {"nodes": "2", "ntasks-per-node": "3", "gres": "gpu:a100:3", "job-name": "pi",
                       "cpus-per-task": "6", "exclusive": ""}
    assert fake_slurm.job_from(options, "x") == fake_slurm.Job(2, 3, 3, 6, "pi")
    assert fake_slurm.job_from({"nodes": "4", "ntasks": "12"}, "x").ntasks_per_node == 3


def test_the_course_scripts_ask_for_two_nodes_of_four_gpus() -> None:
    per_gpu = fake_slurm.job_from(fake_slurm.parse_sbatch_lines(PER_GPU.read_text()), "x")
    per_node = fake_slurm.job_from(fake_slurm.parse_sbatch_lines(PER_NODE.read_text()), "x")
    assert (per_gpu.nodes, per_gpu.ntasks_per_node, per_gpu.gpus_per_node) == (2, 4, 4)
    assert (per_node.nodes, per_node.ntasks_per_node, per_node.gpus_per_node) == (2, 1, 4)


@pytest.mark.launch
def test_as_written_the_scripts_start_eight_processes(tmp_path: Path) -> None:
    """Their own #SBATCH shape, 2 nodes x 4 GPUs, dry: `python` and `torchrun` are stand-ins that
    print what they were given; the job's arguments come through unchanged (one of them has a space)."""
    for name in ("python", "torchrun"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "{name} $RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE '
                                     f'$SLURMD_NODENAME $MASTER_ADDR $*"\n')
        (tmp_path / name).chmod(0o755)
    path = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    train = "solutions/fashion_mnist_torchrun.py --epochs 5 x"

    result = fake(PER_GPU, "--epochs", "5 x", env=path)
    assert result.returncode == 0 and not result.leftover, result.output
    runs = sorted(line.split(" ", 5) for line in result.stdout.splitlines() if line.startswith("python"))
    assert runs == sorted(["python", f"{rank}/8", f"{rank % 4}/4", f"127.0.0.{rank // 4 + 1}", "127.0.0.1", train]
                          for rank in range(8))

    result = fake(PER_NODE, "--epochs", "5 x", env=path)
    assert result.returncode == 0 and not result.leftover, result.output
    runs = sorted(line for line in result.stdout.splitlines() if line.startswith("torchrun"))
    assert len(runs) == 2, result.output
    for node, run in zip(["127.0.0.1", "127.0.0.2"], runs):
        assert run.startswith(f"torchrun / / {node} 127.0.0.1 --nnodes 2 --nproc-per-node 4 --rdzv-id "), run
        assert "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:" in run and f"--local-addr {node} " in run, run
        assert run.endswith(train), run


@pytest.mark.launch
def test_scontrol_prints_one_host_a_line() -> None:
    result = fake("scontrol", "show", "hostnames", "node[01-02],login")
    assert (result.returncode, result.stdout) == (0, "node01\nnode02\nlogin\n"), result.output


@pytest.mark.launch
@pytest.mark.parametrize("args, words", [
    (["no_such_script.sbatch"], ["no batch script", "no_such_script.sbatch"]),
    (["--ntasks-per-node", "0", str(PER_GPU)], ["--ntasks-per-node", "at least 1"]),
    (["--partition", "gpu", str(PER_GPU)], ["--partition"]),
    (["scontrol", "show", "hostnames", "node[1-"], ["node[1-", "without"]),
    (["srun", "hostname"], ["not inside a job"]),
])
def test_bad_input_gets_one_line(args: list[str], words: list[str]) -> None:
    assert_clean_error(fake(*args), *words)


@pytest.mark.launch
def test_an_unknown_srun_option_gets_one_line(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nset -e\nsrun --mpi=pmix true\n")
    assert_clean_error(fake(script), "srun", "--mpi")


@pytest.mark.launch
@SCRIPTS
@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 2)], ids=["1x2", "2x2"])
def test_slurm_variables_become_pytorch_ranks(script: Path, nodes: int, per_node: int, probe: Path) -> None:
    """Every process joins one group with its own rank; local ranks count from 0 on each node,
    rank 0 is on the first node, and the batch script's arguments reach the training script."""
    out = probe.parent / "out"
    result = sbatch(script, "--probe-arg", "two words", nodes=nodes, per_node=per_node, timeout=60,
                    env={"TRAIN_SCRIPT": str(probe), "PROBE_OUT": str(out)})
    assert result.returncode == 0 and not result.timed_out, result.output
    assert not result.leftover, "processes were left running"
    size = nodes * per_node
    seen = [json.loads((out / f"{rank}.json").read_text()) for rank in range(size)]
    assert [s["RANK"] for s in seen] == [str(rank) for rank in range(size)]
    assert [s["group_rank"] for s in seen] == list(range(size))
    sizes = {(s["WORLD_SIZE"], s["group_size"], s["LOCAL_WORLD_SIZE"]) for s in seen}
    assert sizes == {(str(size), size, str(per_node))}
    assert {s["all_reduce"] for s in seen} == {size * (size - 1) // 2}
    assert {s["MASTER_ADDR"] for s in seen} == {"127.0.0.1"}
    for node in range(nodes):  # ranks fill the nodes in order, as SLURM hands them out
        on_node = [s for s in seen if s["SLURMD_NODENAME"] == f"127.0.0.{node + 1}"]
        assert [s["RANK"] for s in on_node] == [str(node * per_node + k) for k in range(per_node)]
        assert [s["LOCAL_RANK"] for s in on_node] == [str(k) for k in range(per_node)]
    assert {tuple(s["args"]) for s in seen} == {("--probe-arg", "two words")}


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic stand-in for Fashion-MNIST: one epoch takes seconds."""
    root = tmp_path_factory.mktemp("tiny")
    data.write_synthetic(root, 160, 67, seed=3)
    return root


@pytest.mark.launch
def test_the_lab_trains_under_torchrun_on_two_nodes(tiny_data: Path) -> None:
    """The real training script, one torchrun on each of two nodes, one process each."""
    result = sbatch(PER_NODE, "--data-dir", tiny_data, "--epochs", "1", "--widen-factor", "1",
                    "--batch-size", "16", "--target-accuracy", "0", "--timeout", "60",
                    nodes=2, per_node=1, env={}, timeout=120)
    assert result.returncode == 0 and not result.timed_out, result.output
    assert "epoch   1 |" in result.stdout, result.output
    assert not result.leftover, "processes were left running"


@pytest.mark.launch
def test_a_failing_task_stops_the_job(probe: Path) -> None:
    """Rank 1 exits with 3 while rank 0 waits for it in init_process_group (for up to 60 s): srun
    stops rank 0, and the job fails at once with rank 1's status."""
    result = sbatch(PER_GPU, nodes=1, per_node=2, timeout=90,
                    env={"TRAIN_SCRIPT": str(probe), "PROBE_OUT": str(probe.parent / "out"), "PROBE_FAIL_RANK": "1"})
    assert result.returncode == 3 and not result.timed_out, result.output
    assert "task 1: Exited with exit code 3" in result.stderr, result.output
    assert (probe.parent / "out" / "joining").exists(), "rank 0 never got to init_process_group"
    assert result.seconds < 30, f"took {result.seconds:.0f} s: rank 0 waited for rank 1 instead of being stopped"
    assert not result.leftover, "processes were left running"


@pytest.mark.launch
def test_sigterm_to_the_job_stops_every_task(tmp_path: Path) -> None:
    """As on `scancel`: the job's tasks get SIGTERM, and nothing is left running."""
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\n"
                      "srun bash -c 'touch \"$0/$SLURM_PROCID\"; sleep 60; sleep 60' " + str(tmp_path) + "\n")
    proc = processes.start([processes.PYTHON, "-m", "autograde.tools.fake_slurm", script], cwd=ROOT)
    deadline = time.monotonic() + 20
    while not (started := all((tmp_path / str(task)).exists() for task in range(4))) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    result = processes.finish(proc, timeout=20)
    assert started, f"the 4 tasks did not start:\n{result.output}"
    assert result.returncode == 128 + signal.SIGTERM, result.output
    assert result.seconds < 10 and not result.leftover, result.output
