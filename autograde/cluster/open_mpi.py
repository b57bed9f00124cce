"""Debian's Open MPI (4.1 on Debian 12) for the course's MPI-style launch: `mpirun` starts the
training processes of demos/mpi/mpirun_fashion_mnist.sh and tells each its place in
OMPI_COMM_WORLD_* variables; PyTorch's own MPI backend is not used (the pip wheels have none).

openmpi-bin alone gives a working `mpirun` (apt-get pulls libopenmpi3 and the rest; about 5 s).
As root, mpirun refuses to start anything unless given `--allow-run-as-root` or both of
OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (one alone is refused too); the
launcher passes the option itself when it runs as root. It also refuses more processes than the
machine has cores ("not enough slots") unless given `--oversubscribe`, which the launcher passes on
one machine.

Several hosts are emulated on this one (`emulated_hosts`): a hostfile names 127.0.0.1, which mpirun
takes for itself, and 127.0.0.2, ..., which it reaches through the rsh agent, here a stand-in for
ssh that runs the command on this machine in a fresh environment, as ssh would on another host."""
from __future__ import annotations

from pathlib import Path

from autograde import settings
from autograde.cluster import debian

PACKAGES = ("openmpi-bin",)
COMMANDS = ("mpirun",)
LAUNCHER = "demos/mpi/mpirun_fashion_mnist.sh"  # relative to the course's root
HOST_VARIABLE = settings.HOST  # set by the ssh stand-in: the emulated host a process runs on

# The ssh stand-in: mpirun calls it as `agent [options] HOST COMMAND...` to start its daemon (orted)
# on HOST. It runs COMMAND through a shell, as sshd does, in an environment as bare as a fresh login's:
# what the processes need must come from mpirun's -x. It keeps the course's launch mark, so that the
# launch's clean-up (autograde/engine/processes.py) finds the processes it starts.
FAKE_SSH = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$HOME" DDP_LAB_LAUNCH="${DDP_LAB_LAUNCH:-}" \\
    %s="$host" sh -c "$*"
""" % HOST_VARIABLE


def install() -> str | None:
    """Install Open MPI where `mpirun` is missing; None when it is there, else one line saying why not."""
    return debian.install(PACKAGES, COMMANDS)


def hosts(count: int) -> list[str]:
    """The emulated hosts' names: 127.0.0.1 (where mpirun runs), 127.0.0.2, ..."""
    return [f"127.0.0.{k + 1}" for k in range(count)]


def emulated_hosts(folder: Path, count: int, slots: int) -> dict[str, str]:
    """The environment for running the launcher on `count` emulated hosts of `slots` processes each:
    writes a hostfile and the ssh stand-in into `folder`, and names them (HOSTFILE for the launcher,
    OMPI_MCA_plm_rsh_agent, mpirun's own setting, for the agent)."""
    folder.mkdir(parents=True, exist_ok=True)
    hostfile = folder / "hosts.txt"
    hostfile.write_text("".join(f"{host} slots={slots}\n" for host in hosts(count)))
    agent = folder / "fake_ssh"
    agent.write_text(FAKE_SSH)
    agent.chmod(0o755)
    return {"HOSTFILE": str(hostfile), "OMPI_MCA_plm_rsh_agent": str(agent)}
