"""Tensor parallelism by hand: Megatron-LM's column- and row-parallel linear layers, and 2-D parallelism.

    python exercises/tensor_parallel.py --world-size 2                        # each layer against the unsplit one
    python exercises/tensor_parallel.py --world-size 4 --tensor-parallel 2    # and 2-D: pairs x data parallel

A layer too big for one process is cut among N processes. A linear layer y = x W^T + b can be
cut two ways. Column-parallel: each rank keeps some of the output features (rows of W, and their
bias); from the whole input it computes its slice of the output. Row-parallel: each rank keeps
some of the input features (columns of W); from its slice of the input it computes a partial sum
of the whole output, and the ranks add their partial sums up. A column layer followed by a row
layer (an MLP block) needs no communication in between: the column layer's output slice is
exactly the input slice the row layer needs.

The communication lives in two autograd functions, which Megatron calls f and g: each is a
no-op one way and an all-reduce the other way. Notebook 22 explains why, and has hints you open
when you want them.
"""
import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class CopyToParallel(torch.autograd.Function):
    """Megatron's f: where a whole tensor enters the parallel region (every rank uses all of it)."""

    # TODO tensor_parallel: forward gets x, the same whole tensor on every rank of `group` (None: all
    # ranks), and returns what each rank's shard computes from. backward gets this rank's gradient
    # with respect to that output and returns x's gradient (and None for `group`), which must be the
    # same on every rank: x's gradient in the unsplit model.
    @staticmethod
    def forward(ctx, x, group=None):
        pass  # your code

    @staticmethod
    def backward(ctx, grad):
        pass  # your code


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: where the ranks' partial results leave the parallel region as one whole tensor."""

    # TODO tensor_parallel: forward gets this rank's partial result x (a tensor of the whole
    # output's shape) and returns the whole result, the same on every rank of `group`. backward gets
    # the gradient with respect to that whole result (the same on every rank) and returns x's
    # gradient (and None for `group`).
    @staticmethod
    def forward(ctx, x, group=None):
        pass  # your code

    @staticmethod
    def backward(ctx, grad):
        pass  # your code


class ColumnParallelLinear(nn.Module):
    """This rank's share of `linear`'s output features: whole input in, this rank's slice of the output out."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        # TODO tensor_parallel: `linear` is the whole nn.Linear, the same on every rank of `group`
        # (None: all ranks). Keep, as parameters copied from it, this rank's share of its output
        # features: a 1/N share, every output feature held by exactly one rank of the group.
        pass  # your code

    def forward(self, x):
        # TODO tensor_parallel: x is the whole input, the same on every rank; return this rank's output
        # features (in the order its parameters hold them), with gradients that reach x through
        # CopyToParallel, so that x's gradient is the unsplit layer's on every rank.
        pass  # your code


class RowParallelLinear(nn.Module):
    """This rank's share of `linear`'s input features: this rank's slice of the input in, the whole output out."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        # TODO tensor_parallel: keep, as parameters copied from `linear`, this rank's 1/N share of its
        # input features (every input feature held by exactly one rank of the group), and its bias.
        pass  # your code

    def forward(self, x):
        # TODO tensor_parallel: x holds this rank's input features only (in the order its parameters
        # hold them); return the unsplit layer's whole output, the same on every rank, through
        # ReduceFromParallel.
        pass  # your code


class ParallelMLP(nn.Module):
    """fc2(gelu(fc1(x))) with fc1 cut by columns and fc2 by rows: whole input in, whole output out."""

    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        # TODO tensor_parallel: the block with fc1 and fc2 shared among the ranks of `group`, one
        # all-reduce in the forward pass and one in the backward pass, none in between.
        pass  # your code

    def forward(self, x):
        pass  # your code: the whole input in, the unsplit block's whole output out


def make_groups(tensor_parallel):
    """(tensor-parallel group, data-parallel group) of this rank: the world cut into groups of
    `tensor_parallel` ranks that share a model's layers, and the groups of ranks that hold the same shards."""
    # TODO two_d: return (tensor_group, data_group), this rank's two groups. The world is cut into
    # tensor groups of `tensor_parallel` ranks each; the ranks of a data group hold the same shards
    # (one rank from each tensor group, the same position in each). Every rank is in exactly one
    # group of each kind.
    pass  # your code


def average_gradients(model, group):
    """Every gradient of `model` becomes its average over the ranks of `group`."""
    # TODO two_d: on return, every gradient of `model` on this rank is the average of that gradient
    # over the ranks of `group`, and only those.
    pass  # your code


# The rest compares the layers with the unsplit ones, and trains the 2-D arrangement against one process.

def difference(a, b):
    return (a - b).abs().max().item()


def compare_layers(rank, width):
    """Each parallel layer against the unsplit one: outputs and input gradients."""
    torch.manual_seed(0)  # every rank builds the same whole layers
    fc1, fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
    x = torch.randn(8, width, requires_grad=True)
    whole_y = fc2(F.gelu(fc1(x)))
    whole_y.sum().backward()
    whole_grad, x.grad = x.grad, None
    y = ParallelMLP(fc1, fc2)(x)
    y.sum().backward()
    return {"output": difference(y, whole_y), "input gradient": difference(x.grad, whole_grad)}


def train_2d(rank, args):
    """The MLP on a (data parallel) x (tensor parallel) grid, against one process on the whole batch."""
    tensor_group, data_group = make_groups(args.tensor_parallel)
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(args.width, 4 * args.width), nn.Linear(4 * args.width, args.width)
    single = nn.Sequential(fc1, nn.GELU(), fc2)
    model = ParallelMLP(fc1, fc2, tensor_group)  # copies its shards: `single` trains on alone
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, args.width, generator=generator), torch.randn(16, args.width, generator=generator))
               for _ in range(3)]
    replicas, replica = dist.get_world_size(data_group), dist.get_rank(data_group)
    for x, target in batches:
        for m, inputs, targets in ((single, x, target), (model, x.chunk(replicas)[replica], target.chunk(replicas)[replica])):
            m.zero_grad()
            F.mse_loss(m(inputs), targets).backward()
            if m is model:
                average_gradients(model, data_group)
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.1 * p.grad
    x = batches[0][0]
    return difference(model(x), single(x))


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo: the arithmetic is the lesson here, and runs on the CPU, GPUs or not
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size, timeout=datetime.timedelta(seconds=60))
    found = compare_layers(rank, args.width)
    if args.tensor_parallel:
        found["2-D training, output after 3 steps"] = train_2d(rank, args)
    if rank == 0:
        for what, d in found.items():
            print(f"{what}: largest difference from the unsplit model {d:.1e}", flush=True)
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
    parser = argparse.ArgumentParser(description="Tensor-parallel layers against the unsplit ones.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--width", type=positive_int, default=16, help="the MLP's input width (its hidden: 4x)")
    parser.add_argument("--tensor-parallel", type=positive_int, default=0,
                        help="also train 2-D: groups of this many ranks share each layer")
    args = parser.parse_args()
    if (4 * args.width) % args.world_size:
        parser.error("4 x --width must divide by --world-size")
    if args.tensor_parallel and args.world_size % args.tensor_parallel:
        parser.error("--world-size must divide by --tensor-parallel")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
