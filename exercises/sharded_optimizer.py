"""ZeRO stage 1 by hand: each process keeps the optimizer state of its own shard of the parameters.

    python exercises/sharded_optimizer.py --world-size 2     # against plain AdamW: weights and memory

Data parallelism keeps a whole copy of everything on every process: the parameters, their
gradients and the optimizer's state. Adam keeps two numbers per parameter (its moving averages),
so its state is twice the size of the model, and every process holds the same copy of it.
ZeRO stage 1 cuts that state into shards, one per process: each process keeps the optimizer
state of its own share of the parameters only, about 1/N of them counted in numbers (elements),
and after every step all processes again hold the whole, up-to-date model. DDP has already
averaged every gradient before step() is called. Notebook 21 has hints you open when you want them.
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


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)  # a generator (model.parameters()) can be read only once
        world_size, rank = dist.get_world_size(), dist.get_rank()
        # TODO zero: every parameter belongs to exactly one rank, every rank agrees on who owns what,
        # and each rank's share is about 1/N of the elements. This rank keeps optimizer state (an
        # optimizer_cls made with **kwargs) for its own share only.
        pass  # your code

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self):
        # TODO zero: on return, every parameter on every rank holds the value that optimizer_cls would
        # have given it unsharded, with the gradients DDP averaged.
        pass  # your code


def zero1_bytes(numels, world_size):
    """Predict what each rank holds once your ShardedOptimizer, made with torch.optim.AdamW over fp32
    parameters of these sizes (numels: each parameter's number of elements, in the order of
    model.parameters()), has stepped under DDP on world_size processes.

    Returns one dict per rank, rank 0 first: {"parameters": bytes, "gradients": bytes,
    "optimizer_state": bytes}, the bytes of the tensors of each kind that rank keeps (for the
    optimizer state: every tensor in its optimizer's state). The shards are yours, cut as your
    ShardedOptimizer cuts them: notebook 21's check weighs them in your ranks' processes.
    """
    # TODO zero_memory: your prediction, for any sizes and any world size.
    return None  # your code


# The rest trains a model with ShardedOptimizer and with plain AdamW, and compares the weights and
# the optimizer state each process holds.

def make_model():
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def state_bytes(optimizer):
    """The bytes of the tensors in an optimizer's state (Adam: two per parameter, and a step count)."""
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))


def train(model, optimizer, batches, rank, world_size):
    for images, labels in batches:
        share = len(labels) // world_size
        mine = slice(rank * share, (rank + 1) * share)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[mine]), labels[mine]).backward()
        optimizer.step()


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo: this comparison is about arithmetic and memory, and runs on the CPU, GPUs or not.
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch_size, 64, generator=generator),
                torch.randint(0, 10, (args.batch_size,), generator=generator)) for _ in range(args.steps)]
    options = {"lr": 1e-3, "weight_decay": 0.1}

    plain_model = nn.parallel.DistributedDataParallel(make_model())
    plain = torch.optim.AdamW(plain_model.parameters(), **options)
    train(plain_model, plain, batches, rank, args.world_size)

    model = nn.parallel.DistributedDataParallel(make_model())
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, **options)
    train(model, sharded, batches, rank, args.world_size)

    difference = max((a - b).abs().max().item() for a, b in zip(model.parameters(), plain_model.parameters()))
    # The state of the optimizers ShardedOptimizer keeps (or is): this rank's share.
    mine = sum(state_bytes(o) for o in [sharded, *vars(sharded).values()] if isinstance(o, torch.optim.Optimizer))
    found = [None] * args.world_size
    dist.all_gather_object(found, {"rank": rank, "state_bytes": mine, "difference": difference})
    if rank == 0:
        whole = state_bytes(plain)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"model: {params / 1024:.0f} KB of parameters; plain AdamW's state: {whole / 1024:.0f} KB on every rank")
        for f in found:
            print(f"rank {f['rank']}: optimizer state {f['state_bytes'] / 1024:6.0f} KB "
                  f"({f['state_bytes'] / whole:.0%} of plain AdamW's), largest difference from its weights "
                  f"{f['difference']:.1e}", flush=True)
        if args.json_file:  # for notebook 21's picture
            with open(args.json_file, "w") as f:
                json.dump({"world_size": args.world_size, "plain_state_bytes": whole, "param_bytes": params,
                           "ranks": found}, f)
    # Free the models (DDP's hooks can make reference cycles, hence gc) before the process group:
    # one that outlives the group can abort the process at exit.
    del plain_model, model
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


def main():
    parser = argparse.ArgumentParser(description="ZeRO stage 1 by hand, against plain AdamW.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=48, help="the global batch")
    parser.add_argument("--json-file", help="also write each rank's optimizer state and difference here")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error("--batch-size must divide by --world-size")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
