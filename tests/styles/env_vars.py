#!/usr/bin/env python
# Fashion-MNIST / WideResNet, data parallel over nodes and GPUs with torch DDP.
#
# The layout travels the way torchrun would pass it: main() puts WORLD_SIZE, NODE_RANK and
# LOCAL_WORLD_SIZE (and the rendezvous address) in the environment before it starts the
# processes, which inherit it; each process adds its own RANK and LOCAL_RANK and joins
# with init_method="env://".
import argparse
import os
import time
from datetime import timedelta

import torch
from torch import nn
from torch.nn import functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


def conv_bn_relu(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class Residual(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.main = nn.Sequential(*conv_bn_relu(cin, cout), nn.Dropout(0.1), *conv_bn_relu(cout, cout))
        self.proj = None if cin == cout else nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x):
        return self.main(x) + (x if self.proj is None else self.proj(x))


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        layers = conv_bn_relu(1, 16)
        cin = 16
        for i, w in enumerate(widths):
            if i > 0:
                layers.append(nn.MaxPool2d(2))
            layers += [Residual(cin, w), Residual(w, w)]
            cin = w
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def env_int(name):
    return int(os.environ[name])


def train_epoch(model, loader, optimizer, device):
    model.train()
    count = 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        count += targets.size(0)
    return count


@torch.no_grad()
def validation_sums(model, loader, sampler, rank, world_size, device):
    """[sum of losses, number right, number of images] over this rank's own images.

    The sampler makes every shard num_samples long by repeating images from the start of
    the set; the repeats are the last entry of the shards of the last `padding` ranks.
    """
    padding = sampler.total_size - len(loader.dataset)
    own = sampler.num_samples - (1 if rank >= world_size - padding else 0)
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    done = 0
    for inputs, targets in loader:
        logits = model(inputs.to(device))
        targets = targets.to(device)
        take = min(len(targets), own - done)
        if take <= 0:
            break
        logits, targets = logits[:take], targets[:take]
        sums[0] += F.cross_entropy(logits, targets, reduction="sum").double()
        sums[1] += (logits.argmax(dim=1) == targets).sum()
        sums[2] += take
        done += take
    return sums


def worker(local_rank, args):
    world_size = env_int("WORLD_SIZE")
    rank = env_int("NODE_RANK") * env_int("LOCAL_WORLD_SIZE") + local_rank
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(local_rank)

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT all come from the environment
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(minutes=10))

    first_on_node = env_int("LOCAL_RANK") == 0
    if first_on_node:
        train_ds = FashionMNIST(args.data_dir, train=True, download=True, transform=ToTensor())
        val_ds = FashionMNIST(args.data_dir, train=False, download=True, transform=ToTensor())
    dist.barrier()  # the files are complete on this node from here on
    if not first_on_node:
        train_ds = FashionMNIST(args.data_dir, train=True, download=False, transform=ToTensor())
        val_ds = FashionMNIST(args.data_dir, train=False, download=False, transform=ToTensor())

    train_sampler = DistributedSampler(train_ds, num_replicas=world_size, rank=rank, shuffle=True)
    val_sampler = DistributedSampler(val_ds, num_replicas=world_size, rank=rank, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=args.batch_size, sampler=val_sampler)

    model = WideResNet(widen_factor=args.widen_factor).to(device)
    if args.sync_bn and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    began = time.perf_counter()
    streak = 0
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        tick = time.perf_counter()
        trained = train_epoch(model, train_loader, optimizer, device)
        dist.barrier()
        epoch_seconds = time.perf_counter() - tick

        speed = torch.tensor(trained / epoch_seconds, dtype=torch.float64, device=device)
        dist.reduce(speed, dst=0, op=dist.ReduceOp.SUM)

        sums = validation_sums(model, val_loader, val_sampler, rank, world_size, device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        val_loss = (sums[0] / sums[2]).item()
        val_acc = (sums[1] / sums[2]).item()

        if rank == 0:
            elapsed = timedelta(seconds=int(time.perf_counter() - began))
            print(f"Epoch {epoch} | total {elapsed} | epoch {epoch_seconds:.3f} s | {speed.item():.1f} img/s "
                  f"| val_loss {val_loss:.5f} | val_acc {val_acc:.5f}", flush=True)

        streak = streak + 1 if val_acc >= args.target_accuracy else 0
        if streak >= args.patience:  # same sums on every rank: the same decision everywhere
            break

    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--base-lr", type=float, default=0.01)
    ap.add_argument("--target-accuracy", type=float, default=0.85)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"))
    ap.add_argument("--widen-factor", type=int, default=10)
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--node-id", type=int, default=0)
    ap.add_argument("--num-gpus", type=int, default=1)
    ap.add_argument("--master-addr", default="localhost")
    ap.add_argument("--master-port", type=int, default=29500)
    ap.add_argument("--sync-bn", action="store_true")
    args = ap.parse_args()

    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    os.environ["WORLD_SIZE"] = str(args.num_nodes * args.num_gpus)
    os.environ["NODE_RANK"] = str(args.node_id)
    os.environ["LOCAL_WORLD_SIZE"] = str(args.num_gpus)

    mp.spawn(worker, args=(args,), nprocs=args.num_gpus, join=True)


if __name__ == "__main__":
    main()
