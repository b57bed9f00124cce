"""pi by the midpoint rule, written from scratch: module-level arguments, the world size read
back from the process group, a reduce to rank 0 (the only rank that prints), and its own wording."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

parser = argparse.ArgumentParser()
parser.add_argument("--world-size", type=int, default=2)
parser.add_argument("--intervals", type=int, default=1_000_000)
ARGS = parser.parse_args()
if ARGS.world_size < 1:
    sys.exit("error: --world-size must be at least 1")


def run(rank):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=ARGS.world_size)
    n, size = ARGS.intervals, dist.get_world_size()
    k = torch.arange(dist.get_rank(), n, size, dtype=torch.float64)  # every size-th rectangle
    estimate = (4.0 / (1.0 + ((k + 0.5) / n) ** 2)).sum() / n
    dist.reduce(estimate, dst=0)
    if dist.get_rank() == 0:
        print("Estimated value of pi: %.14f" % estimate.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(run, nprocs=ARGS.world_size)
