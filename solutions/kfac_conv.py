"""K-FAC for convolutions: the Kronecker factors of a Conv2d, from the patches its kernel saw.

    python exercises/kfac_conv.py --optimizer sgd  --log-file runs/sgd.jsonl
    python exercises/kfac_conv.py --optimizer kfac --log-file runs/kfac.jsonl

Notebook 25 built K-FAC for nn.Linear: a layer's block of the Fisher matrix is approximated by A kron G,
A from the layer's inputs and G from the gradients of its outputs. A convolution is a linear layer too,
applied at every position of the image to the patch its kernel covers: the same weights, many times per
example. Its factors are therefore made of patches (one row per example and position) and of the output's
gradient at each position; notebook 38 says how the positions are weighed (Grosse and Martens, 2016).

You write two functions: kfac_factors() (one batch's A and G, for nn.Linear and nn.Conv2d) and
precondition() (a layer's gradient replaced by (A kron G + damping x I)^-1 applied to it). The rest, given,
trains a small residual network with SGD, or with SGD preconditioned by K-FAC, at one large batch.
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


def kfac_factors(layer, inputs, output_grad):
    """One batch's (A, G) for `layer`, an nn.Linear or an nn.Conv2d (groups=1, numeric padding).

    inputs: what the layer received in the forward pass; output_grad: the gradient of the batch's loss (a
    mean over the examples) with respect to the layer's output, the same shape as that output.
    """
    # TODO kfac_conv: return (A, G), square tensors whose Kronecker product approximates the layer's block of
    # the empirical Fisher matrix: for a weight gradient laid out as a matrix of (out_features or out_channels)
    # rows and one column per input the layer multiplies (its bias, if any, a last column on an input of 1),
    # A indexes those columns and G those rows. For nn.Linear they are notebook 25's; for nn.Conv2d, notebook 38
    # says what they are made of and how the output positions are weighed.
    batch = len(inputs)
    if isinstance(layer, nn.Conv2d):
        # every patch the kernel covered, as a row: one per example and output position
        a = F.unfold(inputs, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride)
        positions = a.shape[-1]
        a = a.transpose(1, 2).reshape(-1, a.shape[1])
        g = output_grad.flatten(2).transpose(1, 2).reshape(-1, output_grad.shape[1])
    else:
        positions = 1
        a, g = inputs.reshape(-1, inputs.shape[-1]), output_grad.reshape(-1, output_grad.shape[-1])
    if layer.bias is not None:  # the bias is a weight on an input that is always 1
        a = torch.cat([a, a.new_ones(len(a), 1)], dim=1)
    g = g * batch  # the loss is a mean: this is each example's own gradient
    # An example's weight gradient sums its positions' g a^T. Positions taken as independent and alike, the
    # Fisher block is then `positions` times (mean of a a^T) kron (mean of g g^T): the means over examples
    # and positions, the count on G.
    return a.t() @ a / len(a), g.t() @ g / len(g) * positions


def precondition(layer, A, G, damping):
    """Replaces layer.weight.grad (and layer.bias.grad) by its preconditioned gradient."""
    # TODO kfac_conv: on return, the layer's weight and bias gradients, taken as one matrix laid out as
    # kfac_factors() says, are (A kron G + damping x I)^-1 applied to that matrix, for nn.Linear and nn.Conv2d,
    # each gradient keeping its own shape.
    weight = layer.weight
    grad = weight.grad.reshape(len(weight), -1)  # a convolution's kernel as a matrix: one row per out channel
    if layer.bias is not None:
        grad = torch.cat([grad, layer.bias.grad[:, None]], dim=1)
    values_a, vectors_a = torch.linalg.eigh(A.double())
    values_g, vectors_g = torch.linalg.eigh(G.double())
    v = vectors_g.t() @ grad.double() @ vectors_a  # in the eigenbases, A kron G is diagonal
    v /= values_g.clamp(min=0)[:, None] * values_a.clamp(min=0)[None, :] + damping
    grad = (vectors_g @ v @ vectors_a.t()).to(weight.grad.dtype)
    columns = grad.shape[1] - (layer.bias is not None)
    weight.grad.copy_(grad[:, :columns].reshape(weight.shape))
    if layer.bias is not None:
        layer.bias.grad.copy_(grad[:, -1])


# The rest is given: a preconditioner that calls your two functions for every nn.Linear and nn.Conv2d of a
# model, and a residual network trained with SGD or K-FAC at one large batch, in one process (part 6
# distributed K-FAC; here the new piece is the convolution).

class KFAC:
    """Preconditions the gradients of every nn.Linear and nn.Conv2d of `model`; call step() after backward()."""

    def __init__(self, model, damping=0.003, factor_decay=0.95, update_freq=5):
        self.layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        self.damping, self.factor_decay, self.update_freq = damping, factor_decay, update_freq
        self.steps, self.seen, self.A, self.G = 0, {}, {}, {}
        for layer in self.layers:
            layer.register_forward_hook(self._seen)

    def _seen(self, layer, inputs, output):
        if torch.is_grad_enabled() and output.requires_grad:  # a training pass
            output.register_hook(lambda grad: self.seen.__setitem__(layer, (inputs[0].detach(), grad.detach())))

    @torch.no_grad()
    def step(self):
        if self.steps % self.update_freq == 0:
            for layer in self.layers:
                A, G = kfac_factors(layer, *self.seen[layer])
                if layer in self.A:  # running averages: a batch's factors are noisy
                    self.A[layer].lerp_(A, 1 - self.factor_decay)
                    self.G[layer].lerp_(G, 1 - self.factor_decay)
                else:
                    self.A[layer], self.G[layer] = A, G
        for layer in self.layers:
            precondition(layer, self.A[layer], self.G[layer], self.damping)
        self.seen = {}
        self.steps += 1


# A run of a few dozen steps at a large batch: batch norm's running statistics, used for validation, must
# follow the weights faster than its default (0.1) lets them.
BN_MOMENTUM = 0.5


class Block(nn.Module):
    """Two 3x3 convolutions and a shortcut around them (a 1x1 convolution where the shape changes)."""

    def __init__(self, channels_in, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels, momentum=BN_MOMENTUM)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels, momentum=BN_MOMENTUM)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels, momentum=BN_MOMENTUM))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def make_model(width=16):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width, momentum=BN_MOMENTUM),
                         nn.ReLU(),
                         Block(width, width, 1), Block(width, 2 * width, 2), Block(2 * width, 4 * width, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10))


@torch.no_grad()
def kl_clip(model, raw, lr, clip):
    """Scales the preconditioned step down when it would move the model's outputs too far (notebook 25)."""
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


