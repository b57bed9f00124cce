"""Where a rank's memory goes: predicted for DDP and each ZeRO stage, before anything runs.

    python exercises/memory_budget.py                          # the part's MLP, 1 to 8 processes
    python exercises/memory_budget.py --layers 24 --width 4096 --batch-size 8 --json-file budget.json

Training a model with Adam in float32, a rank holds four things: the parameters, their gradients,
Adam's state (two running averages per parameter) and the activations autograd keeps for backward.
ZeRO (notebooks 21, 30 and 34) shards the first three over the processes, one more at each stage:
stage 1 the optimizer's state, stage 2 the gradients too, stage 3 the parameters too. Stage 0 is DDP,
which shards nothing. You write the function that says how many bytes each takes on one rank; the
check measures them on real runs of every stage.
"""
import argparse
import json

import torch.nn as nn

QUANTITIES = ("parameters", "gradients", "optimizer_state", "activations", "peak_parameters")


def bytes_per_rank(model, batch_size, stage, world_size):
    """What one rank holds to train `model` with Adam: a dict with a number of bytes for each of QUANTITIES.

    model: an nn.Sequential of nn.Linear and nn.ReLU (not in place) in float32, ending with an nn.Linear, every
    parameter trained; batch_size: the examples this rank's forward pass sees; stage: 0 (DDP), 1, 2 or 3 (ZeRO);
    world_size: the processes.
    """
    # TODO memory_budget: return a dict of the bytes for each of QUANTITIES, each within 1% of what one rank holds:
    # "parameters" between steps, "gradients" when the optimizer steps, "optimizer_state" Adam's running averages
    # (its step counts aside), "activations" what autograd keeps for backward during the forward pass of
    # `batch_size` examples (the parameters and the loss aside, each tensor once), "peak_parameters" the most bytes
    # of parameters held at once during the step. What a stage shards is split evenly over the world_size processes.
    # At stage 3 each nn.Linear is a unit: each rank keeps its shard of the unit apart, and the unit is gathered
    # whole, into new memory, just before its forward and again before its backward, and freed after each.
    pass  # your code


# The rest is given: your predictions for a model, every stage, 1 to 8 processes.

def make_model(layers, width, inputs=784, outputs=10):
    sizes = [inputs] + [width] * (layers - 1) + [outputs]
    modules = []
    for k in range(layers):
        modules += [nn.Linear(sizes[k], sizes[k + 1]), nn.ReLU()]
    return nn.Sequential(*modules[:-1])  # no ReLU after the last layer


def main():
    parser = argparse.ArgumentParser(description="Bytes per rank, predicted, for DDP and ZeRO stages 1-3.")
    parser.add_argument("--layers", type=int, default=3, help="nn.Linear layers of the MLP")
    parser.add_argument("--width", type=int, default=256, help="the hidden layers' width")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per rank")
    parser.add_argument("--json-file", help="also write every prediction here")
    args = parser.parse_args()
    if args.layers < 1 or args.width < 1 or args.batch_size < 1:
        parser.error("--layers, --width and --batch-size must be at least 1")
    model = make_model(args.layers, args.width)
    print(f"an MLP of {args.layers} layers, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.batch_size} examples per rank; MB per rank:")
    print(f"{'stage':>5} {'ranks':>5} " + " ".join(f"{q:>15}" for q in QUANTITIES) + f" {'total':>9}")
    print("(total: the first four; the peak is the most parameters held at once, included in no total)")
    found = []
    for stage in range(4):
        for world_size in (1, 2, 4, 8):
            predicted = bytes_per_rank(model, args.batch_size, stage, world_size)
            found.append({"stage": stage, "world_size": world_size, **predicted})
            print(f"{stage:>5} {world_size:>5} " + " ".join(f"{predicted[q] / 2**20:>15.2f}" for q in QUANTITIES)
                  + f" {sum(predicted[q] for q in QUANTITIES[:4]) / 2**20:>9.2f}")  # the peak is not one more
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(found, f)


if __name__ == "__main__":
    main()
