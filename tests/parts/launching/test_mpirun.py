"""The MPI-style launch (demos/mpi/mpirun_fashion_mnist.sh) under Debian's Open MPI: mpirun's
OMPI_COMM_WORLD_* variables become PyTorch's ranks, on one machine and on two emulated hosts (the
second reached through a stand-in for ssh that gives it a bare environment), the finished lab
trains, a failing rank ends the whole job, SIGTERM stops every process, and nothing is left running.
Where Open MPI cannot be installed (not root, no apt-get), the tests skip with the reason.

Wall times measured here (2 cores, shared with other work): the file in 18 to 46 s. Each test, on a
quiet machine (a busy one): 2 processes' variables 2 s (7 s), two hosts 4 s (16 s), the training run
5 s (14 s), the failing rank 3 s (3 s), SIGTERM 4 s (9 s), no mpirun 0.1 s, env:// in this process
1 s, the figure 0.1 s; installing Open MPI first, where it is missing, about 5 s more."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import ROOT, again_on_gloo_fault, assert_clean_error

from autograde import data
from autograde.cluster import open_mpi
from autograde.engine import processes

LAUNCHER = ROOT / open_mpi.LAUNCHER

# Stands in for the training script (TRAIN_SCRIPT): joins the group from the environment as the lab's
# script does, and writes down what it was told and what it saw, into the folder given as its first
# argument (an argument, not a variable: the launcher sends only its own variables to other hosts).
# With a second argument R, rank R exits with 3 once rank 0 waits for it in init_process_group; with
# "sleep", every rank sleeps after the group's first all_reduce, until it is stopped.
PROBE = """\
import datetime, json, os, sys, time
from pathlib import Path
out, what = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""
if what == os.environ["RANK"]:
    while not (out / "joining").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    sys.exit(3)
import torch
import torch.distributed as dist
if os.environ["RANK"] == "0":
    (out / "joining").touch()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
total = torch.tensor([dist.get_rank()])
dist.all_reduce(total)
seen = {k: v for k, v in os.environ.items() if k.startswith("OMPI_COMM_WORLD_")}
seen.update({k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                            "MASTER_PORT", "PATH", "%s")})
seen.update(group_rank=dist.get_rank(), group_size=dist.get_world_size(), all_reduce=int(total), args=sys.argv[3:])
(out / f"{dist.get_rank()}.json").write_text(json.dumps(seen))
if what == "sleep":
    time.sleep(300)
dist.destroy_process_group()
""" % open_mpi.HOST_VARIABLE


@pytest.fixture(scope="module")
def mpirun() -> None:
    """Open MPI, installed where it is missing; the tests skip with the reason where it cannot be."""
    why = open_mpi.install()
    if why is not None:
        pytest.skip(why)


def launch(*args: str | Path, env: dict[str, str], timeout: float) -> processes.Result:
    """The launcher as a learner runs it, from the course's root, on a port known to be free."""
    env = {"MASTER_PORT": str(processes.free_port()), **env}
    return again_on_gloo_fault(lambda: processes.run(["bash", LAUNCHER, *args], timeout=timeout, cwd=ROOT, env=env))


def seen_by(out: Path, size: int) -> list[dict]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(size)]


@pytest.mark.launch
@pytest.mark.usefixtures("mpirun")
def test_mpirun_variables_become_pytorch_ranks(probe: Path) -> None:
    """2 processes on this machine: one group of 2, each rank once, the local ranks those of one
    host, rank 0 at localhost, and the launcher's arguments (one with a space) passed on."""
    out = probe.parent / "out"
    result = launch(out, "", "--probe-arg", "two words", env={"TRAIN_SCRIPT": str(probe)}, timeout=60)
    assert result.returncode == 0 and not result.timed_out, result.output
    assert not result.leftover, "processes were left running"
    seen = seen_by(out, 2)
    for rank, s in enumerate(seen):
        assert (s["OMPI_COMM_WORLD_RANK"], s["OMPI_COMM_WORLD_SIZE"]) == (str(rank), "2")
        assert (s["OMPI_COMM_WORLD_LOCAL_RANK"], s["OMPI_COMM_WORLD_LOCAL_SIZE"]) == (str(rank), "2")
        assert (s["RANK"], s["WORLD_SIZE"], s["LOCAL_RANK"], s["LOCAL_WORLD_SIZE"]) == (str(rank), "2", str(rank), "2")
        assert (s["group_rank"], s["group_size"], s["all_reduce"]) == (rank, 2, 1)
        assert s["MASTER_ADDR"] == "localhost" and s["args"] == ["--probe-arg", "two words"]


