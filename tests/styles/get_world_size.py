"""Fashion-MNIST on a WideResNet with DistributedDataParallel.

Nothing here stores the world size: the process group knows it, so every process asks
dist.get_world_size() (and dist.get_rank()) once it has joined.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


class Block(nn.Module):
    """conv-bn-relu, dropout, conv-bn-relu, plus a (1x1 conv if the width changes) shortcut."""

    def __init__(self, c_in, c_out, p_drop=0.1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.drop = nn.Dropout(p_drop)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = nn.Identity() if c_in == c_out else nn.Conv2d(c_in, c_out, 1, bias=False)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(self.drop(y))))
        return y + self.skip(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        k = widen_factor
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.stage1 = nn.Sequential(Block(16, 16 * k), Block(16 * k, 16 * k))
        self.stage2 = nn.Sequential(Block(16 * k, 32 * k), Block(32 * k, 32 * k))
        self.stage3 = nn.Sequential(Block(32 * k, 64 * k), Block(64 * k, 64 * k))
        self.head = nn.Linear(64 * k, num_classes)

    def forward(self, x):
        x = self.stage1(self.stem(x))
        x = self.stage2(F.max_pool2d(x, 2))
        x = self.stage3(F.max_pool2d(x, 2))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--base-lr", type=float, default=0.01)
    p.add_argument("--target-accuracy", type=float, default=0.85)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--widen-factor", type=int, default=10)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--node-id", type=int, default=0)
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--master-addr", default="localhost")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--sync-bn", action="store_true")
    return p.parse_args()


def fashion_mnist(root, train, download):
    return datasets.FashionMNIST(root, train=train, download=download, transform=transforms.ToTensor())


@torch.no_grad()
def per_image_results(model, loader, device):
    """(loss, 1 if right else 0) for every image the loader gives, in the loader's order."""
    model.eval()
    rows = []
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        rows.append(torch.stack([F.cross_entropy(logits, y, reduction="none"),
                                 (logits.argmax(1) == y).float()], dim=1))
    return torch.cat(rows)


def global_metrics(model, loader, device):
    """Loss and accuracy over the whole validation set.

    Every rank's shard has the same length (the sampler pads the last ones with repeats of
    the first images), so all_gather can collect them. Unshuffled, rank r holds entries
    r, r + W, r + 2W, ... of the padded list: interleaving the shards gives the list back,
    and its first len(dataset) entries are every image exactly once.
    """
    mine = per_image_results(model, loader, device)
    shards = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(shards, mine)
    in_order = torch.stack(shards, dim=1).reshape(-1, 2)[:len(loader.dataset)]
    loss, accuracy = in_order.mean(dim=0).tolist()
    return loss, accuracy


def worker(local_rank, args):
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if on_gpu else "gloo",
                            rank=args.node_id * args.num_gpus + local_rank,
                            world_size=args.num_nodes * args.num_gpus)
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")

    # local rank 0 fetches the files for this node; the rest wait for it
    if local_rank == 0:
        train_data = fashion_mnist(args.data_dir, True, download=True)
        val_data = fashion_mnist(args.data_dir, False, download=True)
    dist.barrier()
    if local_rank != 0:
        train_data = fashion_mnist(args.data_dir, True, download=False)
        val_data = fashion_mnist(args.data_dir, False, download=False)

    # num_replicas and rank default to the process group's
    train_sampler = DistributedSampler(train_data)
    val_sampler = DistributedSampler(val_data, shuffle=False)
    train_loader = DataLoader(train_data, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_data, batch_size=args.batch_size, sampler=val_sampler)

    net = WideResNet(args.widen_factor).to(device)
    if args.sync_bn:
        if on_gpu:
            net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
        elif rank == 0:
            print("note: --sync-bn ignored, SyncBatchNorm needs GPUs")
    net = nn.parallel.DistributedDataParallel(net, device_ids=[local_rank] if on_gpu else None)
    opt = torch.optim.SGD(net.parameters(), lr=args.base_lr)

    t_start = time.time()
    good_epochs = 0
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        net.train()
        t_epoch = time.time()
        n_images = 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
            n_images += y.numel()
        dist.barrier()
        seconds = time.time() - t_epoch

        throughput = torch.tensor([n_images / seconds], device=device)
        dist.all_reduce(throughput)  # SUM: the whole world's images/sec, on every rank

        val_loss, val_acc = global_metrics(net, val_loader, device)
        good_epochs = good_epochs + 1 if val_acc >= args.target_accuracy else 0
        if rank == 0:
            print(f"epoch {epoch} done after {time.time() - t_start:.1f} s (this epoch {seconds:.2f} s): "
                  f"{throughput.item():.1f} images/s, validation loss {val_loss:.4f}, accuracy {val_acc:.4f}",
                  flush=True)
        if good_epochs >= args.patience:
            if rank == 0:
                print(f"reached {args.target_accuracy} for {args.patience} epochs in a row, stopping")
            break

    dist.destroy_process_group()


def main():
    args = get_args()
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    mp.spawn(worker, args=(args,), nprocs=args.num_gpus)


if __name__ == "__main__":
    main()
