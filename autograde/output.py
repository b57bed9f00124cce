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
