"""Fashion-MNIST, WideResNet, DDP: every cross-process number is an average (ReduceOp.AVG).

Why averages can be exact here: each process computes its shard's mean loss and accuracy,
and the average over W processes of numbers x_r is sum(x_r) / W. That equals the mean over
all N validation images only if every shard weighs N / W images. The DistributedSampler does
give every shard the same length, ceil(N / W), but when N is not a multiple of W the last
shards end with a repeat of an image that another shard already has. So each process
counts only its own images and scales its means by own / (N / W) before averaging.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


def conv3x3_bn_relu(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    def __init__(self, c_in, c_out, dropout=0.1):
        super().__init__()
        self.layers = nn.Sequential(conv3x3_bn_relu(c_in, c_out), nn.Dropout(dropout), conv3x3_bn_relu(c_out, c_out))
        self.shortcut = nn.Identity() if c_in == c_out else nn.Conv2d(c_in, c_out, kernel_size=1, bias=False)

    def forward(self, x):
        return self.layers(x) + self.shortcut(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        k = widen_factor
        self.features = nn.Sequential(
            conv3x3_bn_relu(1, 16),
            ResidualBlock(16, 16 * k), ResidualBlock(16 * k, 16 * k), nn.MaxPool2d(2),
            ResidualBlock(16 * k, 32 * k), ResidualBlock(32 * k, 32 * k), nn.MaxPool2d(2),
            ResidualBlock(32 * k, 64 * k), ResidualBlock(64 * k, 64 * k),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(64 * k, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def train_one_epoch(model, loader, optimizer, device):
    model.train()
    images = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        images += len(y)
    return images


@torch.no_grad()
def shard_means(model, loader, own, device):
    """Mean loss and accuracy over the first `own` images of this process's shard."""
    model.eval()
    loss_sum = correct = counted = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        keep = int(min(len(y), own - counted))
        if keep > 0:
            loss_sum += F.cross_entropy(out[:keep], y[:keep], reduction="sum").item()
            correct += (out[:keep].argmax(1) == y[:keep]).sum().item()
            counted += keep
    return loss_sum / counted, correct / counted


def worker(local_rank, args):
    use_cuda = torch.cuda.is_available()
    rank = args.node_id * args.num_gpus + local_rank
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=args.world_size)
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")

    if local_rank == 0:
        train_set = FashionMNIST(args.data_dir, train=True, download=True, transform=ToTensor())
        val_set = FashionMNIST(args.data_dir, train=False, download=True, transform=ToTensor())
    dist.barrier()
    if local_rank != 0:
        train_set = FashionMNIST(args.data_dir, train=True, download=False, transform=ToTensor())
        val_set = FashionMNIST(args.data_dir, train=False, download=False, transform=ToTensor())

    train_sampler = DistributedSampler(train_set, num_replicas=args.world_size, rank=rank)
    val_sampler = DistributedSampler(val_set, num_replicas=args.world_size, rank=rank, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler)

    n_val, world = len(val_set), args.world_size
    own = n_val // world + (1 if rank < n_val % world else 0)  # this rank's images, repeats excluded
    weight = own * world / n_val  # 1 for every rank when the shards split N evenly

    model = WideResNet(args.widen_factor).to(device)
    if args.sync_bn and use_cuda:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    t0 = time.time()
    on_target = 0
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        t_epoch = time.time()
        images = train_one_epoch(model, train_loader, optimizer, device)
        dist.barrier()
        epoch_time = time.time() - t_epoch

        # the average of the ranks' images/sec, times the number of ranks, is their sum
        speed = torch.tensor(images / epoch_time, device=device)
        dist.all_reduce(speed, op=dist.ReduceOp.AVG)
        images_per_sec = speed.item() * world

        loss, acc = shard_means(model, val_loader, own, device)
        metrics = torch.tensor([loss * weight, acc * weight], dtype=torch.float64, device=device)
        dist.all_reduce(metrics, op=dist.ReduceOp.AVG)
        val_loss, val_acc = metrics.tolist()

        if rank == 0:
            print(f"Epoch {epoch}/{args.epochs} - {time.time() - t0:.0f}s - epoch {epoch_time:.2f}s - "
                  f"{images_per_sec:.1f} samples/s - val_loss: {val_loss:.4f} - val_accuracy: {val_acc:.4f}",
                  flush=True)
        on_target = on_target + 1 if val_acc >= args.target_accuracy else 0
        if on_target >= args.patience:
            break

    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--base-lr", type=float, default=0.01)
    parser.add_argument("--target-accuracy", type=float, default=0.85)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--widen-factor", type=int, default=10)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--node-id", type=int, default=0)
    parser.add_argument("--num-gpus", type=int, default=1)
    parser.add_argument("--master-addr", default="localhost")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--sync-bn", action="store_true")
    args = parser.parse_args()
    args.world_size = args.num_nodes * args.num_gpus
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    mp.spawn(worker, args=(args,), nprocs=args.num_gpus)


if __name__ == "__main__":
    main()
