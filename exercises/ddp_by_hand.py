"""Data parallelism by hand: three wrappers that do, step by step, what DistributedDataParallel does.

    python exercises/ddp_by_hand.py --world-size 2        # each wrapper against DDP: weights and time

Each wrapper holds a model. Every process runs the forward and backward pass on its own share
of the batch; before optimizer.step(), the wrapper's finish_gradient_synchronization() must have
left every gradient equal to the average over all processes (the gradient of the whole batch).

- NaiveDDP: synchronises the gradients after backward() has finished.
- OverlapDDP: the same result, but each gradient's communication starts during backward(), as
  soon as that gradient is ready, while backward() is still computing the others.
- BucketedDDP: the same result with fewer, larger messages: gradients travel in groups
  ("buckets") of at most bucket_size_mb, each group starting as soon as it is complete.

All three must start every process from the same model: rank 0's. A parameter that is frozen
(requires_grad=False) or unused in the forward pass has no gradient, and needs none.
Notebook 20 has the details of each, and hints you open when you want them.
"""
import argparse
import datetime
import gc
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def broadcast_from_rank_0(module):
    """Every process starts from rank 0's parameters and buffers."""
    # TODO naive_ddp: afterwards, every process's module holds rank 0's values: every parameter and
    # every buffer, whatever values each process started with (all three wrappers call this).
    pass  # your code


class NaiveDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        # TODO naive_ddp: called after backward() on every process. On return, every parameter that has
        # a gradient holds the average of that gradient over all processes; one that has none (frozen,
        # unused) is left alone.
        pass  # your code

class OverlapDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        self.pending = []  # yours to use as you see fit
        # TODO overlap_ddp: arrange for each gradient's communication to start during backward(), as
        # soon as that gradient is final (a tied weight's too, after all its uses), without waiting for
        # it to finish there. Frozen parameters never get a gradient.

    def _launch(self, parameter):
        pass  # your code, if you want this method

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        # TODO overlap_ddp: on return, every gradient is the average over all processes, and no
        # communication started in this step is still running (optimizer.step() reads the gradients next).
        pass  # your code

class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        # TODO bucketed_ddp: the gradients of the parameters that train travel in buckets: each
        # bucket holds at most bucket_size_mb megabytes of them (a larger parameter alone in its own), each
        # is sent as one message, and a bucket starts during backward() as soon as all its gradients are
        # final. Buckets fill in the order backward() produces gradients, so that the first is complete
        # first: the check expects the buckets notebook 20 prints.
        pass  # your code

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        # TODO bucketed_ddp: on return, every gradient is the average over all processes, whether or not
        # every bucket filled up during backward(), and no communication of this step is still running.
        pass  # your code


# The rest compares the three wrappers with DistributedDataParallel: the same weights after a few
# steps, and how long a step takes.

def make_model(seed, hidden=256):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train(model, sync, batches, rank, world_size, lr=0.05):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    seconds = []
    for images, labels in batches:
        start = time.perf_counter()
        share = len(labels) // world_size
        mine = slice(rank * share, (rank + 1) * share)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[mine]), labels[mine]).backward()
        sync()
        optimizer.step()
        if images.is_cuda:
            torch.cuda.synchronize()  # a GPU works behind Python's back: wait for it before reading the clock
        seconds.append(time.perf_counter() - start)
    # The median step: the first steps (setting up) and a step slowed by the machine's other work weigh nothing.
    return statistics.median(seconds)


def worker(rank, args):
    torch.set_num_threads(1)
    # One GPU per process where there are enough of them (NCCL: where overlap shows), else CPU processes (gloo).
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if on_gpu:
        torch.cuda.set_device(rank)  # before the process group: NCCL uses the current device
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch_size, 64, generator=generator).to(device),
                torch.randint(0, 10, (args.batch_size,), generator=generator).to(device)) for _ in range(args.steps)]
    reference = nn.parallel.DistributedDataParallel(make_model(0, args.hidden).to(device),
                                                    device_ids=[rank] if on_gpu else None)
    seconds = {"DDP": train(reference, lambda: None, batches, rank, args.world_size)}
    differences = {"DDP": 0.0}
    wrappers = {"NaiveDDP": lambda m: NaiveDDP(m), "OverlapDDP": lambda m: OverlapDDP(m),
                "BucketedDDP": lambda m: BucketedDDP(m, args.bucket_size_mb)}
    for name, wrap in wrappers.items():
        model = wrap(make_model(rank, args.hidden).to(device))  # ranks other than 0 start elsewhere: the broadcast must fix that
        seconds[name] = train(model, model.finish_gradient_synchronization, batches, rank, args.world_size)
        difference = max((a - b).abs().max().item()
                         for a, b in zip(model.module.parameters(), reference.module.parameters()))
        differences[name] = difference
        if rank == 0:
            print(f"{name:12} largest difference from DDP's weights: {difference:.1e}   "
                  f"{seconds[name] * 1000:6.2f} ms a step ({seconds[name] / seconds['DDP']:.2f} x DDP's "
                  f"{seconds['DDP'] * 1000:.2f} ms)", flush=True)
    if rank == 0 and args.json_file:  # for notebook 20's picture
        with open(args.json_file, "w") as f:
            json.dump({name: {"seconds": seconds[name], "difference": differences[name]} for name in seconds}, f)
    # Free DDP and the wrappers (their hooks make reference cycles, hence gc) before the process
    # group: one that outlives the group can abort the process at exit.
    del reference, model
    gc.collect()
    dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
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
    parser = argparse.ArgumentParser(description="Three hand-made DDPs against DistributedDataParallel.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--batch-size", type=positive_int, default=96,
                        help="the global batch (96 divides among 1, 2, 3, 4 or 6 processes)")
    parser.add_argument("--bucket-size-mb", type=float, default=0.25)
    parser.add_argument("--hidden", type=positive_int, default=256,
                        help="width of the hidden layers (on GPUs try 4096: a gradient large enough for overlap to pay)")
    parser.add_argument("--json-file", help="also write each wrapper's time per step and difference here")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error("--batch-size must divide by --world-size")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
