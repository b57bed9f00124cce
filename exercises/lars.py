"""LARS: a learning rate for every layer, scaled by how large its weights are against its gradient.

    python exercises/lars.py --optimizer sgd  --batch-size 2048 --lr 0.8 --warmup-epochs 2 --log-file runs/sgd.jsonl
    python exercises/lars.py --optimizer lars --batch-size 2048 --lr 8 --warmup-epochs 2 --log-file runs/lars.jsonl

A large batch keeps many processes busy, but with the same number of epochs it takes fewer steps,
and the linearly scaled learning rate that makes up for it can throw some layers off: their
update becomes large against their weights. LARS (You, Gitman and Ginsburg, 2017) gives every
layer its own rate, a trust ratio: eta x ||w|| / (||grad|| + weight_decay x ||w||). A layer whose
gradient is small against its weights takes larger steps, one whose gradient is large takes
smaller ones, whatever the global rate. Biases and the scales and shifts of normalisation layers
(the parameters with one dimension) are left out, as in common practice: they keep the global
rate and no weight decay. Notebook 24 has hints you open when you want them.

One process trains on the whole large batch here: it computes the same gradient as N processes on
N shares of it (notebook 02's point), and an optimizer only sees the gradient.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


class LARS(torch.optim.Optimizer):
    """SGD with momentum and weight decay, each weight's step scaled by its layer's trust ratio."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta))

    @torch.no_grad()
    def step(self):
        # TODO lars: move every parameter that has a gradient, in every param group (with that group's
        # lr, momentum, weight_decay and eta), as notebook 24's LARS update says: the trust ratio for
        # parameters with more than one dimension (1 when the weight's or the gradient's norm is 0), none
        # and no weight decay for those with one dimension, and a momentum buffer per parameter kept in
        # self.state[p].
        pass  # your code


# The rest trains a small WideResNet at a large batch with SGD or LARS, with a warm-up.

def conv_unit(in_channels, out_channels):
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.body = nn.Sequential(conv_unit(in_channels, out_channels), conv_unit(out_channels, out_channels))
        self.shortcut = (nn.Identity() if in_channels == out_channels
                         else nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False))

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


def wide_resnet(widen_factor):
    """The lab's WideResNet (without its dropout), 16k to 64k channels wide."""
    w1, w2, w3 = 16 * widen_factor, 32 * widen_factor, 64 * widen_factor
    return nn.Sequential(conv_unit(1, 16), ResidualBlock(16, w1), nn.MaxPool2d(2), ResidualBlock(w1, w2),
                         nn.MaxPool2d(2), ResidualBlock(w2, w3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(w3, 10))


def mlp():
    """The small network of exercises/kfac.py's program: the same model for the three optimizers of notebook 26."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def load_datasets(data_dir):
    try:
        return (FashionMNIST(data_dir, train=True, download=True, transform=ToTensor()),
                FashionMNIST(data_dir, train=False, download=True, transform=ToTensor()))
    except (OSError, RuntimeError) as err:  # no network, and no files
        reason = str(err).strip().splitlines()[-1]
        sys.exit(f"error: no Fashion-MNIST in {data_dir}/FashionMNIST/raw/ and no way to get it ({reason}). "
                 "Make a synthetic stand-in with `make synthetic-data` and use --data-dir data/synthetic.")


@torch.no_grad()
def accuracy(model, loader):
    model.eval()
    correct = total = 0
    for images, labels in loader:
        correct += (model(images).argmax(dim=1) == labels).sum().item()
        total += len(labels)
    return correct / total


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="Train at a large batch with SGD or LARS.")
    parser.add_argument("--optimizer", choices=["sgd", "lars"], default="lars")
    parser.add_argument("--batch-size", type=positive_int, default=2048)
    parser.add_argument("--lr", type=float, default=8.0, help="the global rate, reached after the warm-up")
    parser.add_argument("--warmup-epochs", type=float, default=2, help="the rate rises linearly from 0 over these")
    parser.add_argument("--epochs", type=positive_int, default=6)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--model", choices=["wideresnet", "mlp"], default="wideresnet",
                        help="the lab's WideResNet, or exercises/kfac.py's small network")
    parser.add_argument("--widen-factor", type=int, default=1)
    parser.add_argument("--train-images", type=int, default=0, help="train on the first N images only (0: all)")
    parser.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"))
    parser.add_argument("--log-file", help="append one JSON line per epoch to this file")
    args = parser.parse_args()
    if args.lr <= 0:
        parser.error("--lr must be above 0")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    train_set, val_set = load_datasets(args.data_dir)
    if args.train_images:
        train_set = Subset(train_set, range(min(args.train_images, len(train_set))))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=1024)
    if len(train_loader) == 0:
        parser.error(f"--batch-size {args.batch_size} is larger than the {len(train_set)} training images")
    model = wide_resnet(args.widen_factor) if args.model == "wideresnet" else mlp()
    if args.optimizer == "lars":
        optimizer = LARS(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay)
    warmup_steps, step, start = args.warmup_epochs * len(train_loader), 0, time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_loader:
            for group in optimizer.param_groups:
                group["lr"] = args.lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps else args.lr
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        found = {"optimizer": args.optimizer, "model": args.model, "epoch": epoch + 1, "steps": step, "batch_size": args.batch_size,
                 "seconds": time.perf_counter() - start, "loss": loss.item(), "accuracy": accuracy(model, val_loader)}
        print(f"{args.optimizer} epoch {epoch + 1}: loss {found['loss']:.3f}, validation accuracy "
              f"{found['accuracy']:.1%}, {found['seconds']:.0f} s", flush=True)
        if args.log_file:
            with open(args.log_file, "a") as f:
                f.write(json.dumps(found) + "\n")


if __name__ == "__main__":
    main()
