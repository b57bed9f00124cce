"""A collective that one rank makes alone: rank 0 reports the mean loss over all ranks.

    python exercises/hang_collective.py --world-size 2

Every rank trains the same small DDP model on batches of its own. At the end of each epoch,
every rank prints its own training loss, and rank 0 prints the mean of all the ranks' losses.
In exercises/hang_collective.py this hangs after the first epoch (notebook 23 shows where each
rank waits); this file is the fixed one.
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


def make_batches(rank, count, batch_size=16):
    """This rank's training batches: a noisy linear target, drawn differently on each rank."""
    generator = torch.Generator().manual_seed(100 + rank)
    weights = torch.linspace(-1.0, 1.0, FEATURES)
    batches = []
    for _ in range(count):
        x = torch.randn(batch_size, FEATURES, generator=generator)
        y = x @ weights + 0.1 * torch.randn(batch_size, generator=generator)
        batches.append((x, y.unsqueeze(1)))
    return batches


def train_epoch(model, optimizer, batches):
    """One pass over this rank's batches; this rank's mean loss, as a 1-element tensor."""
    total = torch.zeros(1)
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients over the ranks here
        optimizer.step()
        total += loss.detach()
    return total / len(batches)


def report_mean_loss(loss, epoch):
    """Rank 0 prints the mean over all ranks of their epoch losses (`loss`: this rank's)."""
    world_size = dist.get_world_size()
    total = loss.clone()
    dist.all_reduce(total)  # every rank makes the collective; only rank 0 prints
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: mean loss over {world_size} ranks {total.item() / world_size:.6f}", flush=True)


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
    batches = make_batches(rank, args.batches)
    for epoch in range(args.epochs):
        loss = train_epoch(model, optimizer, batches)
        print(f"rank {rank}: epoch {epoch}, loss {loss.item():.6f}", flush=True)
        report_mean_loss(loss, epoch)
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
    parser = argparse.ArgumentParser(description="Rank 0 reports the mean loss over all ranks.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (default 2)")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batches", type=positive_int, default=4, help="batches an epoch on each rank")
    parser.add_argument("--timeout", type=positive_int, default=30,
                        help="seconds a collective may wait before the process group gives up (default 30)")
    args = parser.parse_args()
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
