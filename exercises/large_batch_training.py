"""Train a WideResNet on Fashion-MNIST with large batches: the finished lab under torchrun, plus
a log to measure it by and a plan of your own for training with a larger batch.

This is solutions/fashion_mnist_torchrun.py with three additions (notebooks 17-19):
- --log-file: rank 0 writes one JSON line per epoch (time, images, images/sec, loss, accuracy,
  world size, batch, learning rate), which the notebooks read. Nobody parses printed lines.
- --large-batch: train with your plan (notebook 19): LARGE_BATCH images per process and step,
  and the learning rate large_batch_lr gives for every optimizer step.
- --seed: the same initial weights and dropout on every run, so that two plans can be compared.

    torchrun --standalone --nproc-per-node 2 large_batch_training.py --widen-factor 1 --epochs 4 \
        --large-batch --seed 0 --log-file runs/mine.jsonl
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor

# Step 0: import the distributed package as `dist` (it comes with PyTorch).
import torch.distributed as dist


def conv_unit(in_channels, out_channels):
    """A 3x3 convolution, then BatchNorm, then ReLU: the network's building brick."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ResidualBlock(nn.Module):
    """Two conv units with a little dropout between them, and a shortcut around both."""

    def __init__(self, in_channels, out_channels, dropout=0.1):
        super().__init__()
        self.body = nn.Sequential(
            conv_unit(in_channels, out_channels),
            nn.Dropout(dropout),
            conv_unit(out_channels, out_channels),
        )
        # Where the width changes, a 1x1 convolution makes the shortcut as wide as the body.
        if in_channels == out_channels:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False)

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Module):
    """Six residual blocks, 16k to 64k channels wide (k = widen_factor).

    k = 10 is the full model (about 17 M parameters); k = 1 trains in seconds on a CPU.
    """

    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        w1, w2, w3 = 16 * widen_factor, 32 * widen_factor, 64 * widen_factor
        self.features = nn.Sequential(
            conv_unit(1, 16),
            ResidualBlock(16, w1),
            ResidualBlock(w1, w1),
            nn.MaxPool2d(2),  # 28x28 -> 14x14
            ResidualBlock(w1, w2),
            ResidualBlock(w2, w2),
            nn.MaxPool2d(2),  # 14x14 -> 7x7
            ResidualBlock(w2, w3),
            ResidualBlock(w3, w3),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(w3, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def load_datasets(data_dir, download):
    """Fashion-MNIST's training and validation sets, read from data_dir/FashionMNIST/raw/.

    With download=True the files are fetched first if they are not there yet.
    """
    try:
        train_set = FashionMNIST(data_dir, train=True, download=download, transform=ToTensor())
        val_set = FashionMNIST(data_dir, train=False, download=download, transform=ToTensor())
    except (OSError, RuntimeError) as err:  # no network, a folder we cannot write, no files
        reason = str(err).strip().splitlines()[-1]
        sys.exit(f"error: no Fashion-MNIST in {data_dir}/FashionMNIST/raw/ and no way to get it ({reason}). "
                 "Put the four *-ubyte.gz files from github.com/zalandoresearch/fashion-mnist there, "
                 "or make a synthetic stand-in with `make synthetic-data` and use --data-dir data/synthetic.")
    if download and os.path.exists(os.path.join(data_dir, "FashionMNIST", "raw", "SYNTHETIC_STAND_IN.txt")):
        print(f"NOTE: {data_dir} holds a synthetic stand-in for Fashion-MNIST, not the real data set.")
    return train_set, val_set


# TODO large_batch: your plan for notebook 19's task. With --large-batch, this script trains
# with LARGE_BATCH images per process in each step, and optimizer step `step` (0, 1, 2, ...,
# counted over the whole run) uses the rate large_batch_lr(step, steps_per_epoch, world_size).
# The task: with 2 processes and a batch of at least 32 per process, reach a validation accuracy
# of 0.8 within 4 epochs, as notebook 19's check runs it (the stand-in data, --widen-factor 1,
# --seed 0). Every rate must be a number above 0.
LARGE_BATCH = 16  # images per process and step: the global batch is world_size times this


def large_batch_lr(step, steps_per_epoch, world_size):
    """The learning rate of optimizer step `step` (0, 1, 2, ...) in a run of `world_size`
    processes whose epochs are `steps_per_epoch` steps long."""
    return 0.02  # the reference's rate: one process, batch 16


def train_one_epoch(model, loader, optimizer, device, lr_at, step):
    """One pass over `loader`, with the learning rate lr_at(step) in optimizer step `step`.

    Returns how many images it trained on and the number of the next step.
    """
    model.train()
    num_images = 0
    for images, labels in loader:
        for group in optimizer.param_groups:  # this step's learning rate
            group["lr"] = lr_at(step)
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        num_images += len(labels)
        step += 1
    return num_images, step


@torch.no_grad()
def evaluate(model, loader, device, max_images=None):
    """Sum of the losses, number of correct answers and number of images, as one tensor.

    If max_images is given, only the loader's first max_images images are counted.
    """
    model.eval()
    totals = torch.zeros(3, device=device)
    seen = 0
    for images, labels in loader:
        outputs, labels = model(images.to(device)), labels.to(device)
        keep = len(labels) if max_images is None else max(0, min(len(labels), max_images - seen))
        outputs, labels = outputs[:keep], labels[:keep]
        seen += keep
        totals[0] += F.cross_entropy(outputs, labels, reduction="sum")
        totals[1] += (outputs.argmax(dim=1) == labels).sum()
        totals[2] += keep
    return totals


# torchrun runs this script once per process: worker() runs once, with this process's local rank.
def worker(local_rank, args):
    # torchrun: the global rank and the world size come from the environment, and so does the
    # address of rank 0: init_process_group reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    # itself (init_method "env://", the default) when it is given no rank and no world size.
    rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))  # give up rather than wait forever
    except dist.DistError as err:  # a node that never came: one line, not a traceback
        sys.exit(f"error: rank {rank} could not join the process group ({str(err).strip().splitlines()[0]})")

    # Step 5: let only local rank 0 download (download=True); then dist.barrier(), so
    # that the other processes of this node read the files only once they are complete.
    if local_rank == 0:
        train_set, val_set = load_datasets(args.data_dir, download=True)
    dist.barrier()  # everyone waits here until the files are on disk
    if local_rank != 0:
        train_set, val_set = load_datasets(args.data_dir, download=False)

    # Step 6: give each process its own share of the data: build a DistributedSampler
    # (num_replicas=args.world_size, rank=rank) for each set and pass it to its DataLoader
    # as sampler= (a loader with a sampler must not shuffle: the training sampler does).
    train_sampler = torch.utils.data.DistributedSampler(
        train_set, num_replicas=args.world_size, rank=rank, shuffle=True)
    val_sampler = torch.utils.data.DistributedSampler(
        val_set, num_replicas=args.world_size, rank=rank, shuffle=False)
    batch_size = LARGE_BATCH if args.large_batch else args.batch_size
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=batch_size, sampler=val_sampler)

    # Step 7: pin this process to its own device: cuda:local_rank on a GPU machine.
    # (On the CPU, give each process its share of the cores with torch.set_num_threads.)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    if args.seed is not None:  # the same initial weights (and dropout masks) on every run
        torch.manual_seed(args.seed)
    model = WideResNet(args.widen_factor).to(device)
    # Optional: with --sync-bn, turn every BatchNorm into a SyncBatchNorm
    # (nn.SyncBatchNorm.convert_sync_batchnorm). It works on GPUs only.
    if args.sync_bn and torch.cuda.is_available():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif args.sync_bn and rank == 0:
        print("--sync-bn: SyncBatchNorm needs GPUs; going on with per-process BatchNorm")
    # Step 7: wrap the model in nn.parallel.DistributedDataParallel, after it is on its
    # device (device_ids=[local_rank] on a GPU; leave device_ids out on the CPU).
    model = nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if torch.cuda.is_available() else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr)

    # TODO lr_scaling: contract: with --large-batch, every optimizer step of every rank uses the
    # rate large_batch_lr gives for that step (with this run's world size and its epochs' length).
    # Without --large-batch, every step uses --base-lr.
    lr_at = lambda step: args.base_lr  # noqa: E731

    start = time.time()
    step = 0
    epochs_at_target = 0
    for epoch in range(1, args.epochs + 1):
        # Step 6.5: call train_sampler.set_epoch(epoch), so that every epoch is shuffled anew.
        train_sampler.set_epoch(epoch)
        epoch_start = time.time()
        num_images, step = train_one_epoch(model, train_loader, optimizer, device, lr_at, step)
        # Step 8: wait for every process (dist.barrier) before taking the time, then sum
        # the images/sec of all processes onto rank 0 (a tensor on `device`, and dist.reduce).
        dist.barrier()  # the epoch is over when the slowest process is done
        epoch_time = time.time() - epoch_start
        rate = torch.tensor(num_images / epoch_time, device=device)
        dist.reduce(rate, dst=0, op=dist.ReduceOp.SUM)
        images_per_sec = rate.item()

        # Step 9: every process validated only its share. Count each image once (the
        # sampler pads shards with repeats: max_images=len(range(rank, len(val_set), args.world_size))),
        # add up the totals of all processes with dist.all_reduce, and print on global rank 0 only.
        own_images = len(range(rank, len(val_set), args.world_size))
        totals = evaluate(model, val_loader, device, max_images=own_images)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)  # every rank gets the same totals
        val_loss, val_accuracy = (totals[:2] / totals[2]).tolist()
        epochs_at_target = epochs_at_target + 1 if val_accuracy >= args.target_accuracy else 0
        done = epochs_at_target >= args.patience
        if rank == 0:
            print(f"epoch {epoch:3d} | time {datetime.timedelta(seconds=round(time.time() - start))} "
                  f"| epoch time {epoch_time:6.2f} s | images/sec {images_per_sec:9.1f} "
                  f"| val loss {val_loss:.4f} | val accuracy {val_accuracy:.4f}", flush=True)
            if done:
                print(f"validation accuracy at or above {args.target_accuracy} for {args.patience} epochs: stopping")
            if args.log_file:  # one JSON line per epoch, for the notebooks to read
                record = {"epoch": epoch, "steps": step, "epoch_time": epoch_time, "elapsed": time.time() - start,
                          "images": num_images * args.world_size, "images_per_sec": images_per_sec,
                          "val_loss": val_loss, "val_accuracy": val_accuracy, "world_size": args.world_size,
                          "batch_size": batch_size, "global_batch": batch_size * args.world_size,
                          "lr": optimizer.param_groups[0]["lr"]}
                with open(args.log_file, "a") as log:
                    log.write(json.dumps(record) + "\n")

        if done:  # after Step 9 every rank sees the same accuracy, so all stop together
            break
    # Step 4: leave the process group (dist.destroy_process_group()) when training is over.
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description="Train a WideResNet on Fashion-MNIST.")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch (per process once distributed)")
    parser.add_argument("--epochs", type=int, default=40, help="the most epochs to train")
    parser.add_argument("--base-lr", type=float, default=0.01, help="learning rate of SGD")
    parser.add_argument("--target-accuracy", type=float, default=0.85, help="validation accuracy to reach")
    parser.add_argument("--patience", type=int, default=2,
                        help="stop once validation accuracy has been at the target for this many epochs in a row")
    parser.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"),
                        help="where Fashion-MNIST is, or goes (default: $DDP_LAB_DATA_DIR, else ./data)")
    parser.add_argument("--widen-factor", type=int, default=10,
                        help="width k of the WideResNet: 10 is the full model, 1 a small one for CPUs")
    # torchrun: no layout options: torchrun's own (--nnodes, --node-rank, --nproc-per-node,
    # --rdzv-endpoint) say how many processes run where.
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for the other processes, at the start and in each collective")
    # Optional: add a --sync-bn flag (action="store_true").
    parser.add_argument("--sync-bn", action="store_true", help="synchronise BatchNorm statistics across GPUs")
    parser.add_argument("--large-batch", action="store_true",
                        help="train with LARGE_BATCH images per process and the rates of large_batch_lr (notebook 19)")
    parser.add_argument("--seed", type=int, help="seed of the initial weights and of dropout (default: a new one each run)")
    parser.add_argument("--log-file", help="append one JSON line per epoch to this file (rank 0)")
    args = parser.parse_args()

    # torchrun: refuse to run without it, in one line (the environment it sets is missing).
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        parser.error("start me with torchrun, e.g. torchrun --standalone --nproc-per-node 2 "
                     f"{os.path.basename(sys.argv[0])} (it sets RANK, LOCAL_RANK and WORLD_SIZE)")
    if torch.cuda.is_available() and int(os.environ["LOCAL_RANK"]) >= torch.cuda.device_count():
        parser.error(f"this node has {torch.cuda.device_count()} GPU(s): give torchrun --nproc-per-node "
                     f"{torch.cuda.device_count()} or fewer")

    # torchrun has started this process already: no mp.spawn, one worker per process.
    worker(int(os.environ["LOCAL_RANK"]), args)

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted")
