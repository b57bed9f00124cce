"""Model parallelism in three small demonstrations, each checked against the unsplit computation.

    python demos/model_parallel.py --world-size 2 --demo all --micro-batches 4

Data parallelism copies the whole model to every process. When a model no longer fits on one
device, it is split instead:

- column split (tensor parallelism): a linear layer's weight is cut by output features. Each
  process computes its slice of the output from the whole input; an all-gather puts the slices
  side by side.
- row split (tensor parallelism): the weight is cut by input features. Each process multiplies
  its slice of the input by its slice of the weight, which gives a partial sum of the whole
  output; an all-reduce adds the partial sums.
- pipeline: the layers are cut into stages, one per process. The batch is cut into
  micro-batches; stage 0 sends each micro-batch's activations to stage 1 (send/recv), and in
  the backward pass stage 1 sends back the gradient of those activations. A stage waits while
  the pipeline fills and drains: that idle time is the "bubble".
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

TOLERANCE = 1e-5


def column_split(rank, world_size):
    """y = x W^T + b with W cut by rows (output features): each rank computes out/N outputs."""
    torch.manual_seed(0)  # every rank builds the same whole layer, then keeps its own slice
    whole = nn.Linear(16, 8 * world_size)
    x = torch.randn(4, 16)
    rows = whole.out_features // world_size
    mine = slice(rank * rows, (rank + 1) * rows)
    part = F.linear(x, whole.weight[mine], whole.bias[mine])  # this rank's columns of the output
    parts = [torch.empty_like(part) for _ in range(world_size)]
    dist.all_gather(parts, part)
    y = torch.cat(parts, dim=1)
    return (y - whole(x)).abs().max().item()


def row_split(rank, world_size):
    """y = x W^T + b with W cut by columns (input features): each rank holds in/N of them."""
    torch.manual_seed(0)
    whole = nn.Linear(8 * world_size, 16)
    x = torch.randn(4, whole.in_features)
    cols = whole.in_features // world_size
    mine = slice(rank * cols, (rank + 1) * cols)
    partial = x[:, mine] @ whole.weight[:, mine].T  # a partial sum of every output
    dist.all_reduce(partial)  # the sum over ranks is the whole product
    y = partial + whole.bias  # the bias once, after the sum
    return (y - whole(x)).abs().max().item()


def make_stages(width, layers_per_stage):
    torch.manual_seed(0)
    def stage():
        return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers_per_stage)])
    return stage(), stage()


def pipeline(rank, world_size, args):
    """GPipe on 2 stages: every micro-batch forward, then every micro-batch backward. Returns the
    largest gradient difference from the unsplit model, and this stage's (kind, micro-batch,
    start, end) times."""
    first, second = make_stages(args.width, args.layers)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch_size, args.width, generator=generator)
    target = torch.randn(args.batch_size, args.width, generator=generator)
    micro = args.batch_size // args.micro_batches
    stage = first if rank == 0 else second

    def one_step():
        stage.zero_grad(set_to_none=True)
        events, kept = [], []
        dist.barrier()  # both stages start the clock together
        t0 = time.perf_counter()
        for m in range(args.micro_batches):  # forward: the pipeline fills
            rows = slice(m * micro, (m + 1) * micro)
            if rank == 0:
                start = time.perf_counter() - t0
                out = stage(x[rows])
                events.append(("forward", m, start, time.perf_counter() - t0))
                dist.send(out.detach(), dst=1)
                kept.append(out)
            else:
                received = torch.empty(micro, args.width)
                dist.recv(received, src=0)
                received.requires_grad_()
                start = time.perf_counter() - t0
                # the mean over the whole batch, split among the micro-batches
                loss = F.mse_loss(stage(received), target[rows], reduction="sum") / target.numel()
                events.append(("forward", m, start, time.perf_counter() - t0))
                kept.append((received, loss))
        for m in range(args.micro_batches):  # backward: the pipeline drains
            if rank == 1:
                received, loss = kept[m]
                start = time.perf_counter() - t0
                loss.backward()
                events.append(("backward", m, start, time.perf_counter() - t0))
                dist.send(received.grad, dst=0)  # the gradient of stage 0's output
            else:
                grad = torch.empty(micro, args.width)
                dist.recv(grad, src=1)
                start = time.perf_counter() - t0
                kept[m].backward(grad)
                events.append(("backward", m, start, time.perf_counter() - t0))
        return events

    one_step()  # a first step warms up (autograd's threads, memory): only the second is timed
    events = one_step()

    # The unsplit model on the whole batch: the gradients the stages must have added up.
    whole_first, whole_second = make_stages(args.width, args.layers)
    F.mse_loss(whole_second(whole_first(x)), target, reduction="sum").div(target.numel()).backward()
    reference = whole_first if rank == 0 else whole_second
    difference = max((p.grad - q.grad).abs().max().item() for p, q in zip(stage.parameters(), reference.parameters()))
    return difference, events


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo on the CPU: these demonstrations are about what goes where, not about speed.
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    found = {}
    if args.demo in ("column", "all"):
        found["column"] = column_split(rank, args.world_size)
    if args.demo in ("row", "all"):
        found["row"] = row_split(rank, args.world_size)
    timeline = None
    if args.demo in ("pipeline", "all"):
        found["pipeline"], timeline = pipeline(rank, args.world_size, args)
    everything = [None] * args.world_size
    dist.all_gather_object(everything, {"rank": rank, "differences": found, "events": timeline})
    worst = {name: max(e["differences"][name] for e in everything) for name in found}
    if rank == 0:
        for name, difference in worst.items():
            print(f"{name:9} largest difference from the unsplit computation: {difference:.1e}", flush=True)
        if args.json_file:  # for notebook 22's pictures
            with open(args.json_file, "w") as f:
                json.dump({"micro_batches": args.micro_batches, "differences": worst,
                           "stages": {e["rank"]: e["events"] for e in everything}}, f)
    dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()
    if any(d > TOLERANCE for d in worst.values()):
        sys.exit(1)


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="Column split, row split and a 2-stage pipeline, against the unsplit model.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (the pipeline needs 2)")
    parser.add_argument("--demo", choices=["column", "row", "pipeline", "all"], default="all")
    parser.add_argument("--micro-batches", type=positive_int, default=4, help="the pipeline's micro-batches")
    parser.add_argument("--batch-size", type=positive_int, default=512)
    parser.add_argument("--width", type=positive_int, default=512, help="the pipeline's layer width")
    parser.add_argument("--layers", type=positive_int, default=4, help="layers per pipeline stage")
    parser.add_argument("--json-file", help="also write the differences and the pipeline's timeline here")
    args = parser.parse_args()
    if args.demo in ("pipeline", "all") and args.world_size != 2:
        parser.error("the pipeline has 2 stages: use --world-size 2 (or --demo column or row)")
    if args.batch_size % args.micro_batches:
        parser.error("--batch-size must divide by --micro-batches")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    try:
        mp.spawn(worker, args=(args,), nprocs=args.world_size)
    except mp.ProcessExitedException:
        sys.exit(f"model_parallel.py: a result differs from the unsplit computation by more than {TOLERANCE:g}")


if __name__ == "__main__":
    main()
