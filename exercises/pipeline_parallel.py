"""Pipeline parallelism by hand: a model cut into stages, one per process, with GPipe's and 1F1B's schedules.

    python exercises/pipeline_parallel.py --stages 2 --micro-batches 4 --schedule gpipe
    python exercises/pipeline_parallel.py --stages 3 --micro-batches 6 --schedule 1f1b
    python exercises/pipeline_parallel.py --stages 2 --micro-batches 4 --schedule interleaved

Stage r (process r of S) holds a run of consecutive layers. The batch is cut into M
micro-batches. In the forward pass, stage r receives a micro-batch's activations from stage r-1,
runs its layers and sends the result to stage r+1; the last stage computes the loss. In the
backward pass the gradients travel the other way: stage r receives the gradient of its output
from stage r+1, runs backward through its layers and sends the gradient of its input to stage
r-1. The gradients of all M micro-batches add up in each stage's parameters, as one pass over the
whole batch would give them.

GPipe runs every micro-batch's forward pass, then every backward pass. 1F1B (one forward, one
backward) starts backward passes as soon as it can, so that a stage holds fewer micro-batches'
activations at once. Interleaved 1F1B cuts the model into more stages than processes: each process
holds several chunks of layers, not next to each other, so that a micro-batch passes through every
process more than once, and the pipeline fills and drains in shorter steps. Notebook 22 draws them,
and has hints you open when you want them.
"""
import argparse
import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def gpipe(stage, micro_batches, targets, loss_fn):
    # TODO gpipe: one training step's forward and backward passes on this process's stage (rank r of S
    # holds stage r), GPipe's schedule: every micro-batch's forward pass, then every backward pass.
    # micro_batches, targets: the M inputs and targets, on every rank (the first stage uses the
    # inputs' values, the last stage the targets'); every stage's input and output has a micro-batch's
    # shape. loss_fn(output, target): one micro-batch's mean loss. Call stage(x) once per micro-batch.
    # On return, every parameter of `stage` holds in .grad its gradient of the whole batch's mean loss,
    # as the unsplit model gives it, and everything this rank sent has been received.
    pass  # your code


def one_f_one_b(stage, micro_batches, targets, loss_fn):
    # TODO 1f1b: the same step and the same gradients as gpipe, in 1F1B's schedule: the one order of this
    # stage's passes for which all of these hold (the check reads the order from a trace):
    # - every micro-batch's forward pass and its backward pass run once each, the forward passes taking
    #   the micro-batches in order, and the backward passes too;
    # - stage r of S never holds more than S - r micro-batches' activations at once (a micro-batch's
    #   activations are held from its forward pass until its backward pass);
    # - no stage is idle in the steady state: it never starts a backward pass, whose gradient has to come
    #   back from the later stages, while it could still run a forward pass within that bound.
    # Work out from these what the stage runs first, what it runs in the middle and what last; a gloo
    # dist.send waits for the other side's recv (notebook 22 shows where that deadlocks).
    pass  # your code


def interleaved_1f1b(chunks, micro_batches, targets, loss_fn):
    # TODO interleaved: the same step on a model cut into v * S chunks of layers (virtual stages), v per
    # rank: chunks[j] of rank r is virtual stage j * S + r, so a micro-batch's forward pass goes through
    # ranks 0, 1, ..., S - 1, then 0, 1, ... again, v times, and its backward pass comes back the same way.
    # M divides by S. On return, every chunk's parameters hold their gradient of the whole batch's mean
    # loss, and everything this rank sent has been received. What must hold:
    # - each chunk's forward passes take the micro-batches in order, and so do its backward passes;
    # - a rank never holds every micro-batch's activations through all its chunks at once (GPipe's memory);
    # - the step's bubble is smaller than one_f_one_b's for the same S and M (the check counts it from
    #   the order of your passes, every pass of a chunk taking 1/v of a stage's time, messages free).
    # Two ranks now exchange the messages of several chunks, in both directions: each recv must get the
    # message it expects (a tag, an argument of dist.isend and dist.recv, can tell them apart).
    pass  # your code


def bubble_fraction(stages, micro_batches, chunks=1):
    # TODO bubble: predict a stage's idle share of one step (idle time / the step's length, the step from
    # the first pass's start on any stage to the last pass's end on any stage) under 1F1B with S stages
    # and M micro-batches, or interleaved 1F1B with `chunks` chunks per rank, every pass of a chunk taking
    # as long as every other of its kind and messages taking no time. A number between 0 and 1.
    # Notebook 22 compares it with the bubble it measures.
    pass  # your code


# The rest cuts a model into stages and compares each stage's gradients with the unsplit model's.

SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b}
CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved": 2}  # chunks of layers per process


def make_model(stages, layers_per_stage, width):
    torch.manual_seed(0)  # every process builds the same whole model, then keeps its own stage
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(stages * layers_per_stage)])


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo: send and recv of CPU tensors; the schedules are the lesson, GPUs or not
    dist.init_process_group("gloo", rank=rank, world_size=args.stages, timeout=datetime.timedelta(seconds=60))
    chunks = CHUNKS[args.schedule]
    whole = make_model(args.stages * chunks, args.layers, args.width)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch_size, args.width, generator=generator)
    target = torch.randn(args.batch_size, args.width, generator=generator)
    F.mse_loss(whole(x), target).backward()  # the unsplit model on the whole batch: what the stages must match
    # this rank's stages: r, then r + S, ... (one with gpipe and 1f1b), each a run of consecutive layers
    mine = [slice((c * args.stages + rank) * args.layers, (c * args.stages + rank + 1) * args.layers)
            for c in range(chunks)]
    model = make_model(args.stages * chunks, args.layers, args.width)
    stage = [model[s] for s in mine] if chunks > 1 else model[mine[0]]
    start = time.perf_counter()
    SCHEDULES[args.schedule](stage, list(x.chunk(args.micro_batches)), list(target.chunk(args.micro_batches)),
                             F.mse_loss)
    seconds = time.perf_counter() - start
    wanted = [p.grad for s in mine for p in whole[s].parameters()]
    worst = max((p.grad - w).abs().max().item() for p, w in zip([p for s in mine for p in model[s].parameters()],
                                                                 wanted))
    found = [None] * args.stages
    dist.all_gather_object(found, (worst, seconds))
    if rank == 0:
        for r, (d, s) in enumerate(found):
            print(f"stage {r}: largest gradient difference from the unsplit model {d:.1e}, step {s * 1000:.0f} ms",
                  flush=True)
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
    parser = argparse.ArgumentParser(description="A pipeline of stages against the unsplit model.")
    parser.add_argument("--stages", type=positive_int, default=2, help="processes to start, one stage each")
    parser.add_argument("--micro-batches", type=positive_int, default=4)
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    parser.add_argument("--batch-size", type=positive_int, default=48)
    parser.add_argument("--layers", type=positive_int, default=2, help="layers per stage")
    parser.add_argument("--width", type=positive_int, default=64)
    args = parser.parse_args()
    if args.batch_size % args.micro_batches:
        parser.error("--batch-size must divide by --micro-batches")
    if args.schedule == "interleaved" and args.micro_batches % args.stages:
        parser.error("interleaved: --micro-batches must divide by --stages")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.stages)


if __name__ == "__main__":
    main()
