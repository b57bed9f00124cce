"""Uneven batches: the ranks hold different numbers of batches.

    python exercises/hang_uneven.py --world-size 2 --batches 11

The data set's batches are dealt out to the ranks like cards: with 11 batches and 2 ranks, rank 0
gets 6 and rank 1 gets 5. Every rank trains the same small DDP model on its own batches, and the
epoch ends with a barrier. As it is, the script hangs in the first epoch whenever the batches do
not deal out evenly. Find where each rank waits (notebook 23 shows three ways), then fix
`# TODO hang_uneven`.

Check it: python -m autograde check --step hang_uneven
"""
import argparse
import datetime
import gc
import hashlib
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

FEATURES = 8


def make_batches(rank, world_size, count, batch_size=16):
    """This rank's share of the data set's `count` batches (a noisy linear target), dealt out in turn."""
    generator = torch.Generator().manual_seed(100)
    weights = torch.linspace(-1.0, 1.0, FEATURES)
    batches = []
    for _ in range(count):
        x = torch.randn(batch_size, FEATURES, generator=generator)
        y = x @ weights + 0.1 * torch.randn(batch_size, generator=generator)
        batches.append((x, y.unsqueeze(1)))
    return batches[rank::world_size]


def train_epoch(model, optimizer, batches):
    """One pass over this rank's batches; this rank's mean loss, as a 1-element tensor."""
    # TODO hang_uneven: the ranks may hold different numbers of batches (`batches` is this rank's
    # list). Every rank must return from this function every epoch, whatever those numbers are.
    # Each rank must train on at least as many batches as the rank with the fewest holds, and
    # every optimizer step must leave the model the same on every rank.
    total = torch.zeros(1)
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients over the ranks here
        optimizer.step()
        total += loss.detach()
    return total / max(len(batches), 1)


def fingerprint(model):
    """A short digest of the model's weights: equal on every rank when the ranks are in step."""
    digest = hashlib.sha1()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()[:12]


def worker(rank, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(FEATURES, 1))  # rank 0's weights, on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = make_batches(rank, args.world_size, args.batches)
    print(f"rank {rank}: {len(batches)} batches an epoch", flush=True)
    for epoch in range(args.epochs):
        loss = train_epoch(model, optimizer, batches)
        print(f"rank {rank}: epoch {epoch}, loss {loss.item():.6f}", flush=True)
        dist.barrier()  # the epoch ends when every rank is done with it
    print(f"rank {rank}: done after {args.epochs} epochs, weights {fingerprint(model)}", flush=True)
    # Free DDP (its hooks make reference cycles, hence gc) before the process group: a DDP model
    # that outlives its group can abort the process at exit.
    del model, optimizer
    gc.collect()
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
    parser = argparse.ArgumentParser(description="Train on batches dealt out to the ranks.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (default 2)")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batches", type=positive_int, default=11, help="batches in the data set (default 11)")
    parser.add_argument("--timeout", type=positive_int, default=30,
                        help="seconds a collective may wait before the process group gives up (default 30)")
    args = parser.parse_args()
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
