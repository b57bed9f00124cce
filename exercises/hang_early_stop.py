"""Early stopping: rank 0 judges the validation loss, and the ranks must stop together.

    python exercises/hang_early_stop.py --world-size 2 --target-loss 0.2

Every rank trains the same small DDP model on batches of its own. After each epoch rank 0 alone
measures the validation loss (the other ranks would only repeat its work), and training stops
once that loss is below --target-loss. As it is, the script hangs as soon as rank 0 wants to
stop. Find where each rank waits (notebook 23 shows three ways), then fix `# TODO hang_early_stop`.

Check it: python -m autograde check --step hang_early_stop
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


def make_batches(seed, count, batch_size=16):
    """`count` batches of a noisy linear target, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
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


@torch.no_grad()
def validation_loss(model, batches):
    return sum(F.mse_loss(model(x), y).item() for x, y in batches) / len(batches)


def should_stop(model, val_batches, target_loss, epoch):
    """Whether training stops after this epoch: rank 0 measures the validation loss, prints it,
    and wants to stop once it is below target_loss. Returns the decision, a bool."""
    # TODO hang_early_stop: every rank calls this after each epoch. It must return the same
    # bool on every rank: True exactly when rank 0's validation loss is below target_loss.
    # Only rank 0 measures and prints that loss.
    stop = False
    if dist.get_rank() == 0:
        loss = validation_loss(model, val_batches)
        print(f"epoch {epoch}: validation loss {loss:.6f}", flush=True)
        stop = loss < target_loss
    return stop


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
    batches = make_batches(100 + rank, args.batches)  # each rank its own
    val_batches = make_batches(99, 4)
    epochs = 0
    for epoch in range(args.epochs):
        loss = train_epoch(model, optimizer, batches)
        epochs += 1
        print(f"rank {rank}: epoch {epoch}, loss {loss.item():.6f}", flush=True)
        if should_stop(model.module, val_batches, args.target_loss, epoch):
            break
    dist.barrier()  # every rank is done training
    print(f"rank {rank}: done after {epochs} epochs, weights {fingerprint(model)}", flush=True)
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
    parser = argparse.ArgumentParser(description="Train until rank 0's validation loss is low enough.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (default 2)")
    parser.add_argument("--epochs", type=positive_int, default=6, help="at most this many epochs (default 6)")
    parser.add_argument("--batches", type=positive_int, default=4, help="batches an epoch on each rank")
    parser.add_argument("--target-loss", type=float, default=0.2,
                        help="stop once rank 0's validation loss is below this (default 0.2)")
    parser.add_argument("--timeout", type=positive_int, default=30,
                        help="seconds a collective may wait before the process group gives up (default 30)")
    args = parser.parse_args()
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