@pytest.mark.launch
@pytest.mark.usefixtures("mpirun")
def test_two_hosts_from_a_hostfile(probe: Path) -> None:
    """2 emulated hosts x 2 processes (a hostfile; the second host reached through the ssh stand-in,
    in a bare environment): ranks fill the first host, then the second; local ranks count from 0 on
    each; rank 0's host is MASTER_ADDR; the launcher's -x gave the second host's processes the
    variables they need (PATH with this interpreter's folder, MASTER_ADDR, ...)."""
    out = probe.parent / "out"
    env = {"TRAIN_SCRIPT": str(probe), "NP": "4", **open_mpi.emulated_hosts(probe.parent / "hosts", 2, 2)}
    result = launch(out, "", env=env, timeout=90)
    assert result.returncode == 0 and not result.timed_out, result.output
    assert not result.leftover, "processes were left running"
    seen = seen_by(out, 4)
    assert [s["group_rank"] for s in seen] == [0, 1, 2, 3] and {s["all_reduce"] for s in seen} == {6}
    assert [s["RANK"] for s in seen] == ["0", "1", "2", "3"]
    assert [s["LOCAL_RANK"] for s in seen] == ["0", "1", "0", "1"]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {("4", "2", "127.0.0.1")}
    assert [s[open_mpi.HOST_VARIABLE] for s in seen] == [None, None, "127.0.0.2", "127.0.0.2"]  # None: mpirun's own
    assert {s["PATH"].split(os.pathsep)[0] for s in seen} == {str(Path(processes.PYTHON).parent)}


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic stand-in for Fashion-MNIST: one epoch takes seconds."""
    root = tmp_path_factory.mktemp("tiny")
    data.write_synthetic(root, 160, 67, seed=3)
    return root


@pytest.mark.launch
@pytest.mark.usefixtures("mpirun")
def test_the_lab_trains_under_mpirun(tiny_data: Path) -> None:
    """The finished lab (solutions/fashion_mnist_torchrun.py, the launcher's default), 2 processes."""
    result = launch("--data-dir", tiny_data, "--epochs", "1", "--widen-factor", "1", "--batch-size", "16",
                    "--target-accuracy", "0", "--timeout", "60", env={}, timeout=120)
    assert result.returncode == 0 and not result.timed_out, result.output
    assert "2 processes of solutions/fashion_mnist_torchrun.py" in result.stdout, result.output
    assert "epoch   1 |" in result.stdout, result.output
    assert not result.leftover, "processes were left running"


@pytest.mark.launch
@pytest.mark.usefixtures("mpirun")
def test_a_failing_rank_ends_the_job(probe: Path) -> None:
    """Rank 1 exits with 3 while rank 0 waits for it in init_process_group (for up to 60 s): mpirun
    stops rank 0, and the launch fails at once with rank 1's status."""
    out = probe.parent / "out"
    result = launch(out, "1", env={"TRAIN_SCRIPT": str(probe)}, timeout=90)
    assert result.returncode == 3 and not result.timed_out, result.output
    assert "exited with non-zero status" in result.output and "Exit code:    3" in result.output, result.output
    assert (out / "joining").exists(), "rank 0 never got to init_process_group"
    assert result.seconds < 30, f"took {result.seconds:.0f} s: rank 0 waited for rank 1 instead of being stopped"
    assert not result.leftover, "processes were left running"


@pytest.mark.launch
@pytest.mark.usefixtures("mpirun")
def test_sigterm_to_the_launcher_stops_every_process(probe: Path) -> None:
    """As a scheduler or `kill` would: SIGTERM to the launcher (which has become mpirun) while 2 emulated
    hosts' processes sleep in their group; mpirun passes it on and nothing is left running."""
    out = probe.parent / "out"
    env = {"TRAIN_SCRIPT": str(probe), "NP": "4", "MASTER_PORT": str(processes.free_port()),
           **open_mpi.emulated_hosts(probe.parent / "hosts", 2, 2)}
    proc = processes.start(["bash", LAUNCHER, out, "sleep"], cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while not (started := all((out / f"{rank}.json").exists() for rank in range(4))) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    result = processes.finish(proc, timeout=30)
    assert started, f"the 4 processes did not all join:\n{result.output}"
    assert result.returncode != 0 and not result.timed_out, result.output
    assert result.seconds < 20 and not result.leftover, result.output


@pytest.mark.launch
def test_without_mpirun_the_launcher_says_what_to_install(tmp_path: Path) -> None:
    result = processes.run(["/bin/bash", LAUNCHER], timeout=30, cwd=ROOT, env={"PATH": str(tmp_path)})
    assert_clean_error(result, "mpirun", "apt-get install openmpi-bin")


def test_env_needs_four_variables_and_not_open_mpis_names() -> None:
    """What notebook 16 says of env://, asked in this process: each of the four is needed, Open MPI's
    names do not stand in for PyTorch's, and the local ones are not needed."""
    from autograde.parts.launching import notebook_mpi as launching_mpi
    names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK")
    before = {name: os.environ.get(name) for name in names}
    said = launching_mpi.env_needs()
    assert {name: os.environ.get(name) for name in names} == before  # this process's own are put back
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert said[f"without {name}"] == f"environment variable {name} expected, but not set"
    assert said["OMPI_COMM_WORLD_RANK and _SIZE instead of RANK and WORLD_SIZE"] == \
        "environment variable RANK expected, but not set"
    assert said["all four, without LOCAL_RANK and LOCAL_WORLD_SIZE"] == "the rendezvous succeeds: rank 0 of 1"


def test_the_mapping_figure_puts_each_process_on_its_host() -> None:
    from autograde.parts.launching import notebook_mpi as launching_mpi
    rows = [{"host": f"127.0.0.{rank // 2 + 1}", "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4",
             "OMPI_COMM_WORLD_SIZE": "4",
             "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % 2),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} for rank in range(4)]
    fig = launching_mpi.mapping_figure(rows)
    (ax,) = fig.axes
    boxes = {p.get_gid(): p.get_x() for p in ax.patches if p.get_gid()}
    assert sorted(boxes) == [f"rank {r}" for r in range(4)]
    assert boxes["rank 0"] == boxes["rank 1"] < boxes["rank 2"] == boxes["rank 3"]  # two hosts, two each
    texts = [t.get_text() for t in ax.texts]
    assert "host 127.0.0.1 (mpirun runs here)" in texts and "host 127.0.0.2" in texts
    assert sum("127.0.0.1:29500" in t for t in texts) == 1  # said once, in rank 0's box
