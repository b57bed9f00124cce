"""bf16 training: fp32 master weights kept by your own step, and gradients all-reduced in bf16.

    python exercises/bf16_training.py --world-size 2      # masters against plain bf16; the hook's error

bf16 has fp32's range but keeps only 8 bits of precision: near 1.0 its numbers are 2^-7 apart. A
model trained purely in bf16 loses every update smaller than half that gap to rounding, and late in
training most updates are that small. So the optimizer keeps an fp32 **master** copy of every weight,
steps it with the gradients computed in bf16, and copies the result into the bf16 model, rounded.
The gradients can also travel in bf16, halving the bytes of DDP's all-reduce: a DDP communication hook
casts each bucket to bf16 before the all-reduce, and back after. Notebook 35 has hints you open when
you want them.
"""
import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class MasterWeights:
    """Steps a bf16 model through fp32 master copies of its parameters: loss.backward(), then step()."""

    def __init__(self, model, optimizer_cls, **kwargs):
        self.model = model
        # TODO bf16: an fp32 copy of every parameter of the (bf16) model that trains, and an
        # optimizer_cls(..., **kwargs) over those copies alone.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_() for p in self.params]
        self.optimizer = optimizer_cls(self.master, **kwargs)

    def step(self):
        # TODO bf16: the optimizer steps the fp32 copies with the model's gradients (in fp32); then every model
        # parameter holds its copy rounded to bf16, and no gradient is left for the next backward().
        for p, master in zip(self.params, self.master):
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, master in zip(self.params, self.master):
                p.copy_(master)


def bf16_allreduce_hook(process_group, bucket):
    """A DDP communication hook (model.register_comm_hook(process_group, bf16_allreduce_hook)): the bucket's
    gradients averaged over the processes, sent in bf16."""
    # TODO bf16: a future whose value is the bucket's gradients averaged over the process group, in the bucket's
    # own dtype and shape, where what the all-reduce sent was bf16.
    group = process_group if process_group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(group.size())
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut):
        return fut.value()[0].to(bucket.buffer().dtype)

    return future.then(decompress)


# The rest trains a small model in bf16 with and without master weights, and measures the hook's error
# against DDP's own all-reduce in fp32.

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))


def batches(steps, batch_size):
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, 10, generator=generator)
    for _ in range(steps):
        x = torch.randn(batch_size, 32, generator=generator)
        yield x, (x @ teacher).argmax(dim=1)


def worker(rank, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size, timeout=datetime.timedelta(seconds=60))
    options = {"lr": args.lr}
    pure = make_model().to(torch.bfloat16)  # bf16 weights stepped in bf16
    pure_opt = torch.optim.SGD(pure.parameters(), **options)
    mixed = make_model().to(torch.bfloat16)  # bf16 weights stepped through fp32 masters
    masters = MasterWeights(mixed, torch.optim.SGD, **options)
    start = [p.detach().float().clone() for p in pure.parameters()]
    for x, y in batches(args.steps, args.batch_size):
        for model, step in ((pure, pure_opt.step), (mixed, masters.step)):
            F.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
            step()
        pure_opt.zero_grad(set_to_none=True)
    moved = [sum((p.detach().float() - s).abs().sum().item() for p, s in zip(m.parameters(), start)) for m in (pure, mixed)]

    plain = nn.parallel.DistributedDataParallel(make_model())
    hooked = nn.parallel.DistributedDataParallel(make_model())
    hooked.register_comm_hook(None, bf16_allreduce_hook)
    x, y = next(batches(1, args.batch_size))
    for model in (plain, hooked):
        F.cross_entropy(model(x[rank::args.world_size]), y[rank::args.world_size]).backward()
    error = max(((a.grad - b.grad).abs().max() / b.grad.abs().max()).item()
                for a, b in zip(hooked.parameters(), plain.parameters()))
    if rank == 0:
        print(f"after {args.steps} steps at lr {args.lr}: the weights moved {moved[0]:.4f} in all in pure bf16, "
              f"{moved[1]:.4f} through fp32 master weights")
        print(f"gradients all-reduced in bf16: largest error against fp32's {error:.1e} of the largest gradient, "
              f"for half the bytes")
    del plain, hooked
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
    parser = argparse.ArgumentParser(description="bf16 training: master weights, and a bf16 all-reduce hook.")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--steps", type=positive_int, default=50)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
