"""Data parallelism's central claim, checked: averaging gradients is training with a bigger batch.

Each of P processes takes a different batch of b samples, and DDP averages their gradients.
Because the loss is a mean over samples, that average is exactly the gradient of one batch
of P*b samples, so P processes with batch b end up with the same weights as one process with
batch P*b, step after step. This script trains a small network both ways on the same samples
and prints how far apart the two sets of weights are.

    python demos/big_batch_equivalence.py                 # P = 2, the same weights
    python demos/big_batch_equivalence.py --batchnorm     # BatchNorm: they differ

The claim needs every sample's loss to depend on that sample alone. BatchNorm in training
mode normalises with statistics of the batch each process sees (b samples, not P*b), so with
it the weights drift apart: that is what SyncBatchNorm is for.
"""
import argparse
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def make_model(batchnorm):
    torch.manual_seed(0)  # every run starts from the same weights
    layers = [nn.Conv2d(1, 8, kernel_size=3, padding=1)]
    if batchnorm:
        layers.append(nn.BatchNorm2d(8))
    layers += [nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(), nn.Linear(8 * 7 * 7, 10)]
    return nn.Sequential(*layers)


def make_data(num_samples):
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(num_samples, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (num_samples,), generator=generator)
    return images, labels


def train(model, images, labels, batch_size, steps, lr, offset=0, stride=None):
    """SGD for `steps` steps; step s uses samples [s*stride + offset, s*stride + offset + batch_size)."""
    stride = stride or batch_size
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        first = step * stride + offset
        loss = F.cross_entropy(model(images[first:first + batch_size]), labels[first:first + batch_size])
        optimizer.zero_grad()
        loss.backward()  # under DDP, this also averages the gradients of all processes
        optimizer.step()


def ddp_worker(rank, args, result_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.processes)
    model = nn.parallel.DistributedDataParallel(make_model(args.batchnorm))
    images, labels = make_data(args.processes * args.batch_size * args.steps)
    # In every step, process `rank` takes its own b samples out of the big batch of P*b.
    train(model, images, labels, args.batch_size, args.steps, args.lr,
          offset=rank * args.batch_size, stride=args.processes * args.batch_size)
    if rank == 0:
        torch.save(model.module.state_dict(), result_file)
    del model  # free DDP before its process group: one that outlives the group can abort the process at exit
    dist.barrier()  # leave together: a rank that tears down gloo while the other still talks to it can abort
    dist.destroy_process_group()


def relative_difference(a, b):
    """The largest ||a - b|| / ||b|| over the model's tensors."""
    return max(((a[k].double() - b[k].double()).norm() / b[k].double().norm().clamp_min(1e-12)).item() for k in b)


def main():
    parser = argparse.ArgumentParser(description="P processes with batch b vs one process with batch P*b.")
    parser.add_argument("--processes", type=int, default=2, help="P, processes under DDP")
    parser.add_argument("--batch-size", type=int, default=8, help="b, samples per process per step")
    parser.add_argument("--steps", type=int, default=5, help="SGD steps")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument("--batchnorm", action="store_true", help="put a BatchNorm layer in the network")
    args = parser.parse_args()
    if min(args.processes, args.batch_size, args.steps) < 1:
        parser.error("--processes, --batch-size and --steps must be at least 1")

    # One process, batch P*b.
    big_batch = make_model(args.batchnorm)
    images, labels = make_data(args.processes * args.batch_size * args.steps)
    train(big_batch, images, labels, args.processes * args.batch_size, args.steps, args.lr)

    # P processes with batch b each, under DDP on the CPU (gloo).
    with socket.socket() as s:  # ask the system for a free port
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "ddp.pt")
        mp.spawn(ddp_worker, args=(args, result_file), nprocs=args.processes)
        ddp = torch.load(result_file)

    difference = relative_difference(ddp, big_batch.state_dict())
    print(f"{args.processes} processes x batch {args.batch_size} vs 1 process x batch "
          f"{args.processes * args.batch_size}, {args.steps} steps"
          f"{' (with BatchNorm)' if args.batchnorm else ''}")
    print(f"largest relative difference between the weights: {difference:.2e}")
    print("the same weights (up to rounding)" if difference < 1e-5 else "different weights")


if __name__ == "__main__":
    main()
