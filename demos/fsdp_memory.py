"""FSDP (ZeRO stage 3) against DDP: what each process holds, and the same training.

    python demos/fsdp_memory.py --world-size 2

DDP keeps the whole model, its gradients and the optimizer's state on every process. FSDP
(`fully_shard`, PyTorch's FSDP2) keeps 1/N of each on each process: a parameter is a DTensor
whose local piece is this process's shard of dim 0. Before a layer's forward (and again before
its backward) the shards are all-gathered into the whole weight, which is freed after use; during
backward, as soon as a unit's gradients are ready (the last layer's first), they are
reduce-scattered, so that each process receives the average of its own shard only, and the
optimizer updates only that shard.

This script trains the same model both ways on N processes, prints what each process holds
(parameters, gradients, optimizer state), and checks that both end with the same weights.
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


def make_model():
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def local(tensor):
    """This process's own piece of a tensor: a DTensor's shard, or the whole of a plain tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def held(model, optimizer):
    """Bytes this process holds of the parameters, the gradients and the optimizer's state."""
    def size(tensors):
        return sum(local(t).numel() * local(t).element_size() for t in tensors)
    return {"parameters": size(model.parameters()),
            "gradients": size(p.grad for p in model.parameters() if p.grad is not None),
            "optimizer": size(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))}


def train(model, batches, rank, world_size, device):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in batches:
        share = len(y) // world_size
        mine = slice(rank * share, (rank + 1) * share)
        optimizer.zero_grad(set_to_none=False)  # keep the gradients, so that they can be weighed
        F.cross_entropy(model(x[mine].to(device)), y[mine].to(device)).backward()
        optimizer.step()
    return held(model, optimizer)


def worker(rank, args):
    torch.set_num_threads(1)
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if on_gpu:
        torch.cuda.set_device(rank)  # before the process group: NCCL uses the current device
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    from torch.distributed.fsdp import fully_shard  # FSDP2: PyTorch 2.6 and later

    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch_size, 64, generator=generator),
                torch.randint(0, 10, (args.batch_size,), generator=generator)) for _ in range(args.steps)]

    ddp = nn.parallel.DistributedDataParallel(make_model().to(device), device_ids=[rank] if on_gpu else None)
    ddp_held = train(ddp, batches, rank, args.world_size, device)

    sharded = make_model().to(device)
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)  # each layer a unit: gathered just before it runs, freed after
    fully_shard(sharded)
    fsdp_held = train(sharded, batches, rank, args.world_size, device)

    # full_tensor() all-gathers a sharded parameter: every rank must call it, in the same order.
    difference = max((p.full_tensor() - q).abs().max().item()
                     for p, q in zip(sharded.parameters(), ddp.module.parameters()))
    found = [None] * args.world_size
    dist.all_gather_object(found, {"rank": rank, "DDP": ddp_held, "FSDP": fsdp_held})
    if rank == 0:
        for f in found:
            for name in ("DDP", "FSDP"):
                kb = {what: f"{size / 1024:6.0f} KB" for what, size in f[name].items()}
                print(f"rank {f['rank']} {name:4}: parameters {kb['parameters']}, gradients {kb['gradients']}, "
                      f"optimizer state {kb['optimizer']}")
        print(f"largest difference between FSDP's and DDP's weights: {difference:.1e}", flush=True)
        if args.json_file:  # for notebook 21's picture
            with open(args.json_file, "w") as f:
                json.dump({"world_size": args.world_size, "ranks": found, "difference": difference}, f)
    # Free the models (DDP's hooks can make reference cycles, hence gc) before the process group:
    # one that outlives the group can abort the process at exit.
    del ddp, sharded
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
    parser = argparse.ArgumentParser(description="FSDP (fully_shard) against DDP: memory per process.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--batch-size", type=positive_int, default=48, help="the global batch")
    parser.add_argument("--json-file", help="also write what each rank holds here")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error("--batch-size must divide by --world-size")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
