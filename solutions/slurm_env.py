"""From SLURM's variables to PyTorch's: what a task that srun started needs before it can join
the job's process group with init_process_group's env:// (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and pick its GPU as a script started by torchrun does (LOCAL_RANK, LOCAL_WORLD_SIZE).

    python exercises/slurm_env.py --nodes 2 --ntasks-per-node 2

Started by hand, it asks SLURM for a job and runs itself as its tasks: `srun` starts one task per
process, and each task, this same file again, turns its SLURM_* variables into PyTorch's, joins a
gloo group and makes one all_reduce to prove that the group formed. It needs a SLURM to talk to:
a cluster's login node, or the course's cluster on this machine (`make slurm-up`, then the
`export SLURM_CONF=...` it prints; its nodes n1, n2 are emulated on this one machine).

Your TODO is torch_env_from_slurm(). Starting the job and joining the group are done for you.
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys

PORT_BASE, PORT_SPAN = 20000, 20000  # the ports a job's rendezvous may get: 20000 to 39999


def torch_env_from_slurm(environ):
    """PyTorch's rendezvous variables for the SLURM task whose variables are `environ`."""
    hosts = subprocess.run(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    return {
        "RANK": environ["SLURM_PROCID"],
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_WORLD_SIZE": environ["SLURM_NTASKS_PER_NODE"],
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(PORT_BASE + int(environ["SLURM_JOB_ID"]) % PORT_SPAN),
    }


def join():
    """One task of the job: PyTorch's variables from SLURM's, then the group and one all_reduce."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(torch_env_from_slurm(dict(os.environ)))
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    total = torch.ones(1)
    dist.all_reduce(total)  # every task adds 1: the group's size, if they all joined the same group
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} (local rank {os.environ['LOCAL_RANK']} on "
          f"{os.environ.get('SLURMD_NODENAME', '?')}), master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}: "
          f"all_reduce of ones gave {int(total.item())}", flush=True)
    dist.destroy_process_group()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def submit(nodes, per_node):
    """Run this file as the tasks of a job of `nodes` x `per_node`: srun, outside a job, asks for
    one and starts the tasks in it. --kill-on-bad-exit: one failing task stops the others."""
    if shutil.which("srun") is None:
        sys.exit("srun not found: run this where SLURM is (a cluster's login node, or `make slurm-up` here)")
    return subprocess.run(["srun", f"--nodes={nodes}", f"--ntasks-per-node={per_node}", "--kill-on-bad-exit=1",
                           sys.executable, os.path.abspath(__file__)]).returncode


def main():
    if "SLURM_PROCID" in os.environ:  # a task that srun started
        join()
        return
    parser = argparse.ArgumentParser(description="Run this file as the tasks of a SLURM job.")
    parser.add_argument("--nodes", type=positive_int, default=2, help="nodes of the job (default 2)")
    parser.add_argument("--ntasks-per-node", type=positive_int, default=2, help="tasks on each node (default 2)")
    args = parser.parse_args()
    sys.exit(submit(args.nodes, args.ntasks_per_node))


if __name__ == "__main__":
    main()
