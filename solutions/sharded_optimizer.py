"""ZeRO stage 1 by hand: each process keeps the optimizer state of its own shard of the parameters.

    python exercises/sharded_optimizer.py --world-size 2     # against plain AdamW: weights and memory

Data parallelism keeps a whole copy of everything on every process: the parameters, their
gradients and the optimizer's state. Adam keeps two numbers per parameter (its moving averages),
so its state is twice the size of the model, and every process holds the same copy of it.
ZeRO stage 1 cuts that state into shards, one per process:

- the parameters are split into N shards of about the same number of elements;
- each process makes the real optimizer (optimizer_cls) over its own shard only, so it holds
  the state of about 1/N of the parameters;
- step(): each process updates the parameters of its shard (DDP has already averaged every
  gradient), then sends their new values to the others with dist.broadcast from their owner, so
  that every process holds the whole, up-to-date model again.
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
        # TODO zero: give every parameter an owner, so that each rank owns about 1/N of the elements
        # (the same owners on every rank), and make optimizer_cls(its parameters, **kwargs) over
        # this rank's own parameters only.
        # Largest first, each to the rank that owns the fewest elements so far: balanced shards.
        self.owner = {}
        owned = [0] * world_size
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            least = owned.index(min(owned))
            self.owner[i] = least
            owned[least] += self.params[i].numel()
        mine = [p for i, p in enumerate(self.params) if self.owner[i] == rank]
        # A rank can own nothing (more ranks than parameters); torch's optimizers refuse an empty list.
        self.optimizer = optimizer_cls(mine, **kwargs) if mine else None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self):
        # TODO zero: update this rank's shard, then every parameter goes from its owner to the others.
        if self.optimizer is not None:
            self.optimizer.step()
        for i, p in enumerate(self.params):
            dist.broadcast(p.data, src=self.owner[i])


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
    # Every rank keeps the whole model, and all of its gradients (DDP averages every one of them).
    whole = 4 * sum(numels)
    # The owners ShardedOptimizer gives: largest first, each to the rank that owns the fewest elements.
    owned, state = [0] * world_size, [0] * world_size
    for n in sorted(numels, reverse=True):
        least = owned.index(min(owned))
        owned[least] += n
        state[least] += 4 * (2 * n + 1)  # AdamW: two running averages, and a step count (a float32 tensor)
    return [{"parameters": whole, "gradients": whole, "optimizer_state": s} for s in state]


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
