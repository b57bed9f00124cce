"""Distributed training of a WideResNet on Fashion-MNIST, organised around a Trainer.

    python trainer_class.py --num-gpus 4
    python trainer_class.py --num-nodes 2 --node-id 0 --num-gpus 8 --master-addr node0
"""
from __future__ import annotations

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


# ----------------------------------------------------------------------------- model

class ResBlock(nn.Module):
    def __init__(self, inp: int, out: int, drop: float = 0.1) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(out), nn.BatchNorm2d(out)
        self.conv1 = nn.Conv2d(inp, out, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(out, out, 3, padding=1, bias=False)
        self.drop = nn.Dropout(drop)
        self.shortcut = nn.Conv2d(inp, out, 1, bias=False) if inp != out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.bn1(self.conv1(x))))
        h = torch.relu(self.bn2(self.conv2(h)))
        return h + (x if self.shortcut is None else self.shortcut(x))


class WideResNet(nn.Module):
    def __init__(self, widen_factor: int = 10, num_classes: int = 10) -> None:
        super().__init__()
        a, b, c = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.conv = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.ModuleList([ResBlock(16, a), ResBlock(a, a), ResBlock(a, b), ResBlock(b, b),
                                     ResBlock(b, c), ResBlock(c, c)])
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        for i, block in enumerate(self.blocks):
            if i in (2, 4):
                x = F.max_pool2d(x, 2)
            x = block(x)
        return self.fc(x.mean(dim=(2, 3)))


# ----------------------------------------------------------------------------- training

@dataclass
class EpochReport:
    epoch: int
    elapsed: float
    seconds: float
    images_per_sec: float
    loss: float
    accuracy: float

    def line(self) -> str:
        m, s = divmod(int(self.elapsed), 60)
        return (f"Epoch {self.epoch:>2} [{m:02d}m{s:02d}s] took {self.seconds:.2f}s, "
                f"{self.images_per_sec:.0f} images/sec; validation: loss {self.loss:.3f}, "
                f"accuracy {self.accuracy:.3f}")


class Trainer:
    """Everything one process needs: its place in the world, the data, the model."""

    def __init__(self, local_rank: int, args: argparse.Namespace) -> None:
        self.args = args
        self.local_rank = local_rank
        self.rank = args.node_id * args.num_gpus + local_rank
        self.world_size = args.world_size
        self.cuda = torch.cuda.is_available()
        self.device = torch.device(f"cuda:{local_rank}" if self.cuda else "cpu")
        self._join()
        self.train_set, self.val_set = self._datasets()
        self.train_sampler = DistributedSampler(self.train_set, num_replicas=self.world_size, rank=self.rank,
                                                shuffle=True, seed=0)
        self.val_sampler = DistributedSampler(self.val_set, num_replicas=self.world_size, rank=self.rank,
                                              shuffle=False)
        self.train_loader = DataLoader(self.train_set, batch_size=args.batch_size, sampler=self.train_sampler)
        self.val_loader = DataLoader(self.val_set, batch_size=args.batch_size, sampler=self.val_sampler)
        self.model = self._build_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.base_lr)

    def _join(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group(backend="nccl" if self.cuda else "gloo",
                                rank=self.rank, world_size=self.world_size)

    def _datasets(self) -> tuple[FashionMNIST, FashionMNIST]:
        downloader = self.local_rank == 0

        def load() -> tuple[FashionMNIST, FashionMNIST]:
            return (FashionMNIST(self.args.data_dir, train=True, download=downloader, transform=ToTensor()),
                    FashionMNIST(self.args.data_dir, train=False, download=downloader, transform=ToTensor()))

        sets = load() if downloader else None
        dist.barrier()  # the node's downloader is done: the files can be read
        return sets if sets is not None else load()

    def _build_model(self) -> nn.Module:
        model = WideResNet(self.args.widen_factor).to(self.device)
        if self.args.sync_bn:
            if self.cuda:
                model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            elif self.rank == 0:
                print("SyncBatchNorm needs GPUs: --sync-bn ignored")
        return nn.parallel.DistributedDataParallel(model, device_ids=[self.local_rank] if self.cuda else None)

    def train_epoch(self, epoch: int) -> tuple[float, float]:
        """One epoch of training; returns (seconds, images/sec of all ranks, valid on rank 0)."""
        self.train_sampler.set_epoch(epoch)
        self.model.train()
        started = time.time()
        images = 0
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()
            images += len(y)
        dist.barrier()  # the epoch ends when the slowest rank is done
        seconds = time.time() - started
        rate = torch.tensor(images / seconds, device=self.device)
        dist.reduce(rate, dst=0, op=dist.ReduceOp.SUM)
        return seconds, rate.item()

    @torch.no_grad()
    def validate(self) -> tuple[float, float]:
        """(loss, accuracy) over the whole validation set, on rank 0 (other ranks get zeros)."""
        self.model.eval()
        n, world = len(self.val_set), self.world_size
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        position = self.rank  # where this rank's next image sits in the sampler's padded list
        for x, y in self.val_loader:
            x, y = x.to(self.device), y.to(self.device)
            logits = self.model(x)
            positions = position + world * torch.arange(len(y), device=self.device)
            weight = (positions < n).double()  # entries past n are the sampler's repeats
            position += world * len(y)
            totals[0] += (F.cross_entropy(logits, y, reduction="none").double() * weight).sum()
            totals[1] += ((logits.argmax(1) == y).double() * weight).sum()
            totals[2] += weight.sum()
        dist.reduce(totals, dst=0, op=dist.ReduceOp.SUM)
        if self.rank != 0:
            return 0.0, 0.0
        return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()

    def should_stop(self, on_target: bool) -> bool:
        """Rank 0 alone knows the accuracy; it tells everyone whether to stop."""
        flag = torch.tensor([1 if on_target else 0], device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def fit(self) -> None:
        start = time.time()
        streak = 0
        for epoch in range(1, self.args.epochs + 1):
            seconds, images_per_sec = self.train_epoch(epoch)
            loss, accuracy = self.validate()
            if self.rank == 0:
                print(EpochReport(epoch, time.time() - start, seconds, images_per_sec, loss, accuracy).line(),
                      flush=True)
                streak = streak + 1 if accuracy >= self.args.target_accuracy else 0
            if self.should_stop(streak >= self.args.patience):
                if self.rank == 0:
                    print(f"Early stop: accuracy >= {self.args.target_accuracy} for {streak} epochs")
                break

    def close(self) -> None:
        dist.destroy_process_group()


def run(local_rank: int, args: argparse.Namespace) -> None:
    trainer = Trainer(local_rank, args)
    try:
        trainer.fit()
    finally:
        trainer.close()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--batch-size", type=int, default=32, help="per-process batch size")
    add("--epochs", type=int, default=40)
    add("--base-lr", type=float, default=0.01)
    add("--target-accuracy", type=float, default=0.85)
    add("--patience", type=int, default=2)
    add("--data-dir", default="./data")
    add("--widen-factor", type=int, default=10)
    add("--num-nodes", type=int, default=1)
    add("--node-id", type=int, default=0)
    add("--num-gpus", type=int, default=1, help="processes (GPUs) on this node")
    add("--master-addr", default="localhost")
    add("--master-port", type=int, default=29500)
    add("--sync-bn", action="store_true")
    args = parser.parse_args()
    args.world_size = args.num_nodes * args.num_gpus
    return args


def main() -> None:
    args = parse_args()
    os.environ.update(MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port))
    mp.spawn(run, args=(args,), nprocs=args.num_gpus)


if __name__ == "__main__":
    main()
