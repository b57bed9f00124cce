"""ZeRO stage 3 (FSDP) by hand: the parameters sharded at rest, gathered for each unit just when it runs.

    python exercises/zero3.py --world-size 2     # against DDP: the outputs, the weights and the bytes held

ZeRO-2 (notebook 30) left every process holding the whole model's parameters. ZeRO-3, which PyTorch's
FSDP implements, shards them too: at rest each process holds 1/N of every unit (here, each child of an
nn.Sequential), and nothing else of it. Just before a unit's forward, the processes gather its whole
parameters; right after, they free them. Backward needs them again: gathered once more just before the
unit's backward, freed once its gradients have been reduce-scattered into the shards. A process then
holds the whole parameters of about one unit at a time. Notebook 34 has hints you open when you want them.
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


class Zero3:
    """Wraps an nn.Sequential `model` whose children are its units: zero3(x) gives model(x); then loss.backward()
    and zero3.step()."""

    def __init__(self, model, optimizer_cls, prefetch=False, **kwargs):
        self.model, self.prefetch = model, prefetch
        # TODO zero3: every rank starts from rank 0's parameters. Each unit's parameters are cut into one shard per
        # rank, the same cut on every rank, and from here on, at rest, a rank holds its shards alone: every
        # parameter of the model holds no elements (a tensor of size 0). This rank keeps an
        # optimizer_cls(..., **kwargs) over its shards only.
        pass  # your code

    def __call__(self, x):
        # TODO zero3: model(x). Each unit's whole parameters are there just before it runs (forward, and again
        # before its backward), and freed right after it has run (after its forward; after its backward, once its
        # gradients have been reduce-scattered: this rank receives the sum over the ranks of its own shard alone).
        # TODO zero3_prefetch: with prefetch=True, each unit's gather for its forward begins before the unit before
        # it runs its forward, so that it travels while that unit computes; it is complete before its own forward.
        return None  # your code

    def step(self):
        # TODO zero3: this rank's shards take one step of its optimizer with the average over the ranks of their
        # gradients; the model's parameters stay at rest (empty), and no gradient is left for the next backward().
        pass  # your code


# The rest trains a model with Zero3 and with DDP, and compares their outputs at each step and their weights
# at the end, and the parameters and gradients each process holds.

def make_model():
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def held_bytes(tensors):
    """The bytes of the buffers behind these tensors, each buffer once."""
    buffers = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(buffers.values())


def worker(rank, args):
    torch.set_num_threads(1)
    # gloo: this comparison is about arithmetic and memory, and runs on the CPU, GPUs or not.
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch_size, 64, generator=generator),
                torch.randint(0, 10, (args.batch_size,), generator=generator)) for _ in range(args.steps)]
    share = args.batch_size // args.world_size
    mine = slice(rank * share, (rank + 1) * share)
    options = {"lr": 0.05, "momentum": 0.9}

    ddp = nn.parallel.DistributedDataParallel(make_model())
    plain = torch.optim.SGD(ddp.parameters(), **options)
    expected = []
    for x, y in batches:
        out = ddp(x[mine])
        expected.append(out.detach())
        plain.zero_grad(set_to_none=True)
        F.cross_entropy(out, y[mine]).backward()
        plain.step()

    model = make_model()
    sharded = Zero3(model, torch.optim.SGD, prefetch=args.prefetch, **options)
    peak, difference = 0, 0.0
    for (x, y), wanted in zip(batches, expected):
        out = sharded(x[mine])
        difference = max(difference, (out.detach() - wanted).abs().max().item())
        F.cross_entropy(out, y[mine]).backward()
        sharded.step()
    at_rest = held_bytes([*model.parameters(), *sharded.optimizer.param_groups[0]["params"]])
    whole = sum(p.numel() * p.element_size() for p in ddp.parameters())
    found = [None] * args.world_size
    dist.all_gather_object(found, {"rank": rank, "at_rest": at_rest, "difference": difference})
    if rank == 0:
        print(f"model: {whole / 1024:.0f} KB of parameters, whole on every process under DDP")
        for f in found:
            print(f"rank {f['rank']}: parameters at rest {f['at_rest'] / 1024:.0f} KB; largest difference from DDP's "
                  f"outputs {f['difference']:.1e}", flush=True)
        if args.json_file:  # for notebook 34's picture
            with open(args.json_file, "w") as f:
                json.dump({"world_size": args.world_size, "param_bytes": whole, "ranks": found}, f)
    del ddp, model, sharded
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
    parser = argparse.ArgumentParser(description="ZeRO stage 3 by hand, against DDP.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--batch-size", type=positive_int, default=48, help="the global batch")
    parser.add_argument("--prefetch", action="store_true", help="gather the next unit while this one runs")
    parser.add_argument("--json-file", help="also write each rank's bytes at rest and difference here")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error("--batch-size must divide by --world-size")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
