"""WideResNet on Fashion-MNIST, multi-GPU / multi-node, following the shape of PyTorch's
"Getting Started with Distributed Data Parallel" tutorial: setup() / cleanup() around the
per-process function, and a run_demo() that spawns it."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
import torchvision
from torchvision import transforms


def setup(rank, world_size):
    # MASTER_ADDR and MASTER_PORT are set by main() from the command line
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    # initialize the process group
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ConvBNReLU(nn.Sequential):
    def __init__(self, in_planes, out_planes):
        super().__init__(nn.Conv2d(in_planes, out_planes, kernel_size=3, padding=1, bias=False),
                         nn.BatchNorm2d(out_planes), nn.ReLU(inplace=True))


class WideBlock(nn.Module):
    def __init__(self, in_planes, out_planes, dropout=0.1):
        super().__init__()
        self.first = ConvBNReLU(in_planes, out_planes)
        self.dropout = nn.Dropout(dropout)
        self.second = ConvBNReLU(out_planes, out_planes)
        self.shortcut = (nn.Identity() if in_planes == out_planes
                         else nn.Conv2d(in_planes, out_planes, kernel_size=1, bias=False))

    def forward(self, x):
        return self.second(self.dropout(self.first(x))) + self.shortcut(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        w = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.body = nn.Sequential(
            ConvBNReLU(1, 16),
            WideBlock(16, w[0]), WideBlock(w[0], w[0]), nn.MaxPool2d(2),
            WideBlock(w[0], w[1]), WideBlock(w[1], w[1]), nn.MaxPool2d(2),
            WideBlock(w[1], w[2]), WideBlock(w[2], w[2]),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(w[2], num_classes)

    def forward(self, x):
        return self.fc(self.body(x))


def demo_fashion_mnist(local_rank, args):
    rank = args.node_id * args.num_gpus + local_rank
    print(f"Running DDP on rank {rank} (local rank {local_rank}).")
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before setup(), so that NCCL uses this GPU
    setup(rank, args.world_size)
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    to_tensor = transforms.ToTensor()
    if local_rank == 0:
        trainset = torchvision.datasets.FashionMNIST(root=args.data_dir, train=True, download=True,
                                                     transform=to_tensor)
        valset = torchvision.datasets.FashionMNIST(root=args.data_dir, train=False, download=True,
                                                   transform=to_tensor)
        dist.barrier()
    else:
        dist.barrier()  # wait for local rank 0's download
        trainset = torchvision.datasets.FashionMNIST(root=args.data_dir, train=True, download=False,
                                                     transform=to_tensor)
        valset = torchvision.datasets.FashionMNIST(root=args.data_dir, train=False, download=False,
                                                   transform=to_tensor)

    train_sampler = DistributedSampler(trainset, num_replicas=args.world_size, rank=rank)
    val_sampler = DistributedSampler(valset, num_replicas=args.world_size, rank=rank, shuffle=False)
    trainloader = DataLoader(trainset, batch_size=args.batch_size, sampler=train_sampler)
    valloader = DataLoader(valset, batch_size=args.batch_size, sampler=val_sampler)

    # create model and move it to its device
    model = WideResNet(args.widen_factor).to(device)
    if args.sync_bn and torch.cuda.is_available():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp_model = DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None)

    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=args.base_lr)

    # Unshuffled, this rank sees images rank, rank + W, rank + 2W, ... and then a repeat
    # if the set does not split evenly: only the first ceil((N - rank) / W) are its own.
    my_val_images = (len(valset) - rank + args.world_size - 1) // args.world_size

    t0 = time.time()
    epochs_on_target = 0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        ddp_model.train()
        epoch_t0 = time.time()
        seen = 0
        for data, target in trainloader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            outputs = ddp_model(data)
            loss_fn(outputs, target).backward()
            optimizer.step()
            seen += len(target)
        dist.barrier()
        epoch_time = time.time() - epoch_t0
        img_per_sec = torch.tensor(seen / epoch_time, device=device)
        dist.reduce(img_per_sec, dst=0)

        ddp_model.eval()
        stats = torch.zeros(3, device=device)  # loss sum, correct, images
        counted = 0
        with torch.no_grad():
            for data, target in valloader:
                data, target = data.to(device), target.to(device)
                outputs = ddp_model(data)
                n = max(0, min(len(target), my_val_images - counted))
                counted += n
                stats[0] += nn.functional.cross_entropy(outputs[:n], target[:n], reduction="sum")
                stats[1] += (outputs[:n].argmax(1) == target[:n]).sum()
                stats[2] += n
        dist.all_reduce(stats)
        val_loss = stats[0].item() / stats[2].item()
        val_acc = stats[1].item() / stats[2].item()

        if rank == 0:
            print(f"Epoch {epoch + 1:03d} | elapsed {time.time() - t0:7.1f}s | epoch {epoch_time:.2f}s "
                  f"| {img_per_sec.item():.1f} images/sec | val loss {val_loss:.4f} | val acc {val_acc:.4f}")

        epochs_on_target = epochs_on_target + 1 if val_acc >= args.target_accuracy else 0
        if epochs_on_target >= args.patience:
            break

    cleanup()


def run_demo(demo_fn, args):
    mp.spawn(demo_fn, args=(args,), nprocs=args.num_gpus, join=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--base-lr", type=float, default=0.01)
    parser.add_argument("--target-accuracy", type=float, default=0.85)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--data-dir", type=str, default="./data")
    parser.add_argument("--widen-factor", type=int, default=10)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--node-id", type=int, default=0)
    parser.add_argument("--num-gpus", type=int, default=1)
    parser.add_argument("--master-addr", type=str, default="localhost")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--sync-bn", action="store_true")
    args = parser.parse_args()

    args.world_size = args.num_nodes * args.num_gpus
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    run_demo(demo_fashion_mnist, args)
