"""Train a WideResNet to classify Fashion-MNIST images: the finished lab, to be launched by torchrun.

This is the lab's finished script (solutions/fashion_mnist_after_step_10.py), which starts its
own processes with mp.spawn. Change it where it says `# TODO torchrun`, so that torchrun starts
the processes instead (notebook 14). Or start from your own: copy your finished fashion_mnist.py
over this file. When it is done, this runs on one machine with 2 processes:

    torchrun --standalone --nproc-per-node 2 exercises/fashion_mnist_torchrun.py --epochs 5
"""
import argparse
import datetime
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
# Step 2: import socket, to check below that node 0's port is free.
import socket
# Step 10: import torch.multiprocessing as `mp`, to start one process per GPU.
import torch.multiprocessing as mp


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


def train_one_epoch(model, loader, optimizer, device):
    """One pass over `loader`; returns how many images it trained on."""
    model.train()
    num_images = 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        num_images += len(labels)
    return num_images


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


# Step 3: turn train(args) into worker(local_rank, args), the function each process runs.
def worker(local_rank, args):
    # TODO torchrun: torchrun, not this script, decides how many processes run where, and tells
    # each process its place in its environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
    # MASTER_PORT: notebook 14 prints them). Contract: for any --nnodes and --nproc-per-node,
    # this process joins the group as the global rank torchrun gave it, in a group of the size
    # torchrun gave it, and everything below that uses the rank or the world size (the samplers,
    # the metrics) sees those same values.
    # Step 4: compute this process's global rank from args.node_id, args.num_gpus and
    # local_rank, then join the process group with dist.init_process_group: backend "nccl"
    # on GPUs ("gloo" on the CPU), the rank and args.world_size. On a GPU, call
    # torch.cuda.set_device(local_rank) first, so that NCCL uses this process's own GPU.
    rank = args.node_id * args.num_gpus + local_rank
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(minutes=10))  # give up rather than wait forever

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
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler)

    # Step 7: pin this process to its own device: cuda:local_rank on a GPU machine.
    # (On the CPU, give each process its share of the cores with torch.set_num_threads.)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.num_gpus))
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

    start = time.time()
    epochs_at_target = 0
    for epoch in range(1, args.epochs + 1):
        # Step 6.5: call train_sampler.set_epoch(epoch), so that every epoch is shuffled anew.
        train_sampler.set_epoch(epoch)
        epoch_start = time.time()
        num_images = train_one_epoch(model, train_loader, optimizer, device)
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
    # TODO torchrun: contract: the layout (nodes, processes per node, where rank 0 listens) is
    # given to torchrun alone, by its own options; the script runs unchanged whatever they are,
    # and nothing it is given or computes can disagree with them.
    # Step 1: add the integer arguments --num-nodes (default 1), --node-id (default 0)
    # and --num-gpus (default 1: processes to start on this node, one per GPU).
    parser.add_argument("--num-nodes", type=int, default=1, help="how many machines (nodes) train together")
    parser.add_argument("--node-id", type=int, default=0, help="this node's number, from 0 to num-nodes - 1")
    parser.add_argument("--num-gpus", type=int, default=1,
                        help="processes to start on this node: one per GPU (CPU processes if there is no GPU)")
    # Step 2: add --master-addr (default "localhost") and --master-port (default 29500).
    parser.add_argument("--master-addr", default="localhost", help="address of node 0, where global rank 0 runs")
    parser.add_argument("--master-port", type=int, default=29500, help="a free port on node 0")
    # Optional: add a --sync-bn flag (action="store_true").
    parser.add_argument("--sync-bn", action="store_true", help="synchronise BatchNorm statistics across GPUs")
    args = parser.parse_args()

    # Step 2: compute args.world_size (processes on all nodes) and tell every process
    # where global rank 0 listens: set os.environ["MASTER_ADDR"] and os.environ["MASTER_PORT"].
    # (The solution also refuses impossible values and a busy port, with one clear line each.)
    if args.num_nodes < 1 or args.num_gpus < 1:
        parser.error("--num-nodes and --num-gpus must be at least 1")
    if not 0 <= args.node_id < args.num_nodes:
        parser.error(f"--node-id must be between 0 and {args.num_nodes - 1} (--num-nodes is {args.num_nodes})")
    if torch.cuda.is_available() and args.num_gpus > torch.cuda.device_count():
        parser.error(f"--num-gpus is {args.num_gpus} but this machine has {torch.cuda.device_count()} GPU(s)")
    args.world_size = args.num_nodes * args.num_gpus
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    if args.node_id == 0:  # global rank 0 will listen on this port: fail now if it is taken
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", args.master_port))
            except OSError:
                parser.error(f"port {args.master_port} is busy (another run?); pick a free one with --master-port")

    # TODO torchrun: contract: the training processes are exactly the ones torchrun started
    # (--nproc-per-node on each node, no more); each of them trains as the process torchrun
    # started it as, on the device of its rank on this node.
    # Step 3: call worker(0, args) instead.
    # Step 10: start args.num_gpus processes with mp.spawn(worker, args=(args,), nprocs=args.num_gpus).
    try:
        mp.spawn(worker, args=(args,), nprocs=args.num_gpus)
    except mp.ProcessExitedException as err:  # one process failed; mp.spawn has stopped the others
        sys.exit(err.exit_code if err.exit_code > 0 else f"error: process {err.error_index} was killed ({err.signal_name})")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted")
