"""Reads what the lab's training script prints.

The script prints one line per epoch, for example

    epoch   2 | time 0:00:09 | epoch time   4.31 s | images/sec     148.5 | val loss 0.6121 | val accuracy 0.7834
"""
from __future__ import annotations

import re
from dataclasses import dataclass

EPOCH_LINE = re.compile(
    r"epoch\s+(?P<epoch>\d+) \| time (?P<time>\d+:\d\d:\d\d) \| epoch time\s+(?P<epoch_time>[\d.]+) s"
    r" \| images/sec\s+(?P<images_per_sec>[\d.]+) \| val loss (?P<val_loss>[\d.]+|nan)"
    r" \| val accuracy (?P<val_accuracy>[\d.]+|nan)")


@dataclass(frozen=True)
class Epoch:
    """One epoch line: the numbers as printed."""

    epoch: int
    epoch_time: float
    images_per_sec: float
    val_loss: float
    val_accuracy: float


def epochs(output: str) -> list[Epoch]:
    """Every epoch line in `output`, in order."""
    return [Epoch(int(m["epoch"]), float(m["epoch_time"]), float(m["images_per_sec"]),
                  float(m["val_loss"]), float(m["val_accuracy"]))
            for m in EPOCH_LINE.finditer(output)]


@dataclass(frozen=True)
class Number:
    """A number as printed: its value, how many decimals it was printed with, and whether a % followed."""

    value: float
    decimals: int
    percent: bool

    def as_fraction(self) -> tuple[float, float]:
        """The value as a fraction, and half a unit of its last printed digit (its printing precision)."""
        scale = 100.0 if self.percent else 1.0
        return self.value / scale, 0.5 * 10 ** -self.decimals / scale

    def matches(self, expected: float, slack: float = 0.0, fraction: bool = False) -> bool:
        """Whether this number is `expected` to printing precision (2 decimals at least, or a
        percentage when `fraction`), give or take `slack` for rounding inside the script."""
        if self.percent and not fraction:
            return False
        if not self.percent and self.decimals < 2:
            return False
        value, half_unit = self.as_fraction() if fraction else (self.value, 0.5 * 10 ** -self.decimals)
        return abs(value - expected) <= half_unit + slack


NUMBER = re.compile(r"(?<![\w.])[-+]?(\d+(?:\.(\d*))?|\.(\d+))(?:[eE][-+]?\d+)?(\s*%)?")


def numbers(text: str) -> list[Number]:
    """Every number in `text`, in any wording: 12, 0.7834, 78.34%, 1.5e+02."""
    found = []
    for m in NUMBER.finditer(text):
        try:
            value = float(m.group(0).rstrip("% \t"))
        except ValueError:
            continue
        digits = m.group(2) if m.group(2) is not None else (m.group(3) or "")
        found.append(Number(value, len(digits), bool(m.group(4))))
    return found
