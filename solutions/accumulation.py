"""Gradient accumulation in your own bucketed DDP: k micro-steps, one all-reduce per bucket.

    python exercises/accumulation.py --world-size 2 --micro-steps 4

A batch too large for memory is split into k micro-batches: each goes forward and backward in turn, the
gradients adding up in .grad, and the optimizer steps once, on the whole batch. Under data parallelism
the gradients need averaging over the processes only once per step, not after every micro-batch: DDP's
no_sync() is the context manager inside which backward() sends nothing. Here you give your BucketedDDP of
part 5 (exercises/ddp_by_hand.py) the same power, and write the step that uses it.
"""
import argparse
import contextlib
import datetime
import gc
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
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


class BucketedDDP(nn.Module):
    # TODO accumulation: your BucketedDDP of part 5 (exercises/ddp_by_hand.py), whose contract is unchanged:
    # BucketedDDP(module, bucket_size_mb) starts every process from rank 0's parameters and buffers, sends the
    # gradients of the parameters that train in buckets of at most bucket_size_mb megabytes during backward(),
    # and after finish_gradient_synchronization() every gradient is the average over the processes. Copy your
    # class here (with any helper it uses), then give it no_sync() below.
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        limit = bucket_size_mb * 1024 * 1024
        self.buckets, size = [[]], 0
        for parameter in reversed([p for p in module.parameters() if p.requires_grad]):
            nbytes = parameter.numel() * parameter.element_size()
            if self.buckets[-1] and size + nbytes > limit:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(parameter)
            size += nbytes
        self.bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending = {}  # bucket -> (handle, flat gradients)
        self.sync = True
        for parameter in module.parameters():
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._gradient_ready)

    def _gradient_ready(self, parameter):
        if not self.sync:  # inside no_sync(): the gradient stays here, added to the next ones
            return
        k = self.bucket_of[id(parameter)]
        self.ready[k] += 1
        if self.ready[k] == len(self.buckets[k]):
            self._launch(k)

    def _launch(self, k):
        gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[k]]
        flat = torch.cat([g.reshape(-1) for g in gradients])
        self.pending[k] = (dist.all_reduce(flat, async_op=True), flat)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for k in range(len(self.buckets)):
            if k not in self.pending:
                self._launch(k)
        world_size = dist.get_world_size()
        for k, (handle, flat) in sorted(self.pending.items()):
            handle.wait()
            flat /= world_size
            offset = 0
            for parameter in self.buckets[k]:
                piece = flat[offset:offset + parameter.numel()].view_as(parameter)
                if parameter.grad is not None:
                    parameter.grad.copy_(piece)
                offset += parameter.numel()
        self.pending, self.ready = {}, [0] * len(self.buckets)

    @contextlib.contextmanager  # turns a generator into a context manager: the code of `with` runs at its yield
    def no_sync(self):
        # TODO accumulation: a context manager. A backward() run inside it sends nothing: its gradients add up
        # in each parameter's .grad. The first backward() outside it sends each bucket once, holding what every
        # backward() since the last step added up, and finish_gradient_synchronization() then leaves every
        # gradient the average over the processes, as without no_sync().
        self.sync = False
        try:
            yield
        finally:
            self.sync = True


def train_step(model, optimizer, micro_batches):
    """One optimizer step on this process's share of a batch, given as k micro-batches."""
    # TODO accumulation: `model` is your BucketedDDP, `micro_batches` a list of k (inputs, labels) of equal sizes.
    # On return the optimizer has stepped once, and the weights are those one step on the whole batch (every
    # process's micro-batches, the mean cross-entropy over all their examples) would give; each bucket was
    # all-reduced once in the step, whatever k.
    optimizer.zero_grad(set_to_none=True)
    k = len(micro_batches)
    for i, (inputs, labels) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            # each micro-batch's mean, divided by k: the gradients add up to the whole batch's mean
            (F.cross_entropy(model(inputs), labels) / k).backward()
    model.finish_gradient_synchronization()
    optimizer.step()


# The rest is given: k micro-steps with your BucketedDDP against one step of DistributedDataParallel on the
# whole batch, and DDP's own no_sync() for the time it takes.

def make_model(hidden=256):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def ddp_step(model, optimizer, micro_batches):
    """DDP's own accumulation, for the clock."""
    optimizer.zero_grad(set_to_none=True)
    for i, (inputs, labels) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == len(micro_batches) - 1 else model.no_sync():
            (F.cross_entropy(model(inputs), labels) / len(micro_batches)).backward()
    optimizer.step()


def worker(rank, args):
    torch.set_num_threads(1)
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if on_gpu:
        torch.cuda.set_device(rank)  # before the process group: NCCL uses the current device
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))
    generator = torch.Generator().manual_seed(0)
    share = args.batch_size // args.world_size  # this process's share of each batch
    batches = [(torch.randn(args.batch_size, 64, generator=generator),
                torch.randint(0, 10, (args.batch_size,), generator=generator)) for _ in range(args.steps)]
    mine = [(x[rank * share:(rank + 1) * share].to(device), y[rank * share:(rank + 1) * share].to(device))
            for x, y in batches]
    micro = [list(zip(x.chunk(args.micro_steps), y.chunk(args.micro_steps))) for x, y in mine]

    whole = nn.parallel.DistributedDataParallel(make_model(args.hidden).to(device), device_ids=[rank] if on_gpu else None)
    optimizer = torch.optim.SGD(whole.parameters(), lr=0.05, momentum=0.9)
    for x, y in mine:  # the reference: one step on the whole batch
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(whole(x), y).backward()
        optimizer.step()

    timings = {}
    for name in ("DDP.no_sync", "your BucketedDDP"):
        if name == "DDP.no_sync":
            model = nn.parallel.DistributedDataParallel(make_model(args.hidden).to(device),
                                                        device_ids=[rank] if on_gpu else None)
            step = ddp_step
        else:
            model = BucketedDDP(make_model(args.hidden).to(device), args.bucket_size_mb)
            step = train_step
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        seconds = []
        for micro_batches in micro:
            start = time.perf_counter()
            step(model, optimizer, micro_batches)
            if on_gpu:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        timings[name] = statistics.median(seconds)
        inner = model.module
        difference = max((a - b).abs().max().item() for a, b in zip(inner.parameters(), whole.module.parameters()))
        if rank == 0:
            print(f"{name:17} {args.micro_steps} micro-steps of {share // args.micro_steps}: largest difference from "
                  f"one step on the whole batch {difference:.1e}, {timings[name] * 1000:.1f} ms a step", flush=True)
    del whole, model
    gc.collect()  # the wrappers' hooks make reference cycles: free them before the process group
    dist.barrier()
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
    parser = argparse.ArgumentParser(description="Gradient accumulation with your BucketedDDP, against one big batch.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--micro-steps", type=positive_int, default=4, help="k: micro-batches per step")
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--batch-size", type=positive_int, default=192, help="the global batch")
    parser.add_argument("--bucket-size-mb", type=float, default=0.25)
    parser.add_argument("--hidden", type=positive_int, default=256)
    args = parser.parse_args()
    if args.batch_size % (args.world_size * args.micro_steps):
        parser.error("--batch-size must divide by --world-size x --micro-steps")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
