"""An input pipeline that cannot keep up: the model waits for its data.

    python exercises/input_pipeline.py --world-size 2                # your pipeline
    python exercises/input_pipeline.py --world-size 2 --slow         # the pipeline as handed out
    python exercises/input_pipeline.py --slow --profile traces/      # rank 0's steps 3-5, profiled

Every rank trains the same small DDP model on its share of a data set of small images. The
images live in one file on a network share (`SlowDisk`, a stand-in): every request to the share
waits a moment however fast the machine is, and the share answers one request at a time. A
training step of this model takes a millisecond or two; the handed-out pipeline (`slow_loader`)
makes every step wait far longer than that for its batch. Why, you find out: profile a run
(`--profile`) and read its trace before you change anything.

`fast_loader` is yours to write (`# TODO input_pipeline`); `--slow` runs `slow_loader`, the
handed-out pipeline, which the check times yours against. Leave the rest as it is: the share,
`slow_loader` and what it uses, the model and the training loop are the same for both pipelines.

Check it: python -m autograde check --step input_pipeline
"""
import argparse
import datetime
import fcntl
import os
import socket
import struct
import tempfile
import time
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset, DistributedSampler

REQUEST_SECONDS = 0.0015    # every request to the share waits this long, whatever it asks for
BYTES_PER_SECOND = 100e6    # and this long again for every byte it returns
SIDE = 28                   # each image is SIDE x SIDE pixels, one byte each on the share


