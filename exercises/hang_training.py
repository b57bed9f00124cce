"""A small DDP training project: a classifier trained on several processes, validated, checkpointed.

    python exercises/hang_training.py --world-size 2

What it should do, on any number of processes (--world-size; 1 gives the reference):
- train a small classifier on stand-in data, each global batch of --batch-size samples split
  evenly between the ranks, DDP averaging the gradients: the same steps as one process taking
  the whole batch;
- skip every batch whose loss is not finite (the data has a few corrupt samples, as real data
  sometimes has): no optimizer step for that global batch, on any rank;
- validate before training and after every epoch, over the whole validation set, each rank
  over its own shard (the shards are uneven when the set does not divide evenly), and print
  the exact loss and accuracy of the whole set on rank 0;
- time each epoch, the slowest rank's time;
- save a checkpoint after every epoch from rank 0, with the model, the optimizer and every
  rank's state (its RNG and the samples it has seen), so that a resume restarts every rank
  where it was.

As it is, it does not: on 2 processes it hangs, or goes wrong, on some ranks; on 1 it runs.
Find where each rank waits and why (notebook 23), write it down, fix it, and run it again: there
is more than one bug.

Check it: python -m autograde check --step hang_finishes hang_validation hang_same_steps
"""
# TODO hang_finishes: on 2 processes, every rank must reach the end of the script.
# TODO hang_validation: rank 0 must print the loss and accuracy of the whole validation set.
# TODO hang_same_steps: 2 processes must train as 1 does: the same steps, skipped alike, the same result.
import argparse
import datetime
import gc
import hashlib
import os
import shutil
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

FEATURES, CLASSES = 16, 4
CORRUPT = (37, 150)  # training samples whose features were lost (NaN)


def stand_in_data(size, seed):
    """`size` samples of a stand-in classification task: features, and the class a fixed linear
    map scores highest."""
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(size, FEATURES, generator=generator)
    y = (x @ teacher + 0.5 * torch.randn(size, CLASSES, generator=generator)).argmax(dim=1)
    return x, y


def load_data(args):
    x_train, y_train = stand_in_data(args.train_size, args.seed)
    for i in CORRUPT:
        if i < len(x_train):
            x_train[i] = float("nan")
    x_val, y_val = stand_in_data(args.val_size, args.seed + 1)
    return x_train, y_train, x_val, y_val


class Classifier(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.hidden = nn.Linear(FEATURES, hidden)
        self.out = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def global_batches(size, batch_size, epoch, seed):
    """The epoch's global batches (index tensors), in a shuffled order every rank agrees on."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + 1000 * epoch))
    return [order[start:start + batch_size] for start in range(0, size - batch_size + 1, batch_size)]


def train_epoch(model, optimizer, x_train, y_train, epoch, args, rank, world_size):
    """One epoch; returns (optimizer steps, batches skipped, samples this rank has seen, mean loss)."""
    model.train()
    steps, skipped, seen, total = 0, 0, 0, 0.0
    for batch in global_batches(len(x_train), args.batch_size, epoch, args.seed):
        mine = batch[rank::world_size]  # this rank's share of the global batch
        x, y = x_train[mine], y_train[mine]
        seen += len(mine)
        loss = F.cross_entropy(model(x), y)
        if not torch.isfinite(loss):  # a corrupt sample: skip the batch
            skipped += 1
            continue
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        optimizer.step()
        steps += 1
        total += loss.item()
    return steps, skipped, seen, total / max(steps, 1)


@torch.no_grad()
def evaluate(model, x_val, y_val, batch_size, rank, world_size):
    """Loss and accuracy over the whole validation set; each rank evaluates its own shard."""
    model.eval()
    x_mine, y_mine = x_val[rank::world_size], y_val[rank::world_size]  # uneven when the set is
    sums = torch.zeros(3)  # loss summed over the samples, correct answers, samples
    for start in range(0, len(x_mine), batch_size):
        x, y = x_mine[start:start + batch_size], y_mine[start:start + batch_size]
        logits = model(x)
        batch = torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                             (logits.argmax(dim=1) == y).sum().float(), torch.tensor(float(len(y)))])
        dist.all_reduce(batch)  # this batch's numbers summed over the ranks
        sums += batch
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def save_checkpoint(path, model, optimizer, epoch, rank_state):
    """The model, the optimizer and every rank's state, in one file."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rank_state)
    torch.save({"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "ranks": states}, path)
    print(f"epoch {epoch}: saved {path} with the state of {len(states)} ranks", flush=True)


def fingerprint(model):
    """A short digest of the model's weights: equal on every rank when the ranks are in step."""
    digest = hashlib.sha1()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()[:12]


def worker(rank, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    world_size = dist.get_world_size()
    print(f"rank {rank} (pid {os.getpid()}) started", flush=True)
    x_train, y_train, x_val, y_val = load_data(args)
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(Classifier(args.hidden))  # rank 0's weights, on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    loss, accuracy = evaluate(model, x_val, y_val, args.val_batch_size, rank, world_size)
    if rank == 0:
        print(f"validation after 0 epochs: loss {loss:.6f}, accuracy {accuracy:.4f}", flush=True)
    seen_total = 0
    for epoch in range(1, args.epochs + 1):
        dist.barrier()  # start the clock together: the epoch's time is the slowest rank's
        start = time.perf_counter()
        steps, skipped, seen, train_loss = train_epoch(model, optimizer, x_train, y_train, epoch, args, rank,
                                                       world_size)
        dist.barrier()
        seconds = time.perf_counter() - start
        seen_total += seen
        print(f"rank {rank}: epoch {epoch}, {steps} steps, {skipped} skipped, loss {train_loss:.6f}", flush=True)
        loss, accuracy = evaluate(model, x_val, y_val, args.val_batch_size, rank, world_size)
        if rank == 0:
            print(f"validation after {epoch} epochs: loss {loss:.6f}, accuracy {accuracy:.4f} ({seconds:.2f} s)",
                  flush=True)
        rank_state = {"rng": torch.get_rng_state(), "seen": seen_total}
        if rank == 0:  # one copy is enough
            save_checkpoint(os.path.join(args.checkpoint_dir, "last.pt"), model, optimizer, epoch, rank_state)
    print(f"rank {rank}: done after {args.epochs} epochs, weights {fingerprint(model)}", flush=True)
    # Free DDP (its hooks make reference cycles, hence gc) before the process group: a DDP model
    # that outlives its group can abort the process at exit.
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
    parser = argparse.ArgumentParser(description="Train a small classifier with DDP, validate it, checkpoint it.")
    parser.add_argument("--world-size", type=positive_int, default=2, help="processes to start (default 2)")
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--batch-size", type=positive_int, default=16, help="global batch, split between the ranks")
    parser.add_argument("--val-batch-size", type=positive_int, default=6, help="validation batch on each rank")
    parser.add_argument("--train-size", type=positive_int, default=192)
    parser.add_argument("--val-size", type=positive_int, default=37)
    parser.add_argument("--hidden", type=positive_int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", help="where to save checkpoints (default: a new temporary folder)")
    parser.add_argument("--timeout", type=positive_int, default=30,
                        help="seconds a collective may wait before the process group gives up (default 30)")
    args = parser.parse_args()
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over {args.world_size} processes")
    temporary = args.checkpoint_dir is None
    args.checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="hang_training_")
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    with socket.socket() as s:  # a free port for the process group
        s.bind(("localhost", 0))
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(s.getsockname()[1]))
    try:
        mp.spawn(worker, args=(args,), nprocs=args.world_size)
    finally:
        if temporary:
            shutil.rmtree(args.checkpoint_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
