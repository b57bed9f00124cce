"""Gradient accumulation under DDP, with and without no_sync().

    python demos/no_sync_accumulation.py --world-size 2 --accumulate 4

To train with a batch larger than fits in memory, each process runs backward() on several
micro-batches and steps once: the gradients add up in .grad. Under DDP every backward() ends with
an all-reduce of every gradient, so accumulating over 4 micro-batches costs 4 all-reduces per
step, of which only the last is needed. Inside `with model.no_sync():` DDP skips them: the
gradients add up locally, and the backward() after the block all-reduces the sum once.

Both ways give the gradient of one big batch (accumulate x world size x micro-batch images), so
the weights end equal to one process trained on the big batches. This script shows it, and counts
the all-reduces with a DDP communication hook.
"""
import argparse
import contextlib
import datetime
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def counting_allreduce(state, bucket):
    """DDP's own all-reduce of a bucket (a sum, then divided by the world size), counted."""
    state["all_reduces"] += 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def big_batches(args):
    """Every step's big batch, the same on every process (each takes its own slices of it)."""
    generator = torch.Generator().manual_seed(0)
    size = args.accumulate * args.world_size * args.micro_batch
    return [(torch.randn(size, 32, generator=generator), torch.randint(0, 10, (size,), generator=generator))
            for _ in range(args.steps)]


def train(rank, args, use_no_sync):
    model = nn.parallel.DistributedDataParallel(make_model())
    counter = {"all_reduces": 0}
    model.register_comm_hook(counter, counting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in big_batches(args):
        optimizer.zero_grad(set_to_none=True)
        for k in range(args.accumulate):
            # micro-batch k of this process: its own slice of the big batch
            start = (k * args.world_size + rank) * args.micro_batch
            images, labels = x[start:start + args.micro_batch], y[start:start + args.micro_batch]
            last = k == args.accumulate - 1
            # no_sync() on every micro-batch but the last: its backward() all-reduces the sum
            with model.no_sync() if use_no_sync and not last else contextlib.nullcontext():
                # divided by accumulate: the sum of the micro-batches' gradients becomes their average
                (F.cross_entropy(model(images), labels) / args.accumulate).backward()
        optimizer.step()
    return model.module, counter["all_reduces"] / args.steps


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo: this comparison is about arithmetic, and runs on the CPU, GPUs or not.
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    with_no_sync, with_count = train(rank, args, use_no_sync=True)
    without, without_count = train(rank, args, use_no_sync=False)
    # One process, the whole big batch at once: what both must reproduce.
    single = make_model()
    optimizer = torch.optim.SGD(single.parameters(), lr=0.1)
    for x, y in big_batches(args):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(single(x), y).backward()
        optimizer.step()

    def difference(model):
        return max((a - b).abs().max().item() for a, b in zip(model.parameters(), single.parameters()))

    found = {"no_sync": {"all_reduces_per_step": with_count, "difference": difference(with_no_sync)},
             "every_backward": {"all_reduces_per_step": without_count, "difference": difference(without)}}
    if rank == 0:
        for name, f in found.items():
            print(f"{name:15} {f['all_reduces_per_step']:g} all-reduce(s) per optimizer step, weights "
                  f"{f['difference']:.1e} from one process on the big batch", flush=True)
        if args.json_file:
            with open(args.json_file, "w") as f:
                json.dump({"accumulate": args.accumulate, **found}, f)
    dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="Gradient accumulation under DDP, with and without no_sync().")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--accumulate", type=positive_int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--micro-batch", type=positive_int, default=8, help="images per micro-batch and process")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--json-file", help="also write the counts and differences here")
    args = parser.parse_args()
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
