"""The capstone, solved: the baseline made data parallel (torchrun, DDP, a shard of the samples per
process, a shared evaluation). Notebook 40 explains each change and how much it gives.

The capstone: train a small byte-level transformer on Python's own sources to a target quality, as
fast as you can, under the rules of notebook 40 (MLPerf Training's, made small).

This file is the baseline: one process, correct, slow. Your submission is this file, changed. The
checker runs it on every processor it has (2 processes here, every GPU on a GPU node), runs this
baseline beside it on the same machine, and scores the ratio of their times to the target.

    python capstone_lm.py --seed 0 --log-file runs/baseline.jsonl
    torchrun --standalone --nproc-per-node 2 capstone_lm.py --seed 0 --log-file runs/mine.jsonl
"""
import argparse
import json
import os
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CONTEXT = 64  # bytes a sample feeds the model; it predicts each next byte
VOCAB = 256   # one token per byte value
# left out: the test suites (every folder whose name starts with "test") and these tools and installs
SKIP = {"idle_test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages"}


# --- The data: the standard library's Python sources, split by file ---------------------------------

def python_sources():
    """Every .py file of this Python's standard library (tests and bundled tools left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if not any(d.startswith("test") or d in SKIP for d in p.relative_to(root).parts[:-1])]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_split(split, limit):
    """The split's samples as a (count, CONTEXT + 1) tensor of bytes: a file belongs to the validation
    split when the CRC-32 of its path is 0 modulo 20. The files are joined in order, cut to `limit`
    bytes, and cut into samples that each overlap the next by one byte (its last target)."""
    root, files = python_sources()
    stream = bytearray()
    for path in files:
        in_val = zlib.crc32(path.relative_to(root).as_posix().encode()) % 20 == 0
        if in_val == (split == "val"):
            stream += path.read_bytes()
        if len(stream) >= limit:
            break
    data = torch.frombuffer(stream[:limit], dtype=torch.uint8).long()  # a bytearray: writable, no copy
    count = (len(data) - 1) // CONTEXT
    return torch.stack([data[i * CONTEXT: i * CONTEXT + CONTEXT + 1] for i in range(count)])


# --- The model: a small GPT (closed division: as it is) --------------------------------------------

class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        # True above the diagonal: a position may not look at the bytes after it
        self.register_buffer("future", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1))

    def forward(self, x):
        t = x.shape[1]
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=self.future[:t, :t], need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Bytes (batch, time) in, logits (batch, time, 256) of each next byte out."""

    def __init__(self, width=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.zeros(CONTEXT, width))
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx):
        x = self.embed(idx) + self.position[: idx.shape[1]]
        return self.head(self.norm(self.blocks(x)))


# --- Training and evaluation ------------------------------------------------------------------------

def evaluate(model, val, batch_size, device):
    """The mean loss per byte over the whole validation split: each process sums its share (every
    world_size-th sample), and one all-reduce adds the shares up."""
    model.eval()
    mine = val[dist.get_rank()::dist.get_world_size()]
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss summed, bytes predicted
    with torch.no_grad():
        for start in range(0, len(mine), batch_size):
            batch = mine[start: start + batch_size].to(device)
            logits = model(batch[:, :-1])
            sums[0] += F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1), reduction="sum")
            sums[1] += batch[:, 1:].numel()
    dist.all_reduce(sums)
    model.train()
    return (sums[0] / sums[1]).item()


def main():
    parser = argparse.ArgumentParser(description="Train a byte-level GPT on Python's sources to a target loss.")
    parser.add_argument("--target-loss", type=float, default=1.9, help="validation loss per byte to reach (the rules')")
    parser.add_argument("--eval-every", type=int, default=4096, help="training samples between evaluations (the rules')")
    parser.add_argument("--max-samples", type=int, default=400_000, help="give up after this many training samples")
    parser.add_argument("--train-bytes", type=int, default=4_000_000, help="bytes of the training split used")
    parser.add_argument("--val-bytes", type=int, default=65_537, help="bytes of the validation split used")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of the data's order")
    parser.add_argument("--log-file", default="capstone_log.jsonl", help="where the run's events go, one JSON line each")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step, over all processes")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW's learning rate")
    args = parser.parse_args()

    # One process per GPU (NCCL), or per CPU core (gloo); torchrun says who we are.
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(args.seed)  # the same initial weights on every process (DDP broadcasts rank 0's anyway)
    train = load_split("train", args.train_bytes)
    val = load_split("val", args.val_bytes)

    def log(key, **fields):
        if rank != 0:  # one log for the run
            return
        with open(args.log_file, "a") as out:
            out.write(json.dumps({"key": key, "time": time.time(), **fields}) + "\n")

    model = DDP(TinyGPT().to(device), device_ids=[device.index] if use_cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    log("run_start", division="closed", changes="DDP on every process, each a disjoint share of every batch",
        world_size=world_size, global_batch_size=args.batch_size, seed=args.seed)

    order = torch.Generator().manual_seed(args.seed)  # the data's order: the same on every run of a seed
    samples, next_eval, epoch = 0, args.eval_every, 0
    while samples < args.max_samples:
        # Every process draws the same order and takes every world_size-th sample of each global batch.
        for idx in torch.randperm(len(train), generator=order).split(args.batch_size):
            batch = train[idx[rank::world_size]].to(device)
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            samples += len(idx)  # the global batch: every process's samples
            if samples >= next_eval:
                next_eval += args.eval_every
                quality = evaluate(model, val, 256, device)
                log("eval", samples=samples, loss=quality, epoch=epoch)
                if rank == 0:
                    print(f"{samples:>8} samples | train loss {loss.item():.3f} | validation loss {quality:.3f}")
                if quality <= args.target_loss:  # the same quality on every process: all stop here
                    log("run_stop", status="success", samples=samples)
                    dist.destroy_process_group()
                    return
            if samples >= args.max_samples:
                break
        epoch += 1
    log("run_stop", status="aborted", samples=samples)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
