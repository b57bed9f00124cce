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
    """f: identity forward, sum of the ranks' gradients backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        total = grad_output.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)
        return total, None


class ReduceFromParallel(torch.autograd.Function):
    """g: sum of the ranks' partial results forward, identity backward."""

    @staticmethod
    def forward(ctx, partial, group=None):
        total = partial.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class ColumnParallelLinear(nn.Module):
    """Every N-th output feature, starting at this rank's: rows rank, rank + N, rank + 2N, ..."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        step, first = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight[first::step].clone())
            self.bias = nn.Parameter(linear.bias[first::step].clone()) if linear.bias is not None else None

    def forward(self, x):
        x = CopyToParallel.apply(x, self.group)
        out = x @ self.weight.t()
        if self.bias is not None:
            out = out + self.bias
        return out


class RowParallelLinear(nn.Module):
    """Every N-th input feature, starting at this rank's: the columns the column layer's outputs are."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        step, first = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight[:, first::step].clone())
            self.bias = nn.Parameter(linear.bias.clone()) if linear.bias is not None else None

    def forward(self, x):
        partial = x @ self.weight.t()
        out = ReduceFromParallel.apply(partial, self.group)
        if self.bias is not None:
            out = out + self.bias
        return out


class ParallelMLP(nn.Module):
    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.up = ColumnParallelLinear(fc1, group)
        self.down = RowParallelLinear(fc2, group)

    def forward(self, x):
        hidden = self.up(x)
        return self.down(F.gelu(hidden))


def make_groups(tensor_parallel):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    tensor_group = data_group = None
    for start in range(0, world_size, tensor_parallel):
        ranks = list(range(start, start + tensor_parallel))
        group = dist.new_group(ranks)
        if rank in ranks:
            tensor_group = group
    for offset in range(tensor_parallel):
        ranks = list(range(offset, world_size, tensor_parallel))
        group = dist.new_group(ranks)
        if rank in ranks:
            data_group = group
    return tensor_group, data_group


def average_gradients(model, group):
    replicas = dist.get_world_size(group)
    for parameter in model.parameters():
        if parameter.grad is None:
            continue
        parameter.grad.div_(replicas)  # dividing first gives the same average
        dist.all_reduce(parameter.grad, group=group)


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
