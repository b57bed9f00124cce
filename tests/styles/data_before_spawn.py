"""Fashion-MNIST with DDP: each node's main process fetches the data before it starts its workers.

The main process of a node is the only one there that touches the network: it builds both data
sets (downloading them if needed) under the main guard and hands them to the processes it spawns,
which never read the files themselves. Validation totals are reduced onto rank 0, which alone
decides whether to stop and broadcasts that decision.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


def block(cin, cout):
    """conv-bn-relu twice with dropout between, and a shortcut, as one module."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.sc = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else nn.Identity()

        def forward(self, x):
            h = F.relu(self.b1(self.c1(x)))
            h = F.relu(self.b2(self.c2(F.dropout(h, 0.1, self.training))))
            return h + self.sc(x)
    return Block()


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        k = widen_factor
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.ModuleList([block(16, 16 * k), block(16 * k, 16 * k), block(16 * k, 32 * k),
                                     block(32 * k, 32 * k), block(32 * k, 64 * k), block(64 * k, 64 * k)])
        self.fc = nn.Linear(64 * k, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for i, b in enumerate(self.blocks):
            if i in (2, 4):
                x = F.max_pool2d(x, 2)
            x = b(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def worker(local_rank, opts, world_size, train_set, val_set):
    rank = opts.node_id * opts.num_gpus + local_rank
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    train_sampler = DistributedSampler(train_set, world_size, rank, shuffle=True)
    val_sampler = DistributedSampler(val_set, world_size, rank, shuffle=False)
    train_loader = DataLoader(train_set, opts.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, opts.batch_size, sampler=val_sampler)

    model = nn.parallel.DistributedDataParallel(WideResNet(opts.widen_factor))
    sgd = torch.optim.SGD(model.parameters(), lr=opts.base_lr)
    t0 = time.monotonic()
    hits = 0
    for epoch in range(opts.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        start, n = time.monotonic(), 0
        for x, y in train_loader:
            sgd.zero_grad()
            F.cross_entropy(model(x), y).backward()
            sgd.step()
            n += len(y)
        dist.barrier()
        rate = torch.tensor(n / (time.monotonic() - start))
        took = time.monotonic() - start
        dist.reduce(rate, 0)

        model.eval()
        stats = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                out = model(x)
                stats += torch.tensor([F.cross_entropy(out, y, reduction="sum").item(),
                                       (out.argmax(-1) == y).sum().item(), len(y)], dtype=torch.float64)
        dist.reduce(stats, dst=0)
        stop = torch.zeros(1)
        if rank == 0:
            loss, acc = stats[0] / stats[2], stats[1] / stats[2]
            print(f"Epoch {epoch + 1:02d} :: wall {time.monotonic() - t0:7.1f}s :: train {took:.3f}s :: "
                  f"{rate.item():.1f} images/s :: val loss {loss:.4f} :: val acc {acc:.4f}", flush=True)
            hits = hits + 1 if acc >= opts.target_accuracy else 0
            stop[0] = float(hits >= opts.patience)
        dist.broadcast(stop, src=0)
        if stop.item():
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name, default in (("--num-nodes", 1), ("--node-id", 0), ("--num-gpus", 1), ("--master-port", 29500),
                          ("--batch-size", 32), ("--epochs", 40), ("--patience", 2), ("--widen-factor", 10)):
        parser.add_argument(name, type=int, default=default)
    parser.add_argument("--base-lr", type=float, default=0.01)
    parser.add_argument("--target-accuracy", type=float, default=0.85)
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--master-addr", default="127.0.0.1")
    opts = parser.parse_args()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = opts.master_addr, str(opts.master_port)

    # one download per node: only this process, before any worker exists
    to_tensor = transforms.ToTensor()
    try:
        train_set = datasets.FashionMNIST(opts.data_dir, train=True, download=True, transform=to_tensor)
        val_set = datasets.FashionMNIST(opts.data_dir, train=False, download=True, transform=to_tensor)
    except RuntimeError as err:
        sys.exit(f"no data: {err}")
    mp.spawn(worker, args=(opts, opts.num_nodes * opts.num_gpus, train_set, val_set), nprocs=opts.num_gpus)
