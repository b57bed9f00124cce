"""Fashion-MNIST WideResNet trainer, one process per GPU (DDP).

main() works out the world size and hands it to every process along with the arguments:
mp.spawn(train_process, args=(world_size, args)) calls train_process(local_rank, world_size, args).
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
import torch.utils.data as tud
import torchvision


def _conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True))


class _Unit(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.a = _conv(cin, cout)
        self.d = nn.Dropout(0.1)
        self.b = _conv(cout, cout)
        self.s = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x):
        return self.b(self.d(self.a(x))) + self.s(x)


class WideResNet(nn.Module):
    def __init__(self, widen_factor=10):
        super().__init__()
        c1, c2, c3 = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.f = nn.Sequential(_conv(1, 16), _Unit(16, c1), _Unit(c1, c1), nn.MaxPool2d(2),
                               _Unit(c1, c2), _Unit(c2, c2), nn.MaxPool2d(2),
                               _Unit(c2, c3), _Unit(c3, c3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out = nn.Linear(c3, 10)

    def forward(self, x):
        return self.out(self.f(x))


def datasets(root, download):
    tf = torchvision.transforms.ToTensor()
    return (torchvision.datasets.FashionMNIST(root, train=True, transform=tf, download=download),
            torchvision.datasets.FashionMNIST(root, train=False, transform=tf, download=download))


def train_process(local_rank, world_size, args):
    gpu = torch.cuda.is_available()
    rank = args.node_id * args.num_gpus + local_rank
    if gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if gpu else "gloo", init_method="env://",
                            world_size=world_size, rank=rank)
    dev = torch.device("cuda", local_rank) if gpu else torch.device("cpu")

    if local_rank == 0:
        train_ds, val_ds = datasets(args.data_dir, download=True)
    dist.barrier()
    if local_rank > 0:
        train_ds, val_ds = datasets(args.data_dir, download=False)

    tr_sampler = tud.distributed.DistributedSampler(train_ds, world_size, rank, shuffle=True)
    va_sampler = tud.distributed.DistributedSampler(val_ds, world_size, rank, shuffle=False)
    tr_loader = tud.DataLoader(train_ds, batch_size=args.batch_size, sampler=tr_sampler)
    va_loader = tud.DataLoader(val_ds, batch_size=args.batch_size, sampler=va_sampler)

    model = WideResNet(args.widen_factor).to(dev)
    if gpu and args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    sgd = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    # rank r validates images r, r + W, r + 2W, ... < N (and maybe one repeat after them)
    val_own = math.ceil((len(val_ds) - rank) / world_size)

    t_begin = time.time()
    hits = 0
    for ep in range(args.epochs):
        tr_sampler.set_epoch(ep)
        model.train()
        t_ep = time.time()
        n_train = 0
        for xb, yb in tr_loader:
            xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            sgd.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            sgd.step()
            n_train += xb.shape[0]
        dist.barrier()
        ep_time = time.time() - t_ep
        # every rank trained for the same (barrier-ended) time: the images of all ranks over
        # that time is the sum of their images/sec
        n_all = torch.tensor([n_train], dtype=torch.float32, device=dev)
        dist.reduce(n_all, 0)
        throughput = n_all.item() / ep_time

        model.eval()
        loss_sum = torch.zeros((), device=dev)
        n_right = torch.zeros((), device=dev)
        idx = 0
        with torch.no_grad():
            for xb, yb in va_loader:
                xb, yb = xb.to(dev), yb.to(dev)
                logits = model(xb)
                mask = torch.arange(idx, idx + len(yb), device=dev) < val_own
                idx += len(yb)
                loss_sum += F.cross_entropy(logits, yb, reduction="none")[mask].sum()
                n_right += (logits.argmax(-1) == yb)[mask].sum()
        result = torch.stack([loss_sum, n_right, torch.tensor(float(val_own), device=dev)])
        dist.all_reduce(result, op=dist.ReduceOp.SUM)
        v_loss, v_acc = (result[0] / result[2]).item(), (result[1] / result[2]).item()

        hits = hits + 1 if v_acc >= args.target_accuracy else 0
        if rank == 0:
            print(f"epoch={ep + 1} elapsed={time.time() - t_begin:.1f}s epoch_time={ep_time:.2f}s "
                  f"throughput={throughput:.1f}img/s val_loss={v_loss:.4f} val_acc={v_acc:.4f}", flush=True)
        if hits >= args.patience:
            break

    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--base-lr", type=float, default=0.01)
    ap.add_argument("--target-accuracy", type=float, default=0.85)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--data-dir", default="./data")
    ap.add_argument("--widen-factor", type=int, default=10)
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--node-id", type=int, default=0)
    ap.add_argument("--num-gpus", type=int, default=1)
    ap.add_argument("--master-addr", default="localhost")
    ap.add_argument("--master-port", type=int, default=29500)
    ap.add_argument("--sync-bn", action="store_true")
    args = ap.parse_args()

    world_size = args.num_nodes * args.num_gpus
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    mp.spawn(train_process, args=(world_size, args), nprocs=args.num_gpus)


if __name__ == "__main__":
    main()
