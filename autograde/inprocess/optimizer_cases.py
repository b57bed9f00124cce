"""What an optimizer's check moves, inside the learner's processes (LARS's and LAMB's, parts optimizers and
memory): seven parameters of every kind in two param groups, their gradients step by step, and how far a
result is from its reference."""
from __future__ import annotations

from typing import Any

# (what it stands for, its initial value, its param group, whether its gradient is zero)
Case = tuple[str, Any, int, bool]


def parameter_kinds() -> list[Case]:
    """A linear layer's weight and bias, a convolution's weight, a norm's scale, a weight whose gradient is zero, a
    weight of zeros (all in group 0 but the last two), and one in a second param group."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return [("a linear layer's weight", torch.randn(8, 5, generator=generator), 0, False),
            ("a linear layer's bias", torch.randn(8, generator=generator), 0, False),
            ("a convolution's weight", torch.randn(4, 3, 3, 3, generator=generator), 0, False),
            ("a norm layer's scale", torch.ones(4), 0, False),
            ("a weight with a zero gradient", torch.randn(5, 5, generator=generator), 0, True),
            ("a weight of zeros", torch.zeros(6, 4), 1, False),
            ("a weight in the second param group", torch.randn(7, 3, generator=generator), 1, False)]


def gradients(params: list[Case], steps: int) -> list[list[Any]]:
    """Each step's gradient of each parameter (zeros where the case says so)."""
    import torch

    generator = torch.Generator().manual_seed(1)
    return [[torch.zeros_like(p) if zero else 0.1 * torch.randn(p.shape, generator=generator)
             for _, p, _, zero in params] for _ in range(steps)]


def relative(a: Any, b: Any, floor: float = 1.0) -> float:
    """The largest |a - b|, relative to b's largest entry (or `floor`, if that is larger); inf where a is not finite
    or has another shape."""
    import torch

    if a.shape != b.shape or not torch.isfinite(a).all():
        return float("inf")
    return float((a.double() - b.double()).abs().max()) / max(floor, float(b.double().abs().max()))
