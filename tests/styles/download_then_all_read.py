"""WideResNet on Fashion-MNIST, data-parallel over processes and nodes.

Local rank 0 of each node downloads both sets once, then everybody (the downloader too) meets at
a barrier and reads the files with download=False. Validation counts every image once by cutting
each rank's last batches to its own share (the sampler repeats a few images to even the shards out),
and stops reading once the share is done.
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def conv_bn(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class Residual(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.main = nn.Sequential(*conv_bn(cin, cout), nn.Dropout(0.1), *conv_bn(cout, cout))
        self.proj = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x):
        return self.main(x) + self.proj(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        layers = [*conv_bn(1, 16)]
        cin = 16
        for i, w in enumerate(widths):
            if i:
                layers.append(nn.MaxPool2d(2))
            layers += [Residual(cin, w), Residual(w, w)]
            cin = w
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.out(self.body(x))


def fashion(root, train, download):
    return torchvision.datasets.FashionMNIST(root, train=train, download=download,
                                             transform=torchvision.transforms.ToTensor())


def train_process(local_rank, cfg):
    rank = cfg.node_id * cfg.num_gpus + local_rank
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.set_num_threads(1)

    if local_rank == 0:  # fetch the files once per node; the objects are thrown away
        fashion(cfg.data_dir, True, True)
        fashion(cfg.data_dir, False, True)
    dist.barrier()
    train_data = fashion(cfg.data_dir, True, False)
    val_data = fashion(cfg.data_dir, False, False)

    train_sampler = DistributedSampler(train_data, num_replicas=cfg.world_size, rank=rank)
    val_sampler = DistributedSampler(val_data, num_replicas=cfg.world_size, rank=rank, shuffle=False)
    train_loader = DataLoader(train_data, batch_size=cfg.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_data, batch_size=cfg.batch_size, sampler=val_sampler)
    my_share = math.ceil((len(val_data) - rank) / cfg.world_size)  # images this rank owns, no repeats

    net = nn.parallel.DistributedDataParallel(WideResNet(cfg.widen_factor))
    opt = torch.optim.SGD(net.parameters(), lr=cfg.base_lr)

    began, streak = time.time(), 0
    for epoch in range(1, cfg.epochs + 1):
        train_sampler.set_epoch(epoch)
        t0 = time.time()
        net.train()
        trained = 0
        for x, y in train_loader:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
            trained += x.shape[0]
        dist.barrier()
        seconds = time.time() - t0
        images = torch.tensor([float(trained)])
        dist.all_reduce(images)  # every rank's count; rank 0 turns the total into a rate

        net.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                take = min(len(y), my_share - int(sums[2]))
                if take <= 0:
                    break
                logits = net(x[:take])
                sums[0] += F.cross_entropy(logits, y[:take], reduction="sum").item()
                sums[1] += (logits.argmax(1) == y[:take]).sum().item()
                sums[2] += take
        dist.all_reduce(sums)
        loss, acc = (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()
        if rank == 0:
            print(f"ep {epoch} | {time.time() - began:.1f}s in | {seconds:.3f}s | "
                  f"{images.item() / seconds:.1f} im/s | loss {loss:.4f} | acc {acc:.4f}")
        streak = streak + 1 if acc >= cfg.target_accuracy else 0
        if streak >= cfg.patience:
            break
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--node-id", type=int, default=0)
    ap.add_argument("--num-gpus", type=int, default=1)
    ap.add_argument("--master-addr", default="localhost")
    ap.add_argument("--master-port", type=int, default=29500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--base-lr", type=float, default=0.01)
    ap.add_argument("--target-accuracy", type=float, default=0.85)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--widen-factor", type=int, default=10)
    ap.add_argument("--data-dir", default="./data")
    cfg = ap.parse_args()
    cfg.world_size = cfg.num_nodes * cfg.num_gpus
    os.environ.update(MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(cfg.master_port))
    mp.spawn(train_process, args=(cfg,), nprocs=cfg.num_gpus)


if __name__ == "__main__":
    main()
