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


def forward_step(stage, i, micro_batches, targets, loss_fn, held, sends):
    """Micro-batch i through this stage: in from the stage before (or the data), out to the next (or the loss)."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    if rank == 0:
        x = micro_batches[i]
    else:
        x = torch.empty_like(micro_batches[i])  # every stage's activations have a micro-batch's shape
        dist.recv(x, src=rank - 1)
        x.requires_grad_()  # its gradient is what this stage sends back
    y = stage(x)
    if rank == last:
        y = loss_fn(y, targets[i]) / len(micro_batches)  # the whole batch's loss is the mean over micro-batches
    else:
        out = y.detach()
        # isend: a blocking send waits until the next stage receives, which may be busy sending to us
        sends.append((dist.isend(out, dst=rank + 1), out))
    held[i] = (x, y)  # kept until micro-batch i's backward pass: these are the activations a stage holds


def backward_step(i, held, sends):
    """Micro-batch i's backward pass through this stage: the output's gradient in, the input's out."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    x, y = held.pop(i)
    if rank == last:
        y.backward()
    else:
        grad = torch.empty_like(y)
        dist.recv(grad, src=rank + 1)
        y.backward(grad)
    if rank > 0:
        sends.append((dist.isend(x.grad, dst=rank - 1), x.grad))


def gpipe(stage, micro_batches, targets, loss_fn):
    """One training step's forward and backward passes on this process's stage, GPipe's schedule:
    every micro-batch forward, then every micro-batch backward."""
    held, sends = {}, []
    for i in range(len(micro_batches)):
        forward_step(stage, i, micro_batches, targets, loss_fn, held, sends)
    for i in range(len(micro_batches)):
        backward_step(i, held, sends)
    for request, _ in sends:
        request.wait()


def one_f_one_b(stage, micro_batches, targets, loss_fn):
    """The same step, 1F1B's schedule: fill the pipeline, then one forward and one backward in turn, then drain."""
    held, sends = {}, []
    m = len(micro_batches)
    warmup = min(dist.get_world_size() - dist.get_rank() - 1, m)  # the stages after this one
    for i in range(warmup):
        forward_step(stage, i, micro_batches, targets, loss_fn, held, sends)
    for i in range(m - warmup):
        forward_step(stage, warmup + i, micro_batches, targets, loss_fn, held, sends)
        backward_step(i, held, sends)
    for i in range(m - warmup, m):
        backward_step(i, held, sends)
    for request, _ in sends:
        request.wait()


def interleaved_1f1b(chunks, micro_batches, targets, loss_fn):
    """1F1B over virtual stages: rank r of S holds chunks r, r + S, ...; the passes go through the
    chunks in groups of S micro-batches (Megatron-LM's order)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    v, m = len(chunks), len(micro_batches)
    last = v * world - 1  # the last virtual stage computes the loss

    def which(k, backward):
        """This rank's k-th chunk pass: (chunk, micro-batch). S micro-batches through one chunk, then the next."""
        group, j = divmod(k, world * v)
        chunk = j // world
        return (v - 1 - chunk if backward else chunk), group * world + j % world

    def tag(stage, i, backward):  # messages between two ranks carry several chunks' passes: the tag tells them apart
        return (stage * m + i) * 2 + backward

    held, sends = {}, []

    def forward(k):
        c, i = which(k, False)
        stage = c * world + rank
        if stage == 0:
            x = micro_batches[i]
        else:
            x = torch.empty_like(micro_batches[i])
            dist.recv(x, src=(rank - 1) % world, tag=tag(stage, i, 0))
            x.requires_grad_()
        y = chunks[c](x)
        if stage == last:
            y = loss_fn(y, targets[i]) / m
        else:
            out = y.detach()
            sends.append((dist.isend(out, dst=(rank + 1) % world, tag=tag(stage + 1, i, 0)), out))
        held[c, i] = (x, y)

    def backward(k):
        c, i = which(k, True)
        stage = c * world + rank
        x, y = held.pop((c, i))
        if stage == last:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=(rank + 1) % world, tag=tag(stage, i, 1))
            y.backward(grad)
        if stage > 0:
            sends.append((dist.isend(x.grad, dst=(rank - 1) % world, tag=tag(stage - 1, i, 1)), x.grad))

    total = v * m
    # the later ranks' first chunk passes, twice (there and back), and one more round of S for each further chunk
    warmup = min((world - rank - 1) * 2 + (v - 1) * world, total)
    for k in range(warmup):
        forward(k)
    for k in range(total - warmup):
        forward(warmup + k)
        backward(k)
    for k in range(total - warmup, total):
        backward(k)
    for request, _ in sends:
        request.wait()


def bubble_fraction(stages, micro_batches, chunks=1):
    """A stage's idle share of the step, with every pass of a chunk taking as long and messages free."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


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
