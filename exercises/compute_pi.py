"""Compute pi with several processes: each adds up its share of a sum, all_reduce adds the shares.

    python exercises/compute_pi.py --world-size 4

pi is the integral of f(x) = 4 / (1 + x^2) from 0 to 1. The midpoint rule approximates it
with n thin rectangles of width 1/n:

    pi ~ (1/n) * (f(0.5/n) + f(1.5/n) + ... + f((n - 0.5)/n))

The n terms do not depend on each other, so each of the processes can add up its own share
of them. One all_reduce then gives every process the sum of all the shares: pi.

Your two TODOs are in compute_pi(). Starting the processes and the process group is done
for you below, as the lab's Step 10 does it.
"""
import argparse
import datetime
import math
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def f(x):
    return 4.0 / (1.0 + x * x)


def compute_pi(rank, world_size, intervals, device):
    """The midpoint sum over this rank's share of the rectangles, added up over all ranks."""
    # TODO pi: only this rank's share of the rectangles. start and stop must be this rank's own
    # range of rectangle numbers (stop not included), such that the ranks' ranges together cover
    # every rectangle 0 .. intervals - 1 exactly once, whatever world_size and intervals (world_size
    # need not divide intervals), and no rank gets much more than its 1/world_size of them.
    start, stop = 0, intervals
    i = torch.arange(start, stop, dtype=torch.float64, device=device)
    part = f((i + 0.5) / intervals).sum() / intervals
    # TODO pi: what this returns must be pi on every rank: the sum of all the ranks' parts, not
    # only this rank's part.
    return part.item()


def worker(rank, args):
    torch.set_num_threads(1)  # one core per process: the processes share the machine's cores
    # One GPU per process where there are enough of them (NCCL), else CPU processes (gloo).
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if on_gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))  # a peer that never comes: stop
    dist.barrier()  # start the clock together
    started = time.perf_counter()
    pi = compute_pi(rank, args.world_size, args.intervals, device)
    seconds = time.perf_counter() - started
    if rank == 0:
        print(f"pi = {pi:.15f} (error {abs(pi - math.pi):.1e}) from {args.intervals} rectangles "
              f"on {args.world_size} processes in {seconds:.3f} s")
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
    parser = argparse.ArgumentParser(description="Compute pi with several processes.")
    parser.add_argument("--world-size", type=positive_int, default=4, help="how many processes (default 4)")
    parser.add_argument("--intervals", type=positive_int, default=10_000_000,
                        help="how many rectangles under the curve (default 10,000,000)")
    parser.add_argument("--master-port", type=int, default=0, help="the rendezvous port (default: a free one)")
    args = parser.parse_args()
    os.environ["MASTER_ADDR"] = "localhost"  # every process runs on this machine
    os.environ["MASTER_PORT"] = str(args.master_port or free_port())
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
