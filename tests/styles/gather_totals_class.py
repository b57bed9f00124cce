"""Distributed Fashion-MNIST training: a data class that knows who downloads, and totals gathered.

`FashionData` builds both sets once per process: the node's first process downloads, the rest wait
at a barrier inside the class and then read. Each rank's validation totals (loss sum, correct,
images) and its images/sec are collected from every rank with dist.all_gather and added up.
"""
import argparse
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


class Unit(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.b = nn.Sequential(nn.Dropout(0.1), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                               nn.BatchNorm2d(cout), nn.ReLU())
        self.short = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else None

    def forward(self, x):
        return self.b(self.a(x)) + (x if self.short is None else self.short(x))


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        c1, c2, c3 = (16 * widen_factor * m for m in (1, 2, 4))
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            Unit(16, c1), Unit(c1, c1), nn.MaxPool2d(2),
            Unit(c1, c2), Unit(c2, c2), nn.MaxPool2d(2),
            Unit(c2, c3), Unit(c3, c3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c3, num_classes))

    def forward(self, x):
        return self.net(x)


@dataclass
class Config:
    num_nodes: int
    node_id: int
    num_gpus: int
    batch_size: int
    epochs: int
    lr: float
    target_accuracy: float
    patience: int
    widen_factor: int
    data_dir: str

    @property
    def world_size(self):
        return self.num_nodes * self.num_gpus


class FashionData:
    def __init__(self, root, first_on_node):
        if first_on_node:
            self.train, self.val = self._read(root, True)
        dist.barrier()  # the files are whole once the first process of the node gets here
        if not first_on_node:
            self.train, self.val = self._read(root, False)

    @staticmethod
    def _read(root, download):
        return (FashionMNIST(root, train=True, download=download, transform=ToTensor()),
                FashionMNIST(root, train=False, download=download, transform=ToTensor()))

    def loaders(self, batch_size):
        self.train_sampler = DistributedSampler(self.train)
        val_sampler = DistributedSampler(self.val, shuffle=False)
        return (DataLoader(self.train, batch_size=batch_size, sampler=self.train_sampler),
                DataLoader(self.val, batch_size=batch_size, sampler=val_sampler))


def gathered_sum(values):
    """The element-wise sum of `values` over every rank, by collecting all of them."""
    parts = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, values)
    return torch.stack(parts).sum(dim=0)


def run(local_rank, cfg):
    rank = cfg.node_id * cfg.num_gpus + local_rank
    dist.init_process_group(backend="gloo", init_method="env://", rank=rank, world_size=cfg.world_size)
    torch.set_num_threads(1)
    data = FashionData(cfg.data_dir, first_on_node=local_rank == 0)
    train_loader, val_loader = data.loaders(cfg.batch_size)

    model = nn.parallel.DistributedDataParallel(WideResNet(cfg.widen_factor))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    t_start = time.perf_counter()
    good_epochs = 0
    for epoch in range(cfg.epochs):
        data.train_sampler.set_epoch(epoch)
        model.train()
        t_epoch = time.perf_counter()
        seen = 0
        for images, labels in train_loader:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += labels.numel()
        dist.barrier()
        elapsed = time.perf_counter() - t_epoch
        throughput = gathered_sum(torch.tensor([seen / elapsed]))[0].item()

        model.eval()
        mine = torch.zeros(3)
        with torch.inference_mode():
            for images, labels in val_loader:
                out = model(images)
                mine += torch.tensor([F.cross_entropy(out, labels, reduction="sum").item(),
                                      (out.argmax(dim=1) == labels).sum().item(), labels.numel()])
        total = gathered_sum(mine)
        val_loss, val_acc = (total[0] / total[2]).item(), (total[1] / total[2]).item()
        if rank == 0:
            print(f"epoch {epoch + 1} finished after {time.perf_counter() - t_start:.1f} s; this epoch "
                  f"{elapsed:.3f} s at {throughput:.1f} images per second; validation {val_loss:.4f} / {val_acc:.4f}")
        good_epochs = good_epochs + 1 if val_acc >= cfg.target_accuracy else 0
        if good_epochs >= cfg.patience:
            break
    dist.destroy_process_group()


def parse():
    p = argparse.ArgumentParser(description="DDP Fashion-MNIST")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--node-id", type=int, default=0)
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--base-lr", type=float, default=0.01)
    p.add_argument("--target-accuracy", type=float, default=0.85)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--widen-factor", type=int, default=10)
    p.add_argument("--data-dir", default="./data")
    a = p.parse_args()
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(a.master_port)
    return a, Config(a.num_nodes, a.node_id, a.num_gpus, a.batch_size, a.epochs, a.base_lr,
                     a.target_accuracy, a.patience, a.widen_factor, a.data_dir)


if __name__ == "__main__":
    args, config = parse()
    mp.spawn(run, args=(config,), nprocs=config.num_gpus)
