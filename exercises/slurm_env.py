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


def torch_env_from_slurm(environ):
    """PyTorch's rendezvous variables for the SLURM task whose variables are `environ`."""
    # TODO slurm_env: `environ` is one task's environment as srun gives it: a dict of strings
    # holding SLURM's variables for the job, its node and the task itself (notebook 16 has the
    # table). Return a dict of strings with the six variables torchrun would have set: RANK,
    # WORLD_SIZE, MASTER_ADDR and MASTER_PORT (what init_process_group's env:// reads), LOCAL_RANK
    # and LOCAL_WORLD_SIZE (what a training script reads to pick its GPU), worked out from
    # `environ` alone (the checker calls it with made-up tasks, outside any job). Over
    # all the tasks of one job (N tasks, k on each node), what they get must hold together:
    # - the ranks are 0 to N-1, each given to one task, and every task's world size is N;
    # - on each node, the local ranks are 0 to k-1, each given to one of its tasks, and every
    #   task's local world size is k;
    # - every task gets the same address: the name of the job's first node. SLURM writes the
    #   node list compressed (`gpu[07-08]`, `n[01-03,07],login2`), and the list is not a host name;
    # - rank 0 runs on that node: it hosts the rendezvous there;
    # - every task gets the same port, one an ordinary user may listen on (1024 to 65535), and
    #   two jobs with different ids, which may share a node, get different ports.
    return {}


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
