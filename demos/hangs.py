"""Three ways to hang a DDP job, and their fixes.

    python demos/hangs.py --world-size 2 --bug uneven_batches           # hangs
    python demos/hangs.py --world-size 2 --bug uneven_batches --fix     # finishes (Join)

Every collective (an all-reduce, a broadcast, a barrier, and the all-reduces DDP makes inside
backward()) must be called by every rank, in the same order. A rank that skips one, or makes one
more, leaves the others waiting for it: nothing fails, nothing moves, until the process group's
timeout (here --timeout seconds; the default is 30 minutes with gloo, 10 with NCCL, so in practice a
hung job burns its allocation).

- one_rank_collective: a barrier inside code that only rank 0 runs (its saving block); the others
  go on to the next collective. Fix: every rank calls the collective; only rank 0 saves.
- uneven_batches: the ranks have different numbers of batches (data not split evenly), so the
  rank with the most makes one more backward(), whose all-reduce nobody answers: the others are
  already at the next collective.
  Fix: torch.distributed.algorithms.Join: a rank that runs out of batches keeps answering the
  others' all-reduces (with zeros) until every rank is done. (Or: a DistributedSampler, which
  gives every rank the same number of batches.)
- early_stop_rank0: rank 0 alone decides to stop early (its own validation loss), and leaves the
  loop; the others go on training and wait in their next backward().
  Fix: decide together: all-reduce the decision, so every rank stops at the same epoch.
"""
import argparse
import datetime
import faulthandler
import gc
import os
import signal
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join

BUGS = ["none", "one_rank_collective", "uneven_batches", "early_stop_rank0"]


def batches_for(rank, args):
    generator = torch.Generator().manual_seed(rank)
    count = args.batches + (rank if args.bug == "uneven_batches" else 0)  # rank r has r more
    return [(torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator))
            for _ in range(count)]


def train_epoch(model, optimizer, batches, by_hand):
    total = torch.zeros(1)
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # DDP all-reduces the gradients here: every rank must be in it
        if by_hand:  # the same average, with one all-reduce per gradient of our own (notebook 20's NaiveDDP)
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        optimizer.step()
        total += loss.detach()
    return total / max(len(batches), 1)


def worker(rank, args):
    torch.set_num_threads(1)
    # `kill -USR1 <pid>` prints where this process is, for any Python process (no py-spy needed).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if on_gpu:
        torch.cuda.set_device(rank)  # before the process group: NCCL uses the current device
    # (gloo on the CPU; the hangs are the same with NCCL, which can also be made to abort
    # instead, with TORCH_NCCL_ASYNC_ERROR_HANDLING=1, the default since PyTorch 2.2)
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    model = nn.Linear(32, 4)  # on the CPU here
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    if not args.by_hand:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = batches_for(rank, args)
    print(f"rank {rank} (pid {os.getpid()}): {len(batches)} batches an epoch", flush=True)

    for epoch in range(args.epochs):
        if args.bug == "uneven_batches" and args.fix and not args.by_hand:
            # Join: a rank out of batches shadows the others' all-reduces until all are done.
            with Join([model]):
                loss = train_epoch(model, optimizer, batches, args.by_hand)
        else:
            loss = train_epoch(model, optimizer, batches, args.by_hand)
        print(f"rank {rank}: epoch {epoch}, loss {loss.item():.3f}", flush=True)

        if args.bug == "early_stop_rank0":
            stop = torch.tensor([1.0 if rank == 0 and epoch == 0 else 0.0])  # rank 0's own judgement
            if args.fix:
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # one rank's "stop" is everyone's
            if stop.item() > 0:
                print(f"rank {rank}: stopping early after epoch {epoch}", flush=True)
                break

    # Everyone done, before rank 0 saves the model.
    if args.bug == "one_rank_collective" and not args.fix:
        if rank == 0:  # the bug: a barrier inside rank 0's saving code; the others never call it
            dist.barrier()
    else:
        dist.barrier()
    dist.all_reduce(loss)  # the last loss, summed over the ranks
    if rank == 0:
        print(f"done: final loss {loss.item() / args.world_size:.3f}", flush=True)
    # Free DDP (its hooks can make reference cycles, hence gc) before the process group: one that
    # outlives the group can abort the process at exit.
    del model, optimizer
    gc.collect()
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
    parser = argparse.ArgumentParser(description="A DDP job that hangs on purpose, and its fix.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start")
    parser.add_argument("--bug", choices=BUGS, default="none")
    parser.add_argument("--fix", action="store_true", help="apply the bug's fix")
    parser.add_argument("--by-hand", action="store_true",
                        help="average the gradients with our own all-reduces instead of DDP's")
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batches", type=positive_int, default=4, help="batches an epoch (rank 0's)")
    parser.add_argument("--timeout", type=positive_int, default=60,
                        help="seconds a collective may wait before the process group gives up")
    args = parser.parse_args()
    if args.world_size < 2 and args.bug != "none":
        parser.error("a hang needs at least 2 processes: use --world-size 2")
    if args.bug == "uneven_batches" and args.fix and args.by_hand:
        parser.error("the fix for uneven batches is Join, which works with DDP: drop --by-hand")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    try:
        mp.spawn(worker, args=(args,), nprocs=args.world_size)
    except mp.ProcessRaisedException as error:
        # A rank's collective gave up after --timeout seconds (or DETAIL caught the mismatch first):
        # its error's last line says which, in place of the whole traceback.
        last = str(error).strip().splitlines()[-1]
        raise SystemExit(f"hangs.py: rank {error.error_index} stopped waiting: {last}")


if __name__ == "__main__":
    main()
