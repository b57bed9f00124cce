"""Activation checkpointing: keep less for backward, compute it again when backward needs it.

    python exercises/checkpointing.py                    # the bytes kept for backward, and the time, by runs
    python exercises/checkpointing.py --blocks 32 --width 512

backward() needs what the forward pass computed: every layer keeps its input (and some keep more)
until backward has used it. For a deep network at a large batch, these activations, not the weights,
fill the memory. Checkpointing cuts the blocks into runs and keeps only each run's input; in backward,
each run is computed again from its input, and its activations live only while backward goes through
it. The memory falls from one activation per block to one per run (and one run's, briefly), for about
one more forward pass of compute. Notebook 33 has hints you open when you want them.
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def runs_of(n_blocks, segments):
    """Where each run of consecutive blocks starts and ends: `segments` runs, as equal as possible, in order."""
    bounds = [round(i * n_blocks / segments) for i in range(segments + 1)]
    return list(zip(bounds, bounds[1:]))


def run_checkpointed(blocks, x, segments):
    """blocks(x) for an nn.Sequential `blocks`, with backward() giving the same gradients, while only the input
    of each of `segments` runs of consecutive blocks is kept for backward: nothing computed inside a run is
    kept, and every run, the last too, is computed again in backward. The runs are runs_of(len(blocks),
    segments). Uses torch.utils.checkpoint."""
    # TODO checkpointing: the contract above.
    for start, end in runs_of(len(blocks), segments):
        x = checkpoint(blocks[start:end], x, use_reentrant=False)
    return x


class Recompute(torch.autograd.Function):
    """y = run(x), keeping only x for backward; backward computes run(x) again and goes back through it."""

    @staticmethod
    def forward(ctx, x, run):
        # TODO checkpointing: run's output, keeping for backward nothing but x (and run).
        ctx.run = run
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, grad_output):
        # TODO checkpointing: the gradient of the loss with respect to x; the gradients of run's
        # parameters added into their .grad, as an ordinary backward pass would.
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(x.requires_grad)
        with torch.enable_grad():
            y = ctx.run(x)
        torch.autograd.backward(y, grad_output)
        return x.grad, None


def run_by_hand(blocks, x, segments):
    """run_checkpointed's contract, with Recompute in place of torch.utils.checkpoint."""
    # TODO checkpointing: the contract of run_checkpointed.
    for start, end in runs_of(len(blocks), segments):
        x = Recompute.apply(x, blocks[start:end])
    return x


# The rest weighs what a training step keeps for backward, and times it, for each number of runs.

def make_blocks(n_blocks, width):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(n_blocks)])


def kept_for_backward(forward):
    """The bytes of the tensors autograd keeps for backward while `forward()` runs (each buffer once), and
    forward()'s output."""
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    return sum(kept.values()), out


def step_seconds(blocks, x, forward, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        blocks.zero_grad(set_to_none=True)
        start = time.perf_counter()
        forward().pow(2).mean().backward()
        best = min(best, time.perf_counter() - start)
    return best


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="Activation checkpointing: the bytes kept for backward and the time.")
    parser.add_argument("--blocks", type=positive_int, default=16)
    parser.add_argument("--width", type=positive_int, default=256)
    parser.add_argument("--batch-size", type=positive_int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    blocks = make_blocks(args.blocks, args.width)
    x = torch.randn(args.batch_size, args.width, requires_grad=True)
    plain_bytes, _ = kept_for_backward(lambda: blocks(x))
    plain_time = step_seconds(blocks, x, lambda: blocks(x))
    print(f"{'forward':<34}{'kept for backward':>20}{'step time':>12}")
    print(f"{'plain':<34}{plain_bytes / 2**20:>17.2f} MB{plain_time * 1000:>9.0f} ms")
    for segments in sorted({1, 2, 4, args.blocks // 4, args.blocks} - {0}):
        for name, forward in (("torch.utils.checkpoint", run_checkpointed), ("by hand", run_by_hand)):
            kept, _ = kept_for_backward(lambda: forward(blocks, x, segments))
            seconds = step_seconds(blocks, x, lambda: forward(blocks, x, segments))
            label = f"{segments} runs, {name}"
            print(f"{label:<34}{kept / 2**20:>17.2f} MB{seconds * 1000:>9.0f} ms"
                  f"  ({seconds / plain_time:.2f} x plain)")


if __name__ == "__main__":
    main()
