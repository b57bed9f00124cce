"""Data-parallel WideResNet on Fashion-MNIST (PyTorch DDP).

Training drops the ragged ends: the training sampler drops the tail that does not split
evenly over the processes, and the training loader drops each shard's last, short batch,
so every step of every process sees a full batch. Validation drops nothing: every image
is evaluated and counted once.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


def conv_unit(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    def __init__(self, cin, cout, dropout=0.1):
        super().__init__()
        self.body = nn.Sequential(conv_unit(cin, cout), nn.Dropout(dropout), conv_unit(cout, cout))
        self.shortcut = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, kernel_size=1, bias=False)

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        w1, w2, w3 = 16 * widen_factor, 32 * widen_factor, 64 * widen_factor
        self.features = nn.Sequential(
            conv_unit(1, 16),
            ResidualBlock(16, w1), ResidualBlock(w1, w1), nn.MaxPool2d(2),
            ResidualBlock(w1, w2), ResidualBlock(w2, w2), nn.MaxPool2d(2),
            ResidualBlock(w2, w3), ResidualBlock(w3, w3),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(w3, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def build_parser():
    parser = argparse.ArgumentParser(description="Fashion-MNIST with DistributedDataParallel")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch and process")
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
    return parser


def load(data_dir, download):
    tf = transforms.ToTensor()
    train = datasets.FashionMNIST(data_dir, train=True, download=download, transform=tf)
    val = datasets.FashionMNIST(data_dir, train=False, download=download, transform=tf)
    return train, val


def worker(local_rank, args):
    rank = args.node_id * args.num_gpus + local_rank
    world_size = args.world_size
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                            rank=rank, world_size=world_size)

    if local_rank == 0:
        train_set, val_set = load(args.data_dir, download=True)
    dist.barrier()
    if local_rank != 0:
        train_set, val_set = load(args.data_dir, download=False)

    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                       drop_last=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler, drop_last=True,
                              pin_memory=device.type == "cuda")
    val_sampler = DistributedSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler)

    # Validation must not drop: its sampler pads instead. Shard r holds entries r, r + W, ...
    # of a list padded to a multiple of W; its last entry is a repeat when it lies past the end.
    own_val = len(val_sampler) - int((len(val_sampler) - 1) * world_size + rank >= len(val_set))

    model = WideResNet(args.widen_factor).to(device)
    if args.sync_bn and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    start = time.monotonic()
    in_a_row = 0
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        model.train()
        epoch_start = time.monotonic()
        trained = 0
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            trained += labels.shape[0]
        dist.barrier()
        epoch_time = time.monotonic() - epoch_start
        rate = torch.tensor([trained / epoch_time], device=device)
        dist.reduce(rate, dst=0, op=dist.ReduceOp.SUM)

        model.eval()
        loss_sum, correct, seen = 0.0, 0, 0
        with torch.no_grad():
            for images, labels in val_loader:
                logits = model(images.to(device))
                labels = labels.to(device)
                n = min(len(labels), own_val - seen)
                if n > 0:
                    loss_sum += nn.functional.cross_entropy(logits[:n], labels[:n], reduction="sum").item()
                    correct += int((logits[:n].argmax(dim=1) == labels[:n]).sum())
                    seen += n
        everyone = [None] * world_size
        dist.all_gather_object(everyone, (loss_sum, correct, seen))
        total_loss, total_correct, total_seen = (sum(column) for column in zip(*everyone))
        val_loss, val_accuracy = total_loss / total_seen, total_correct / total_seen

        if rank == 0:
            print(f"Epoch {epoch}: {time.monotonic() - start:.1f}s total, {epoch_time:.2f}s this epoch, "
                  f"{rate.item():.1f} images/s (all ranks), validation loss {val_loss:.4f} "
                  f"accuracy {val_accuracy:.4f}", flush=True)

        in_a_row = in_a_row + 1 if val_accuracy >= args.target_accuracy else 0
        if in_a_row >= args.patience:
            if rank == 0:
                print(f"Stopping: validation accuracy >= {args.target_accuracy} for {args.patience} epochs")
            break

    dist.destroy_process_group()


if __name__ == "__main__":
    args = build_parser().parse_args()
    args.world_size = args.num_nodes * args.num_gpus
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    mp.spawn(worker, args=(args,), nprocs=args.num_gpus)
