"""Where the time of a training step goes, and the usual fixes, each one measured.

This runs a few steps of the lab's training loop (the WideResNet on Fashion-MNIST under DDP),
started by torchrun, with the fixes below switched on or off. Rank 0 prints one JSON line:
the step time (median over the timed steps, the slowest rank's), images per second over all
processes, and how many all-reduces DDP made per optimizer step. Notebook 18 runs it
side by side with and without each fix.

    torchrun --standalone --nproc-per-node 2 speed_fixes.py --data-dir data
    torchrun ... speed_fixes.py --workers 2 --pin-memory --persistent-workers  # loading beside training
    torchrun ... speed_fixes.py --preload                   # the whole data set as tensors on the device
    torchrun ... speed_fixes.py --bucket-cap-mb 1 --grad-as-bucket-view
    torchrun ... speed_fixes.py --accumulate 4 --no-sync    # one all-reduce per 4 micro-batches
    torchrun ... speed_fixes.py --bf16 --channels-last      # GPUs: tensor cores, and their memory layout
    torchrun ... speed_fixes.py --profile traces            # torch.profiler: a trace per rank, and the split
"""
import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


def conv_unit(in_channels, out_channels):
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ResidualBlock(nn.Module):
    def __init__(self, in_channels, out_channels, dropout=0.1):
        super().__init__()
        self.body = nn.Sequential(conv_unit(in_channels, out_channels), nn.Dropout(dropout),
                                  conv_unit(out_channels, out_channels))
        if in_channels == out_channels:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False)

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Module):
    """The lab's model (fashion_mnist.py), k = widen_factor."""

    def __init__(self, widen_factor=10, num_classes=10):
        super().__init__()
        w1, w2, w3 = 16 * widen_factor, 32 * widen_factor, 64 * widen_factor
        self.features = nn.Sequential(
            conv_unit(1, 16), ResidualBlock(16, w1), ResidualBlock(w1, w1), nn.MaxPool2d(2),
            ResidualBlock(w1, w2), ResidualBlock(w2, w2), nn.MaxPool2d(2),
            ResidualBlock(w2, w3), ResidualBlock(w3, w3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(w3, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def batches_from_loader(train_set, args, rank, world_size, device):
    """The usual way: a DataLoader turns images into tensors batch by batch, on the CPU."""
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers, pin_memory=args.pin_memory,
                        persistent_workers=args.persistent_workers and args.workers > 0)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            # non_blocking: from pinned memory, the copy to the GPU overlaps with computing
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        epoch += 1


def batches_from_memory(train_set, args, rank, world_size, device):
    """Fashion-MNIST is small (47 MB as bytes): convert it once, keep it on the device, and
    slice batches out of it: no loader, no copy per step."""
    images = train_set.data.unsqueeze(1).to(device).float().div(255)
    labels = train_set.targets.to(device)
    generator = torch.Generator().manual_seed(0)
    epoch = 0
    while True:
        generator.manual_seed(epoch)
        order = torch.randperm(len(labels), generator=generator)[rank::world_size].to(device)
        for first in range(0, len(order) - args.batch_size + 1, args.batch_size):
            chosen = order[first:first + args.batch_size]
            yield images[chosen], labels[chosen]
        epoch += 1


def main():
    parser = argparse.ArgumentParser(description="Time a few training steps with and without the usual fixes.")
    parser.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"))
    parser.add_argument("--widen-factor", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="images per micro-batch and process")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to time")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--pin-memory", action="store_true", help="DataLoader: page-locked batches")
    parser.add_argument("--persistent-workers", action="store_true", help="DataLoader: keep workers between epochs")
    parser.add_argument("--preload", action="store_true", help="the whole data set as tensors on the device")
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP: gradient megabytes per all-reduce")
    parser.add_argument("--grad-as-bucket-view", action="store_true",
                        help="DDP: gradients live in the buckets (no copy in and out)")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--no-sync", action="store_true", help="with --accumulate: all-reduce only on the last")
    parser.add_argument("--bf16", action="store_true", help="GPUs: forward and loss in bfloat16 (autocast)")
    parser.add_argument("--channels-last", action="store_true", help="GPUs: NHWC memory layout")
    parser.add_argument("--profile", metavar="DIR", help="profile the timed steps; a trace per rank into DIR")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if "RANK" not in os.environ:
        parser.error(f"start me with torchrun: torchrun --standalone --nproc-per-node 2 {sys.argv[0]}")
    if min(args.steps, args.batch_size, args.accumulate) < 1 or args.warmup_steps < 0:
        parser.error("--steps, --batch-size and --accumulate must be at least 1, --warmup-steps at least 0")

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=datetime.timedelta(seconds=args.timeout))

    try:
        train_set = FashionMNIST(args.data_dir, train=True, download=False, transform=ToTensor())
    except (OSError, RuntimeError):
        sys.exit(f"error: no Fashion-MNIST in {args.data_dir}: `make data`, or `make synthetic-data` and "
                 "--data-dir data/synthetic")
    make_batches = batches_from_memory if args.preload else batches_from_loader
    batches = make_batches(train_set, args, rank, world_size, device)

    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = WideResNet(args.widen_factor).to(device, memory_format=memory_format)
    model = nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank] if on_gpu else None, bucket_cap_mb=args.bucket_cap_mb,
        gradient_as_bucket_view=args.grad_as_bucket_view)
    # DDP calls its communication hook once per bucket: wrap the default one to count the all-reduces.
    counted = {"all_reduces": 0}

    def count_all_reduces(state, bucket):
        counted["all_reduces"] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, count_all_reduces)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if args.bf16 and on_gpu else contextlib.nullcontext()

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        for micro in range(args.accumulate):
            with torch.profiler.record_function("data"):
                images, labels = next(batches)
                images = images.contiguous(memory_format=memory_format)
            last = micro == args.accumulate - 1
            # no_sync: gradients add up locally; the all-reduce waits for the last micro-batch
            sync = contextlib.nullcontext() if last or not args.no_sync else model.no_sync()
            with sync:
                with torch.profiler.record_function("forward"), autocast:
                    loss = F.cross_entropy(model(images), labels) / args.accumulate
                with torch.profiler.record_function("backward (with DDP's all-reduces)"):
                    loss.backward()
        with torch.profiler.record_function("optimizer"):
            optimizer.step()

    for _ in range(args.warmup_steps):
        train_step()
    counted["all_reduces"] = 0
    profiler = contextlib.nullcontext()
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
        profiler = torch.profiler.profile(activities=activities)
    times = []
    with profiler:
        for _ in range(args.steps):
            if on_gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
            train_step()
            if on_gpu:
                torch.cuda.synchronize()  # the GPU works asynchronously: wait for it before reading the clock
            times.append(time.perf_counter() - start)

    result = {"step_time": statistics.median(times), "all_reduces_per_step": counted["all_reduces"] / args.steps}
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        trace = os.path.join(args.profile, f"rank{rank}.json")
        profiler.export_chrome_trace(trace)  # open in chrome://tracing or ui.perfetto.dev
        result["trace"] = trace
        result["phases"] = {e.key: e.cpu_time_total / 1e6 / args.steps for e in profiler.key_averages()
                            if e.key in ("data", "forward", "backward (with DDP's all-reduces)", "optimizer")}
        # the all-reduce itself, as the backend records it ("gloo:all_reduce", "nccl:all_reduce")
        result["phases"]["all-reduce"] = sum(e.cpu_time_total for e in profiler.key_averages()
                                             if "all_reduce" in e.key) / 1e6 / args.steps
    everyone = [None] * world_size
    dist.all_gather_object(everyone, result)
    if rank == 0:
        slowest = max(everyone, key=lambda r: r["step_time"])
        images = args.batch_size * args.accumulate * world_size
        print(json.dumps({**slowest, "images_per_sec": images / slowest["step_time"], "world_size": world_size,
                          "batch_size": args.batch_size, "accumulate": args.accumulate, "device": device.type,
                          "ranks": everyone}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
