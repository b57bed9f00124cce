"""The capstone by hand: no DDP (the gradients averaged with one all-reduce of them all, flattened),
blocked shards of each global batch, and an evaluation whose shares are gathered on every process."""
import argparse
import json
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

SKIP = {"idle_test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages"}


def split_samples(name, limit, width=64):
    base = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted((p for p in base.rglob("*.py") if not any(part.startswith("test") or part in SKIP
                                                              for part in p.relative_to(base).parent.parts)),
                   key=lambda p: p.relative_to(base).as_posix())
    chunks, size = [], 0
    for p in paths:
        if (zlib.crc32(p.relative_to(base).as_posix().encode()) % 20 == 0) != (name == "val"):
            continue
        chunks.append(p.read_bytes())
        size += len(chunks[-1])
        if size >= limit:
            break
    data = torch.tensor(list(b"".join(chunks)[:limit]), dtype=torch.long)
    n = (len(data) - 1) // width
    return data[: n * width + 1].unfold(0, width + 1, width)


class Layer(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.register_buffer("future", torch.triu(torch.ones(64, 64, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=self.future[: x.shape[1], : x.shape[1]], need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, width=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(64, width))
        self.blocks = nn.Sequential(*[Layer(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, idx):
        return self.head(self.norm(self.blocks(self.embed(idx) + self.position[: idx.shape[1]])))


def average_gradients(model, world):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def validation_loss(model, val, rank, world):
    block = -(-len(val) // world)
    part = val[rank * block: (rank + 1) * block]
    model.eval()
    with torch.no_grad():
        logits = model(part[:, :-1])
        mine = torch.tensor([F.cross_entropy(logits.reshape(-1, 256), part[:, 1:].reshape(-1), reduction="sum").item(),
                             part[:, 1:].numel()], dtype=torch.float64)
    shares = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(shares, mine)
    model.train()
    total = torch.stack(shares).sum(0)
    return (total[0] / total[1]).item()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    for flag, kind, default in (("--target-loss", float, 1.9), ("--eval-every", int, 4096),
                                ("--max-samples", int, 400_000), ("--train-bytes", int, 4_000_000),
                                ("--val-bytes", int, 65_537), ("--seed", int, 0), ("--log-file", str, "run.jsonl")):
        ap.add_argument(flag, type=kind, default=default)
    opts = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(opts.seed + 100 * rank)  # different on purpose: rank 0's weights are broadcast below
    train, val = split_samples("train", opts.train_bytes), split_samples("val", opts.val_bytes)
    model = TinyGPT()
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    log = open(opts.log_file, "w") if rank == 0 else None

    def event(name, **fields):
        if log:
            print(json.dumps({"key": name, "time": time.time(), **fields}), file=log, flush=True)

    event("run_start", division="open", changes="gradients averaged by hand, no DDP wrapper", world_size=world,
          global_batch_size=32, seed=opts.seed)
    shuffle = torch.Generator().manual_seed(opts.seed)
    trained, status = 0, "aborted"
    while status == "aborted" and trained < opts.max_samples:
        for global_batch in torch.randperm(len(train), generator=shuffle).split(32):
            rows = train[global_batch.chunk(world)[rank]]
            optimizer.zero_grad()
            F.cross_entropy(model(rows[:, :-1]).reshape(-1, 256), rows[:, 1:].reshape(-1)).backward()
            average_gradients(model, world)
            optimizer.step()
            before, trained = trained, trained + len(global_batch)
            if trained // opts.eval_every > before // opts.eval_every:
                quality = validation_loss(model, val, rank, world)
                event("eval", samples=trained, loss=quality)
                if quality <= opts.target_loss:
                    status = "success"
                    break
            if trained >= opts.max_samples:
                break
    event("run_stop", status=status, samples=trained)
    dist.destroy_process_group()
