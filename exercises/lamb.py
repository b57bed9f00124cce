"""LAMB: Adam's update, scaled for every layer by how large its weights are against that update.

    python exercises/lamb.py --optimizer adamw --batch-size 2048 --lr 0.004 --warmup-epochs 2 --log-file runs/adamw.jsonl
    python exercises/lamb.py --optimizer lamb  --batch-size 2048 --lr 0.02 --warmup-epochs 2 --log-file runs/lamb.jsonl

LARS (notebook 24) gives every layer a trust ratio on SGD's update. LAMB (You et al., 2019, "Large Batch
Optimization for Deep Learning: Training BERT in 76 minutes") does the same on Adam's: each layer's
step is Adam's update with weight decay added, scaled so that its size is the global rate times the
size of the layer's weights. Adam adapts every coordinate; the ratio then keeps each layer's step in
proportion to the layer, whatever the global rate. Parameters with one dimension (biases, the scales and
shifts of normalisation layers) keep Adam's update as it is, without weight decay or ratio, as this
course does for LARS. Notebook 31 has hints you open when you want them.

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


class LAMB(torch.optim.Optimizer):
    """Adam with decoupled weight decay, each weight's step scaled by its layer's trust ratio."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        # TODO lamb: move every parameter that has a gradient, in every param group (with that group's lr,
        # betas, eps and weight_decay), as notebook 31's LAMB update says: Adam's bias-corrected update; for
        # parameters with more than one dimension, weight decay added to it and the layer's trust ratio on
        # the sum (1 when the weight's or the sum's norm is 0); for those with one dimension, Adam's update
        # alone. Each parameter's running averages and step count kept in self.state[p].
        pass  # your code


# The rest trains a small WideResNet (or a small network) at a large batch with AdamW or LAMB, with a warm-up.

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
    parser = argparse.ArgumentParser(description="Train at a large batch with AdamW or LAMB.")
    parser.add_argument("--optimizer", choices=["adamw", "lamb"], default="lamb")
    parser.add_argument("--batch-size", type=positive_int, default=2048)
    parser.add_argument("--lr", type=float, default=0.01, help="the global rate, reached after the warm-up")
    parser.add_argument("--warmup-epochs", type=float, default=2, help="the rate rises linearly from 0 over these")
    parser.add_argument("--epochs", type=positive_int, default=6)
    parser.add_argument("--weight-decay", type=float, default=0.01)
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
    if args.optimizer == "lamb":
        optimizer = LAMB(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
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
