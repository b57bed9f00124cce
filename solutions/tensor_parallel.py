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

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x  # every rank already holds the same x

    @staticmethod
    def backward(ctx, grad):
        # each rank's gradient covers only what its shard computed from x: x's gradient is their sum
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: where the ranks' partial results leave the parallel region as one whole tensor."""

    @staticmethod
    def forward(ctx, x, group=None):
        x = x.clone()  # all_reduce works in place: leave the caller's tensor alone
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None  # the sum's gradient with respect to each term is the gradient itself


class ColumnParallelLinear(nn.Module):
    """This rank's share of `linear`'s output features: whole input in, this rank's slice of the output out."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, dim=0)[rank].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().chunk(size)[rank].clone())

    def forward(self, x):
        return F.linear(CopyToParallel.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's share of `linear`'s input features: this rank's slice of the input in, the whole output out."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, dim=1)[rank].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias  # once, after the sum


class ParallelMLP(nn.Module):
    """fc2(gelu(fc1(x))) with fc1 cut by columns and fc2 by rows: whole input in, whole output out."""

    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.fc1 = ColumnParallelLinear(fc1, group)
        self.fc2 = RowParallelLinear(fc2, group)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def make_groups(tensor_parallel):
    """(tensor-parallel group, data-parallel group) of this rank: the world cut into groups of
    `tensor_parallel` ranks that share a model's layers, and the groups of ranks that hold the same shards."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    mine = {}
    # every rank must call new_group for every group, in the same order, even those it is not in
    for start in range(0, world_size, tensor_parallel):
        ranks = list(range(start, start + tensor_parallel))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["tensor"] = group
    for offset in range(tensor_parallel):
        ranks = list(range(offset, world_size, tensor_parallel))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["data"] = group
    return mine["tensor"], mine["data"]


def average_gradients(model, group):
    """Every gradient of `model` becomes its average over the ranks of `group`."""
    size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= size


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
