"""ZeRO stage 2 by hand: each process keeps only its own shard of the gradients, reduced during backward.

    python exercises/zero2.py --world-size 2     # against DDP with AdamW: the weights, and the gradients held

Under DDP every process ends backward() holding every gradient, averaged over all processes. ZeRO-1
(notebook 21) kept each process's optimizer state to its own shard, yet every process still received
and held every averaged gradient, though its optimizer steps only its own shard. ZeRO-2 goes one
further: while backward() runs, each bucket of gradients is sent as soon as it is complete, and each
process receives the sum of its own shard of that bucket only; the full gradients are then freed.
After the step, the processes gather the updated shards so that each holds the whole model again.
Notebook 30 has hints you open when you want them.
"""
import argparse
import datetime
import gc
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook


class Zero2:
    """Wraps `model` (with no DDP around it): call loss.backward(), then step()."""

    def __init__(self, model, optimizer_cls, bucket_size_mb=1.0, **kwargs):
        self.model = model
        # TODO zero2: every rank starts from rank 0's parameters. The trainable parameters' gradients go
        # into buckets of about bucket_size_mb, each cut into one shard per rank, cut the same way on every
        # rank. While backward() runs, each bucket leaves as soon as all of its gradients are ready, and
        # this rank receives the sum over the ranks of its own shard alone: no rank receives a whole
        # gradient, and no full gradient stays behind once its bucket has left. This rank keeps an
        # optimizer_cls(..., **kwargs) over its own shards only; the gradients it keeps are the .grad of
        # the tensors that optimizer steps.
        pass  # your code

    def step(self):
        # TODO zero2: once every bucket has arrived, this rank's shards take one step of its optimizer
        # with the average over the ranks of their gradients; when step() returns, every rank holds the
        # whole updated model, and no gradient is left for the next backward().
        pass  # your code


# The rest trains a model with Zero2 and with DDP, both with AdamW, compares the weights, and weighs
# the gradients each process holds when its optimizer steps.

def make_model():
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def gradient_bytes(model, optimizer):
    """The bytes of the gradients this rank holds: the model's .grad and those of the tensors the optimizer
    steps (a gradient that is a view of a larger buffer counts the whole buffer)."""
    grads = [p.grad for p in model.parameters()]
    grads += [p.grad for group in optimizer.param_groups for p in group["params"]]
    buffers = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads if g is not None}
    return sum(buffers.values())


def train(model, step, batches, rank, world_size):
    for images, labels in batches:
        share = len(labels) // world_size
        mine = slice(rank * share, (rank + 1) * share)
        F.cross_entropy(model(images[mine]), labels[mine]).backward()
        step()


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo: this comparison is about arithmetic and memory, and runs on the CPU, GPUs or not.
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch_size, 64, generator=generator),
                torch.randint(0, 10, (args.batch_size,), generator=generator)) for _ in range(args.steps)]
    options = {"lr": 1e-3, "weight_decay": 0.1}
    held = {"ddp": 0, "zero2": 0}  # the most gradient bytes each held when its optimizer stepped
    now = {}  # what is training: its name and its model

    def weigh(optimizer, args, kwargs):
        held[now["name"]] = max(held[now["name"]], gradient_bytes(now["model"], optimizer))

    hook = register_optimizer_step_pre_hook(weigh)
    ddp = nn.parallel.DistributedDataParallel(make_model())
    plain = torch.optim.AdamW(ddp.parameters(), **options)

    def ddp_step():
        plain.step()
        plain.zero_grad(set_to_none=True)

    now.update(name="ddp", model=ddp.module)
    train(ddp, ddp_step, batches, rank, args.world_size)

    model = make_model()
    sharded = Zero2(model, torch.optim.AdamW, bucket_size_mb=args.bucket_size_mb, **options)
    now.update(name="zero2", model=model)
    train(model, sharded.step, batches, rank, args.world_size)
    hook.remove()

    difference = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ddp.module.parameters()))
    found = [None] * args.world_size
    dist.all_gather_object(found, {"rank": rank, "held": held, "difference": difference})
    if rank == 0:
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"model: {params / 1024:.0f} KB of parameters; buckets of {args.bucket_size_mb} MB")
        for f in found:
            print(f"rank {f['rank']}: gradients held at the step: DDP {f['held']['ddp'] / 1024:.0f} KB, "
                  f"Zero2 {f['held']['zero2'] / 1024:.0f} KB; largest difference from DDP's weights "
                  f"{f['difference']:.1e}", flush=True)
        if args.json_file:  # for notebook 30's picture
            with open(args.json_file, "w") as f:
                json.dump({"world_size": args.world_size, "param_bytes": params, "ranks": found}, f)
    # Free the models (DDP's hooks can make reference cycles, hence gc) before the process group:
    # one that outlives the group can abort the process at exit.
    del ddp, model, sharded, now
    gc.collect()
    dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return value


def main():
    parser = argparse.ArgumentParser(description="ZeRO stage 2 by hand, against DDP with AdamW.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=48, help="the global batch")
    parser.add_argument("--bucket-size-mb", type=positive_float, default=0.25, help="Zero2's buckets")
    parser.add_argument("--json-file", help="also write each rank's gradients held and difference here")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error("--batch-size must divide by --world-size")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
