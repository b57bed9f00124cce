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


def _gather_sum(t, group):
    """The sum of `t` over the ranks of `group`, through all_gather."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts).sum(dim=0)


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _gather_sum(grad, ctx.group), None


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        return _gather_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """An nn.Linear of its own, out_features/N wide, copied from rows [start, stop) of the whole one."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        per_rank = linear.out_features // dist.get_world_size(group)
        start = dist.get_rank(group) * per_rank
        stop = start + per_rank
        self.linear = nn.Linear(linear.in_features, per_rank, bias=linear.bias is not None)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight[start:stop])
            if linear.bias is not None:
                self.linear.bias.copy_(linear.bias[start:stop])

    def forward(self, x):
        return self.linear(CopyToParallel.apply(x, self.group))


class RowParallelLinear(nn.Module):
    """An nn.Linear of its own without bias, in_features/N wide; the bias added once, after the sum."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        per_rank = linear.in_features // dist.get_world_size(group)
        start = dist.get_rank(group) * per_rank
        self.linear = nn.Linear(per_rank, linear.out_features, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight[:, start:start + per_rank])
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x):
        y = ReduceFromParallel.apply(self.linear(x), self.group)
        if self.bias is not None:
            y = y + self.bias
        return y


class ParallelMLP(nn.Module):
    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.net = nn.Sequential(ColumnParallelLinear(fc1, group), nn.GELU(), RowParallelLinear(fc2, group))

    def forward(self, x):
        return self.net(x)


def make_groups(tensor_parallel):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    found = {}
    for start in range(0, world_size, tensor_parallel):
        ranks = list(range(start, start + tensor_parallel))
        found[tuple(ranks)] = dist.new_group(ranks)
    for offset in range(tensor_parallel):
        ranks = list(range(offset, world_size, tensor_parallel))
        found[tuple(ranks)] = dist.new_group(ranks)
    start = rank - rank % tensor_parallel
    tensor_ranks = tuple(range(start, start + tensor_parallel))
    data_ranks = tuple(range(rank % tensor_parallel, world_size, tensor_parallel))
    return found[tensor_ranks], found[data_ranks]


def average_gradients(model, group):
    for p in model.parameters():
        if p.grad is not None:
            p.grad = _gather_sum(p.grad, group) / dist.get_world_size(group)


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
