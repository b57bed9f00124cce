"""A distributed sampler of your own: which images each process trains on, epoch by epoch.

    python exercises/shard_sampler.py --world-size 4 --size 10

In data-parallel training every process must see a different part of the data set, and all of
them together must see all of it. DistributedSampler does that; here you write one that keeps the
same promises. For any data set size, number of ranks N and rank:

- every rank gets len(sampler) indices, the same number on every rank (a rank with fewer batches
  would leave the others waiting in an all-reduce it never makes, until the process group's
  timeout);
- without drop_last, the ranks' shares together hold every index, with fewer than N repeated so
  that the shares come out equal; with drop_last=True, no index is repeated, and fewer than N are
  left out;
- the shares are disjoint: no index on two ranks, apart from those repeats;
- the ranks agree without sending anything: for a given seed and epoch, every rank works out the
  same order of the data set; with shuffle, a new order for each epoch (set_epoch) and each seed;
  without shuffle, 0, 1, 2, ... in every epoch;
- iterating the sampler again in the same epoch gives the same indices.

Your TODOs are in ShardSampler.__iter__ and __len__. Running the file shows each rank's shard.
"""
import argparse
import datetime
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import Sampler


class ShardSampler(Sampler):
    """This rank's share of the indices 0 .. len(dataset)-1, shuffled anew each epoch."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        self.size = len(dataset)
        # like DistributedSampler: without them, ask the process group
        self.num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        self.rank = dist.get_rank() if rank is None else rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch):
        """Call it before each epoch: the shuffle depends on it."""
        self.epoch = epoch

    def __iter__(self):
        # TODO sampler: order must be this epoch's order of all the indices 0 .. size - 1: the same
        # on every rank for a given seed and epoch, and new with each epoch and seed when shuffle is
        # on; 0, 1, 2, ... when it is off.
        order = list(range(self.size))
        # TODO sampler: return only this rank's share of that order: len(self) indices, disjoint
        # from the other ranks' shares, and all the shares together as the module docstring says
        # (every index, or with drop_last fewer than num_replicas left out).
        return iter(order)

    def __len__(self):
        # TODO sampler: how many indices each rank gets, the same number on every rank (see drop_last
        # in the module docstring)
        return self.size


def worker(rank, args):
    torch.set_num_threads(1)  # one core per process: the processes share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))  # a peer that never comes: stop
    sampler = ShardSampler(range(args.size), shuffle=not args.no_shuffle, seed=args.seed, drop_last=args.drop_last)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        print(f"epoch {epoch}, rank {rank}: {list(sampler)}")
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
    parser = argparse.ArgumentParser(description="Show each rank's shard of a data set, epoch by epoch.")
    parser.add_argument("--world-size", type=positive_int, default=4, help="how many processes (default 4)")
    parser.add_argument("--size", type=positive_int, default=10, help="how many items in the data set (default 10)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="how many epochs to show (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="the shuffle's seed (default 0)")
    parser.add_argument("--drop-last", action="store_true", help="drop the tail instead of padding")
    parser.add_argument("--no-shuffle", action="store_true", help="keep the order 0, 1, 2, ...")
    args = parser.parse_args()
    os.environ["MASTER_ADDR"] = "localhost"  # every process runs on this machine
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