def train(args):
    torch.set_num_threads(args.threads)
    train_set, val_set = load_datasets(args.data_dir, download=True)
    if args.train_images:
        train_set = Subset(train_set, range(min(args.train_images, len(train_set))))
    val_set = Subset(val_set, range(min(args.val_images, len(val_set))))
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    model = make_model(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    preconditioner = KFAC(model, args.damping, update_freq=args.update_freq) if args.optimizer == "kfac" else None
    start, steps = time.perf_counter(), 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            if preconditioner is not None:
                raw = [p.grad.clone() for p in model.parameters()]
                preconditioner.step()
                kl_clip(model, raw, args.lr, args.kl_clip)
            optimizer.step()
            steps += 1
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in DataLoader(val_set, batch_size=1000):
                correct += (model(images).argmax(1) == labels).sum().item()
                total += len(labels)
        seconds = time.perf_counter() - start
        found = {"optimizer": args.optimizer, "batch_size": args.batch_size, "epoch": epoch + 1, "steps": steps,
                 "seconds": seconds, "loss": loss.item(), "accuracy": correct / total}
        print(f"{args.optimizer} epoch {epoch + 1}: loss {found['loss']:.3f}, validation accuracy "
              f"{found['accuracy']:.1%}, {seconds / steps * 1000:.0f} ms a step", flush=True)
        if args.log_file:
            with open(args.log_file, "a") as f:
                f.write(json.dumps(found) + "\n")


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="A residual network trained with SGD, or SGD preconditioned by "
                                     "K-FAC on its convolutions and its linear layer.")
    parser.add_argument("--optimizer", choices=["sgd", "kfac"], default="kfac")
    parser.add_argument("--batch-size", type=positive_int, default=1024)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--update-freq", type=positive_int, default=5, help="K-FAC: new factors every k steps")
    parser.add_argument("--damping", type=float, default=0.003)
    parser.add_argument("--kl-clip", type=float, default=0.001, help="K-FAC: the largest step, see kl_clip()")
    parser.add_argument("--width", type=positive_int, default=16, help="the first block's channels")
    parser.add_argument("--train-images", type=int, default=0, help="train on the first N images only (0: all)")
    parser.add_argument("--val-images", type=positive_int, default=10000)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"))
    parser.add_argument("--log-file", help="append one JSON line per epoch to this file")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
