"""K-FAC: gradients preconditioned by an approximation of the curvature, layer by layer, across processes.

    python exercises/kfac.py --world-size 2 --optimizer sgd  --log-file runs/sgd.jsonl
    python exercises/kfac.py --world-size 2 --optimizer kfac --update-freq 10 --log-file runs/kfac.jsonl

A second-order method steps along F^-1 grad instead of grad, F being the curvature (here the
empirical Fisher matrix: G comes from the loss with the true labels; notebook 25 says what that
approximates, and what it does not). F is far too large to keep, so K-FAC (Martens and Grosse, 2015)
approximates it layer by layer, each layer's block by a Kronecker product of two small matrices:
A, from the layer's inputs, and G, from the gradients of its outputs. The inverse of a Kronecker
product is the Kronecker product of the inverses, so a layer's preconditioned gradient needs only
A's and G's eigendecompositions, with a damping term that keeps small eigenvalues from blowing up.

Distributed (one end of the range of KAISA, Pauloski et al., whose kfac_pytorch can also let a
fraction of the ranks precondition and send the result): every rank sees a share of the batch, so
A and G are averaged over the ranks; each layer's eigendecompositions are computed by one rank
only and shared with every other; and all of that is done only every `update_freq` steps, the
steps between reusing the last decompositions, which trades freshness for communication.
Notebooks 25 and 26 have hints you open when you want them.
"""
import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


class KFAC:
    """Preconditions the gradient of every nn.Linear of `model` in place; call step() after
    backward() and before optimizer.step()."""

    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping, self.factor_decay, self.update_freq = damping, factor_decay, update_freq
        self.steps = 0
        # TODO kfac: from now on, every training forward and backward pass through each layer must
        # leave what its factors A and G are made of (notebook 25 defines them) where step() finds
        # them.
        pass  # your code

    @torch.no_grad()
    def step(self):
        # TODO kfac: on return, each layer's weight.grad and bias.grad hold its preconditioned gradient,
        # (A kron G + damping x I)^-1 applied to the weight's and the bias's gradient taken as one
        # matrix, with A and G the running averages of notebook 25, refreshed (with their
        # decompositions) at steps 0, update_freq, 2 x update_freq, ... (step() calls counted from 0),
        # the last ones reused in between.
        # TODO kfac_distributed: in a process group of N > 1 ranks, each seeing 1/N of the batch, the
        # preconditioned gradients must be those of one process on the whole batch; each layer's
        # decompositions are computed by exactly one rank and reach the others from it; between
        # refreshes, step() makes no collective.
        pass  # your code


# The rest trains a small network on Fashion-MNIST with DDP, with or without K-FAC.

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


@torch.no_grad()
def kl_clip(model, raw, lr, clip):
    """Scale the preconditioned step down when it would move the model's outputs too far, as
    kfac_pytorch does (its kl_clip): a direction of small curvature gets a large step, and a step
    that large, with momentum, throws training off."""
    moved = sum((r * p.grad).sum() for r, p in zip(raw, model.parameters())).item() * lr * lr
    if moved > clip:
        for p in model.parameters():
            p.grad.mul_((clip / moved) ** 0.5)


def load_datasets(data_dir, download):
    try:
        return (FashionMNIST(data_dir, train=True, download=download, transform=ToTensor()),
                FashionMNIST(data_dir, train=False, download=download, transform=ToTensor()))
    except (OSError, RuntimeError) as err:  # no network, and no files
        reason = str(err).strip().splitlines()[-1]
        sys.exit(f"error: no Fashion-MNIST in {data_dir}/FashionMNIST/raw/ and no way to get it ({reason}). "
                 "Make a synthetic stand-in with `make synthetic-data` and use --data-dir data/synthetic.")


def worker(rank, args):
    torch.set_num_threads(1)
    use_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if use_gpu:
        torch.cuda.set_device(rank)  # before the process group, so that NCCL uses this GPU
    device = torch.device("cuda", rank) if use_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if use_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=120))
    train_set, val_set = load_datasets(args.data_dir, download=False)  # main() fetched them
    if args.train_images:
        train_set = Subset(train_set, range(min(args.train_images, len(train_set))))
    per_rank = args.batch_size // args.world_size
    sampler = DistributedSampler(train_set, shuffle=True, drop_last=True)
    loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True)
    model = nn.parallel.DistributedDataParallel(make_model().to(device), device_ids=[rank] if use_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    preconditioner = KFAC(model, damping=args.damping, update_freq=args.update_freq) if args.optimizer == "kfac" else None
    start, steps = time.perf_counter(), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, labels in loader:
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients
            if preconditioner is not None:
                raw = [p.grad.clone() for p in model.parameters()]
                preconditioner.step()
                kl_clip(model, raw, args.lr, args.kl_clip)
            optimizer.step()
            steps += 1
        model.eval()
        correct = torch.zeros(2, device=device)
        with torch.no_grad():
            for images, labels in DataLoader(val_set, batch_size=1000):
                correct += torch.tensor([(model(images.to(device)).argmax(1) == labels.to(device)).sum().item(),
                                         len(labels)], device=device)
        seconds = time.perf_counter() - start
        if rank == 0:
            found = {"optimizer": args.optimizer, "update_freq": args.update_freq, "world_size": args.world_size,
                     "batch_size": args.batch_size, "epoch": epoch + 1, "steps": steps, "seconds": seconds,
                     "seconds_per_step": seconds / steps, "accuracy": (correct[0] / correct[1]).item()}
            print(f"{args.optimizer} epoch {epoch + 1}: validation accuracy {found['accuracy']:.1%}, "
                  f"{found['seconds_per_step'] * 1000:.0f} ms a step", flush=True)
            if args.log_file:
                with open(args.log_file, "a") as f:
                    f.write(json.dumps(found) + "\n")
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
    parser = argparse.ArgumentParser(description="Train with SGD, or SGD preconditioned by K-FAC, on N processes.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--optimizer", choices=["sgd", "kfac"], default="kfac")
    parser.add_argument("--update-freq", type=positive_int, default=10, help="K-FAC: refresh the factors every k steps")
    parser.add_argument("--damping", type=float, default=0.003)
    parser.add_argument("--kl-clip", type=float, default=0.001, help="K-FAC: the largest step, see kl_clip()")
    parser.add_argument("--batch-size", type=positive_int, default=1024, help="the global batch")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--train-images", type=int, default=0, help="train on the first N images only (0: all)")
    parser.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"))
    parser.add_argument("--log-file", help="rank 0 appends one JSON line per epoch to this file")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error("--batch-size must divide by --world-size")
    load_datasets(args.data_dir, download=True)  # once, before any process starts: one download, one clear error
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
