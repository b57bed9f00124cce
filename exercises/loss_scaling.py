"""Dynamic loss scaling for fp16 training, by hand: the decisions torch.amp.GradScaler makes.

    python exercises/loss_scaling.py                      # yours beside torch.amp.GradScaler, step by step
    python exercises/loss_scaling.py --init-scale 1024    # a scale that never overflows here

In fp16 the smallest normal number is about 6e-5 and the largest 65504: many gradients are too small
to hold, and become 0. Multiplying the loss by a large scale before backward() multiplies every
gradient by it too, which lifts the small ones into range; the optimizer must then see them divided
by the same scale. Too large a scale makes some gradient overflow into inf (or nan): then the step is
not taken at all, and the scale shrinks. After many steps in a row without overflow, it grows again,
to keep the small gradients in range. Notebook 32 has hints you open when you want them.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LossScaler:
    """Scales the loss, unscales the gradients, skips the steps whose gradients overflowed, and adapts the scale.

    A training step: optimizer.zero_grad(); scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
    """

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        # TODO loss_scaling: the scale starts at init_scale.
        pass  # your code

    def get_scale(self):
        """The scale the next loss is multiplied by."""
        # TODO loss_scaling: the current scale, a number.
        return None  # your code

    def scale(self, loss):
        # TODO loss_scaling: the loss multiplied by the current scale.
        return None  # your code

    def step(self, optimizer):
        # TODO loss_scaling: the gradients of the optimizer's parameters divided by the scale (in place); when
        # any of them holds an inf or a nan, the optimizer does not step (its state and the parameters stay as
        # they were); otherwise it steps once.
        pass  # your code

    def update(self):
        # TODO loss_scaling: after a step that was skipped, the scale is multiplied by backoff_factor; after
        # growth_interval steps in a row that were taken, by growth_factor. The count starts again after either.
        pass  # your code


# The rest trains a small network with an fp16 forward pass twice, from the same weights on the same
# batches: once with your LossScaler, once with torch.amp.GradScaler, and shows their decisions side by side.

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def batches(steps, batch_size):
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, 10, generator=generator)
    for _ in range(steps):
        x = torch.randn(batch_size, 32, generator=generator)
        yield x, (x @ teacher).argmax(dim=1)


def train(scaler, args):
    """The scale before each step, whether each step was skipped, and the weights at the end."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scales, skipped = [], []
    for x, y in batches(args.steps, args.batch_size):
        before = [p.detach().clone() for p in model.parameters()]
        scales.append(float(scaler.get_scale()))
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):  # the forward pass in fp16, as on a GPU
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        skipped.append(all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
    return scales, skipped, [p.detach() for p in model.parameters()]


def power_of_two(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or not math.log2(value).is_integer():
        raise argparse.ArgumentTypeError(f"{value:g} is not a power of two (1024, 65536, ...)")
    return value


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main():
    parser = argparse.ArgumentParser(description="Dynamic loss scaling by hand, beside torch.amp.GradScaler.")
    parser.add_argument("--init-scale", type=power_of_two, default=2.0**24, help="large enough to overflow at first")
    parser.add_argument("--growth-interval", type=positive_int, default=10)
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = dict(init_scale=args.init_scale, growth_interval=args.growth_interval)
    mine = train(LossScaler(**options), args)
    theirs = train(torch.amp.GradScaler("cpu", **options), args)
    print(f"{'step':>4}  {'your scale':>12} {'skipped':>8}   {'GradScaler':>12} {'skipped':>8}")
    for step, (a, s, b, t) in enumerate(zip(mine[0], mine[1], theirs[0], theirs[1]), 1):
        mark = "" if (a, s) == (b, t) else "   <- differs"
        print(f"{step:>4}  {a:>12g} {str(s):>8}   {b:>12g} {str(t):>8}{mark}")
    difference = max((p - q).abs().max().item() for p, q in zip(mine[2], theirs[2]))
    print(f"steps skipped: yours {sum(mine[1])}, GradScaler's {sum(theirs[1])}; largest difference of the final "
          f"weights {difference:.1e}")


if __name__ == "__main__":
    main()
