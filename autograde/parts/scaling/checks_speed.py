"""Throughput measured from traced runs, fairly: for the check that grades a speedup and for
`make bench`.

A run made with DDP_LAB_TRACE_STEPS=1 has a "step" event after every optimizer step of every
process: its time, and the images the model was given for it (autograde/parts/scaling/inprocess.py). With
DDP_LAB_STOP_AT_STEP=K every process records its parameters after step K and ends.

- `throughput`: the images of all processes over the steps after the warm-up, divided by the
  time the slowest process took for them (a run is as fast as its slowest rank).
- `verify`: the run did the work it is credited with: every process took the same number of
  steps, gave the model the same number of images in each, and ended with the same parameters.
- `alternating`: two measurements made in pairs, in alternating order (A then B, B then A, ...),
  so that a machine that slows down or speeds up meanwhile favours neither; `paired` makes such
  pairs of runs of 1 and N processes, and the median of the pairs' ratios is the speedup.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, TypeVar

from autograde.engine.run import Run
from autograde.protocol import ProcessTrace

T = TypeVar("T")


@dataclass(frozen=True)
class Throughput:
    images: int        # over the timed steps, all processes together
    seconds: float     # the slowest process's time for them
    steps: int         # timed steps per process
    processes: int

    @property
    def rate(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("inf")


def _stepping(run: Run) -> list[ProcessTrace]:
    return [t for t in run.traces.values() if t.named("step")]


def throughput(run: Run, warmup: int) -> Throughput:
    """Images per second over steps warmup+1 .. last: the clock starts at the end of step `warmup`
    (at least 1: a step's event is its end, and the first one also pays for starting up)."""
    if warmup < 1:
        raise ValueError("time after at least one untimed step")
    traces = _stepping(run)
    if not traces:
        raise ValueError(f"the {run.name} took no optimizer step")
    images, seconds, steps = 0, 0.0, []
    for trace in traces:
        events = trace.named("step")
        if len(events) <= warmup:
            raise ValueError(f"the {run.name} took {len(events)} steps, fewer than the {warmup + 1} it is timed over")
        timed = events[warmup - 1:]
        seconds = max(seconds, timed[-1]["t"] - timed[0]["t"])
        images += sum(e["images"] for e in timed[1:])
        steps.append(len(timed) - 1)
    return Throughput(images, seconds, min(steps), len(traces))


def verify(run: Run, processes: int, steps: int, batch: int) -> str | None:
    """What is wrong with the work a timed run did, or None: `processes` processes, each `steps`
    steps with `batch` images each, all ending with the same parameters (DDP keeps them equal;
    a process that skips its share of the work cannot)."""
    traces = _stepping(run)
    if len(traces) != processes:
        return f"{len(traces)} of {processes} processes took optimizer steps"
    for trace in traces:
        events = trace.named("step")
        if len(events) != steps:
            return f"{trace.label()} took {len(events)} optimizer steps, not {steps}"
        wrong = [e for e in events if e["images"] != batch]
        if wrong:
            return (f"{trace.label()} gave the model {wrong[0]['images']} images in its step {wrong[0]['n']}, "
                    f"not the batch of {batch}")
    ends = [e for t in traces for e in t.named("parameters") if e.get("when") == "stopped"]
    if len(ends) != processes:
        return f"{len(ends)} of {processes} processes reached the end of step {steps}"
    if len({e["sha1"] for e in ends}) != 1:
        return "the processes ended with different parameters: their work was not the same training"
    return None


@dataclass(frozen=True)
class Pair:
    one: Throughput
    many: Throughput

    @property
    def ratio(self) -> float:
        return self.many.rate / self.one.rate


def alternating(first: Callable[[int], T], second: Callable[[int], T], pairs: int) -> list[tuple[T, T]]:
    """`pairs` pairs (first(i), second(i)), made first-then-second for even i, second-then-first for odd i."""
    found = []
    for i in range(pairs):
        if i % 2 == 0:
            a = first(i)
            b = second(i)
        else:  # the other one first
            b = second(i)
            a = first(i)
        found.append((a, b))
    return found


def paired(make: Callable[[int, int], Run], n: int, pairs: int, warmup: int) -> list[Pair]:
    """`pairs` pairs of runs, 1 and n processes, in alternating order; `make(processes, index)`
    makes one run. Raises ValueError when a run cannot be timed."""
    made = alternating(lambda i: throughput(make(1, i), warmup), lambda i: throughput(make(n, i), warmup), pairs)
    return [Pair(one, many) for one, many in made]


def median_ratio(found: list[Pair]) -> float:
    return statistics.median(p.ratio for p in found)