class SlowDisk:
    """A data set of `size` images and their labels, as one file on a slow network share. The file
    is a header (the number of images, then where each image's record starts, and where the last
    ends: little-endian uint32s) followed by the records; a record is the label (one byte) and
    the image's pixels (bytes, compressed with zlib). `read(start, stop)` returns the file's
    bytes start:stop as one request. The file is the same on every read. The share answers one
    request at a time, whichever process or thread asks: a request waits its turn on `queue`, a
    file every SlowDisk of a run is given, locked while a request is answered."""

    def __init__(self, size, seed, queue):
        self.queue = queue
        generator = torch.Generator().manual_seed(seed)
        pixels = torch.randint(0, 256, (size, SIDE, SIDE), generator=generator, dtype=torch.uint8)
        records = [bytes([int(image[SIDE // 2, :10].argmax())]) + zlib.compress(image.numpy().tobytes())
                   for image in pixels]  # the label: something the model can learn from the pixels
        offset = 4 * (size + 2)
        starts = [offset]
        for record in records:
            starts.append(starts[-1] + len(record))
        self._file = struct.pack(f"<{size + 2}I", size, *starts) + b"".join(records)

    def read(self, start, stop):
        if not 0 <= start <= stop <= len(self._file):
            raise ValueError(f"bytes {start}:{stop} are not in the file of {len(self._file)} bytes")
        with open(self.queue, "rb") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)  # one request at a time: the others wait here (closing unlocks)
            time.sleep(REQUEST_SECONDS + (stop - start) / BYTES_PER_SECOND)
            return self._file[start:stop]


def decode(record):
    """One record as the model takes it: the image (1 x SIDE x SIDE, floats in [0, 1]) and its label."""
    pixels = torch.frombuffer(bytearray(zlib.decompress(record[1:])), dtype=torch.uint8)
    return pixels.view(1, SIDE, SIDE).float() / 255, record[0]


class Images(Dataset):
    """The share's images, one by one."""

    def __init__(self, disk):
        self.disk = disk
        (self.size,) = struct.unpack("<I", disk.read(0, 4))

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if not 0 <= index < self.size:
            raise IndexError(index)
        header = self.disk.read(4, 4 * (self.size + 2))
        start, stop = struct.unpack_from("<2I", header, 4 * index)
        return decode(self.disk.read(start, stop))


def slow_loader(disk, sampler, batch_size):
    """The pipeline as handed out (--slow): the yardstick. Leave it as it is."""
    return DataLoader(Images(disk), batch_size=batch_size, sampler=sampler)


def fast_loader(disk, sampler, batch_size):
    """Your pipeline: the batches slow_loader gives, in the same order, epoch after epoch. Faster."""
    # The trace shows two requests to the share for every image: the header again, then the
    # record, each a wait, one at a time for every process (so more processes reading would only
    # queue). Fewer, larger requests instead: the whole file in one, decoded once, and the batches
    # cut from memory in the sampler's order by a plain loader (the same sampler, set_epoch and all).
    (size,) = struct.unpack("<I", disk.read(0, 4))
    data = disk.read(0, struct.unpack_from("<I", disk.read(4 * (size + 1), 4 * (size + 2)))[0])
    starts = struct.unpack_from(f"<{size + 1}I", data, 4)
    images, labels = zip(*(decode(data[starts[i]:starts[i + 1]]) for i in range(size)))
    memory = torch.utils.data.TensorDataset(torch.stack(images), torch.tensor(labels))
    return DataLoader(memory, batch_size=batch_size, sampler=sampler)


def make_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 64), nn.ReLU(), nn.Linear(64, 10))


def worker(rank, args):
    torch.set_num_threads(1)  # one core per process: the processes share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))  # a peer that never comes: stop
    torch.manual_seed(args.seed)  # the same initial weights on every rank, and for both pipelines
    model = nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    disk = SlowDisk(args.images, args.seed, args.queue)
    sampler = DistributedSampler(range(args.images), num_replicas=args.world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    # --profile: rank 0's steps 3 to 5 under torch.profiler, Python's calls included (with_stack)
    profiler = (profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=schedule(wait=1, warmup=1, active=3, repeat=1))
                if args.profile and rank == 0 else None)
    if profiler:
        profiler.start()
    started = time.perf_counter()  # the clock starts here, before the pipeline is made (the check's too)
    batches = (slow_loader if args.slow else fast_loader)(disk, sampler, args.batch_size)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order every epoch, the same one for both pipelines
        total, steps, batch = torch.zeros(()), 0, iter(batches)
        while True:
            with record_function("wait for the batch"):
                images, labels = next(batch, (None, None))
            if images is None:
                break
            with record_function("train on it"):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images), labels)
                loss.backward()  # DDP averages the gradients over the ranks here
                optimizer.step()
            total, steps = total + loss.detach(), steps + 1
            if profiler:
                profiler.step()
        if rank == 0:
            print(f"epoch {epoch + 1}: {steps} steps, mean loss {total.item() / max(steps, 1):.4f}, "
                  f"{time.perf_counter() - started:.2f} s since the start")
    if rank == 0:
        which = "the slow pipeline (--slow)" if args.slow else "your pipeline"
        print(f"{args.epochs} epochs with {which} in {time.perf_counter() - started:.2f} s")
    if profiler:
        profiler.stop()
        os.makedirs(args.profile, exist_ok=True)
        path = os.path.join(args.profile, f"{'slow' if args.slow else 'yours'}-rank0.json")
        profiler.export_chrome_trace(path)
        print(f"trace of rank 0's steps 3-5: {path} (open it in https://ui.perfetto.dev)")
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
    parser = argparse.ArgumentParser(description="Train a small model on images from a slow network share.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (default 2)")
    parser.add_argument("--images", type=positive_int, default=512, help="images in the data set (default 512)")
    parser.add_argument("--batch-size", type=positive_int, default=20, help="images per batch and rank (default 20)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs to train (default 2)")
    parser.add_argument("--seed", type=int, default=5, help="the images, the order and the weights (default 5)")
    parser.add_argument("--slow", action="store_true", help="the pipeline as handed out: the yardstick")
    parser.add_argument("--profile", metavar="DIR", help="profile rank 0's steps 3-5 and write the trace to DIR")
    args = parser.parse_args()
    if args.images < args.world_size * args.batch_size:
        parser.error(f"--images {args.images} gives a rank no full batch: use at least --world-size x "
                     f"--batch-size = {args.world_size * args.batch_size}")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    # fork: each process starts as a copy of this one, torch already imported
    with tempfile.NamedTemporaryFile(prefix="share-queue-") as queue:  # the share's queue, for this run
        args.queue = queue.name
        mp.start_processes(worker, args=(args,), nprocs=args.world_size, start_method="fork")


if __name__ == "__main__":
    main()
