"""Every process runs this same program. Only two numbers differ between them: the rank.

    python demos/hello_ranks.py --world-size 4

Run it a few times and compare the order of the lines.
"""
import argparse
import datetime
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))  # a peer that never comes: stop
    # the same code in every process; what differs is what get_rank() returns
    print(f"hello from rank {dist.get_rank()} of {dist.get_world_size()} (process {os.getpid()})", flush=True)
    if rank % 2 == 0:
        print(f"rank {rank} is even: it takes the first branch", flush=True)
    else:
        print(f"rank {rank} is odd: it takes the other branch", flush=True)
    dist.destroy_process_group()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description="Start N processes that each say who they are.")
    parser.add_argument("--world-size", type=positive_int, default=4, help="how many processes (default 4)")
    args = parser.parse_args()
    os.environ["MASTER_ADDR"] = "localhost"  # every process runs on this machine
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(args.world_size,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
