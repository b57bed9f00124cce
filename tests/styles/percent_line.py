"""Fashion-MNIST with a WideResNet on several GPUs / nodes (DistributedDataParallel).

Prints one line per epoch, e.g.
    [epoch 1/40] 00:00:12 elapsed | 4.3s | 148.5 img/s | loss=0.6121 acc=78.34%
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
import torchvision
import torchvision.transforms as T


class ConvUnit(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.branch = nn.Sequential(ConvUnit(cin, cout), nn.Dropout(0.1), ConvUnit(cout, cout))
        self.skip = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x):
        return self.branch(x) + self.skip(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        chans = [16] + [base * widen_factor for base in (16, 16, 32, 32, 64, 64)]
        layers = [ConvUnit(1, 16)]
        for i in range(6):
            if i in (2, 4):
                layers.append(nn.MaxPool2d(2))
            layers.append(Residual(chans[i], chans[i + 1]))
        self.trunk = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(chans[-1], num_classes)

    def forward(self, x):
        return self.fc(self.trunk(x))


def run_epoch(model, loader, device, optimizer=None, limit=None):
    """Train (with an optimizer) or evaluate (without) over the loader.

    Returns a tensor [summed loss, correct, images]; `limit` counts only the first images.
    """
    training = optimizer is not None
    model.train(training)
    totals = torch.zeros(3, device=device)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    with torch.set_grad_enabled(training):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            if training:
                loss = criterion(logits, y) / len(y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                totals[2] += len(y)
                continue
            if limit is not None:
                keep = max(0, min(len(y), limit - int(totals[2])))
                logits, y = logits[:keep], y[:keep]
            totals[0] += criterion(logits, y)
            totals[1] += (logits.argmax(1) == y).sum()
            totals[2] += len(y)
    return totals


def worker(local_rank, args):
    global_rank = args.node_id * args.num_gpus + local_rank
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo", world_size=args.world_size, rank=global_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    def fmnist(train, download):
        return torchvision.datasets.FashionMNIST(args.data_dir, train=train, download=download, transform=T.ToTensor())

    if local_rank == 0:  # one download per node
        train_ds, val_ds = fmnist(True, download=True), fmnist(False, download=True)
    dist.barrier()
    if local_rank != 0:
        train_ds, val_ds = fmnist(True, download=False), fmnist(False, download=False)

    train_sampler = DistributedSampler(train_ds, num_replicas=args.world_size, rank=global_rank, shuffle=True)
    val_sampler = DistributedSampler(val_ds, num_replicas=args.world_size, rank=global_rank, shuffle=False)
    train_dl = DataLoader(train_ds, batch_size=args.batch_size, sampler=train_sampler)
    val_dl = DataLoader(val_ds, batch_size=args.batch_size, sampler=val_sampler)
    # images of the validation set that are this rank's (the sampler pads with repeats)
    my_val = len(range(global_rank, len(val_ds), args.world_size))

    model = WideResNet(args.widen_factor).to(device)
    if cuda and args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    t_start = time.time()
    consecutive = 0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        t_epoch = time.time()
        trained = run_epoch(model, train_dl, device, optimizer)
        dist.barrier()
        secs = time.time() - t_epoch
        speed = torch.tensor(trained[2].item() / secs, device=device)
        dist.all_reduce(speed, op=dist.ReduceOp.SUM)

        mine = run_epoch(model, val_dl, device, limit=my_val)
        parts = [torch.zeros_like(mine) for _ in range(args.world_size)]
        dist.all_gather(parts, mine)
        loss_sum, correct, count = torch.stack(parts).sum(dim=0).tolist()
        val_loss, val_acc = loss_sum / count, correct / count

        if global_rank == 0:
            elapsed = time.strftime("%H:%M:%S", time.gmtime(time.time() - t_start))
            print(f"[epoch {epoch + 1}/{args.epochs}] {elapsed} elapsed | {secs:.1f}s | {speed.item():.1f} img/s "
                  f"| loss={val_loss:.4f} acc={100 * val_acc:.2f}%", flush=True)

        consecutive = consecutive + 1 if val_acc >= args.target_accuracy else 0
        if consecutive >= args.patience:
            if global_rank == 0:
                print(f"target {100 * args.target_accuracy:.1f}% reached {args.patience} epochs running: done")
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
