"""An input pipeline that cannot keep up: the model waits for its data.

    python exercises/input_pipeline.py --world-size 2          # your pipeline
    python exercises/input_pipeline.py --world-size 2 --slow   # the pipeline as handed out

Every rank trains the same small DDP model on its share of a data set of small images. The
images live on a slow disk (`SlowDisk`, a stand-in for a network file system): reading one
takes 4 ms however fast the machine is, so a batch of 16 takes 64 ms, while a training step
takes a millisecond or two. Read one image after the other, as the handed-out pipeline does,
each rank spends nearly all its time waiting for the disk, and nothing else works meanwhile.

`fast_loader` is yours to rewrite (`# TODO input_pipeline`); `--slow` runs `slow_loader`, the
handed-out pipeline, which the check times yours against. Leave the rest as it is: the disk, the
model and the training loop are the same for both pipelines.

Check it: python -m autograde check --step input_pipeline
"""
import argparse
import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

READ_SECONDS = 0.004  # one image read from the slow disk


class SlowDisk(Dataset):
    """`size` images of 28 x 28 pixels with their labels, on a slow disk: every read of an image
    takes READ_SECONDS, whichever process reads it. Image `index` is the same on every read."""

    def __init__(self, size, seed):
        self.size, self.seed = size, seed

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if not 0 <= index < self.size:
            raise IndexError(index)
        time.sleep(READ_SECONDS)  # the disk: waiting, not computing
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + int(index))
        image = torch.rand(1, 28, 28, generator=generator)
        label = int(image[0, 14, :10].argmax())  # a label the model can learn
        return image, label


def slow_loader(dataset, sampler, batch_size):
    """The pipeline as handed out (--slow): the yardstick. Leave it as it is."""
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def fast_loader(dataset, sampler, batch_size):
    """Your pipeline: the same batches as slow_loader's, in the same order, epoch after epoch."""
    # TODO input_pipeline: return something the training loop can go through once per epoch (it
    # calls sampler.set_epoch before each pass) that gives the model exactly the batches
    # slow_loader(dataset, sampler, batch_size) gives: the same images and labels, in the same
    # order, every image of the rank's share once per epoch. Only faster: the run with your
    # pipeline must take at most two thirds of the time the run with --slow takes, on this
    # machine. Read the images through `dataset` (the disk); do not change SlowDisk or
    # slow_loader. Look up: DataLoader's num_workers
    return slow_loader(dataset, sampler, batch_size)


def make_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 10))


def worker(rank, args):
    torch.set_num_threads(1)  # one core per process: the processes share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))  # a peer that never comes: stop
    torch.manual_seed(args.seed)  # the same initial weights on every rank, and for both pipelines
    model = nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = SlowDisk(args.images, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=args.world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    started = time.perf_counter()  # the clock starts here, before the pipeline is made (the check's too)
    batches = (slow_loader if args.slow else fast_loader)(dataset, sampler, args.batch_size)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order every epoch, the same one for both pipelines
        total, steps = torch.zeros(()), 0
        for images, labels in batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            total, steps = total + loss.detach(), steps + 1
        if rank == 0:
            print(f"epoch {epoch + 1}: {steps} steps, mean loss {total.item() / max(steps, 1):.4f}, "
                  f"{time.perf_counter() - started:.2f} s since the start")
    if rank == 0:
        which = "the slow pipeline (--slow)" if args.slow else "your pipeline"
        print(f"{args.epochs} epochs with {which} in {time.perf_counter() - started:.2f} s")
    dist.destroy_process_group()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="Train a small model on images from a slow disk.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (default 2)")
    parser.add_argument("--images", type=positive_int, default=512, help="images in the data set (default 512)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="images per batch and rank (default 16)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs to train (default 2)")
    parser.add_argument("--seed", type=int, default=5, help="the images, the order and the weights (default 5)")
    parser.add_argument("--slow", action="store_true", help="the pipeline as handed out: the yardstick")
    args = parser.parse_args()
    if args.images < args.world_size * args.batch_size:
        parser.error(f"--images {args.images} gives a rank no full batch: use at least --world-size x "
                     f"--batch-size = {args.world_size * args.batch_size}")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    # fork: each process starts as a copy of this one, torch already imported, and so do the worker
    # processes a DataLoader starts in it (under mp.spawn they would start a fresh Python each)
    mp.start_processes(worker, args=(args,), nprocs=args.world_size, start_method="fork")


if __name__ == "__main__":
    main()
