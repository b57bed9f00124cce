"""What crosses the process boundary in part talk: its tasks (a ring all-reduce, a sampler, the
collectives of the predictions), their sizes and scenarios, and what each rank reports."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autograde.protocol import Task

RING_SIZES = (12, 1001, 65537)  # 12 divides by 2, 3 and 4; 1001 and 65537 by none of them
COLLECTIVES_WORLD_SIZE = 4
# The collectives of notebook 10 and exercises/predict_collectives.py, on 4 ranks: each the call
# as the exercise shows it. Rank r's buffer starts as [r + 1, 10 * (r + 1)].
SCENARIOS: dict[str, str] = {
    "send_recv": "rank 0: dist.send(buffer, dst=1); rank 1: dist.recv(buffer, src=0)",
    "broadcast": "dist.broadcast(buffer, src=2)",
    "reduce": "dist.reduce(buffer, dst=0)",
    "all_reduce": "dist.all_reduce(buffer)",
    "all_reduce_max": "dist.all_reduce(buffer, op=dist.ReduceOp.MAX)",
    "all_gather": "dist.all_gather(out, buffer)",
    "gather": "dist.gather(buffer, out if rank == 0 else None, dst=0)",
    "scatter": "dist.scatter(buffer, pieces if rank == 0 else None, src=0)",
    "reduce_scatter": "dist.reduce_scatter(buffer, list(big.chunk(4)))",
    "split_sum": "part = torch.arange(1.0, 101.0)[25 * rank:25 * (rank + 1)].sum(); dist.all_reduce(part)",
}
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG")  # all_reduce(buffer, op=...) on the same buffers


# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # with DDP_LAB_COUNT_WORK=1, at destroy_process_group: the elements the process's PyTorch
    # operations produced plus the lines of the learner's file it ran (inprocess.py)
    "work": ("amount",),
}


@dataclass
class RingCase:
    """One call of the learner's ring_all_reduce on every rank: a size and a reduction."""

    case: int
    numel: int
    op: str                      # "sum" or "max"
    error: float                 # the largest difference from dist.all_reduce's result (inf: wrong shape)
    seconds: float               # the call's time on this rank (the median of the repeats)
    reference_seconds: float     # dist.all_reduce's, measured beside it


@dataclass
class RingReport:
    """What one rank of a ring run found (autograde/inprocess/runner.py writes it)."""

    world_size: int
    rank: int
    cases: list[RingCase] = field(default_factory=list)
    error: str | None = None     # the error the learner's code raised, if it did


@dataclass
class SamplerCase:
    """One rank's shard from the learner's sampler, for one data set size and set of options."""

    size: int
    shuffle: bool
    drop_last: bool
    seed: int
    epoch: int
    indices: list[int]           # what iterating the sampler gave
    length: int                  # what len(sampler) said
    again: bool                  # iterating it a second time gave the same indices


@dataclass
class SamplerReport:
    """What one rank of a sampler run found (autograde/inprocess/runner.py writes it)."""

    world_size: int
    rank: int
    cases: list[SamplerCase] = field(default_factory=list)
    error: str | None = None     # the error the learner's code raised, if it did


@dataclass
class CollectivesReport:
    """One rank's buffers before and after each collective of the course's scenarios, and the
    learner's predictions of them (autograde/inprocess/runner.py writes it)."""

    world_size: int
    rank: int
    buffers: dict[str, list[list[float]]] = field(default_factory=dict)  # scenario -> [before, after]
    predictions: dict[str, Any] | None = None   # the file's PREDICTIONS, as JSON
    error: str | None = None     # why they could not be read


@dataclass
class RingTask(Task):
    """ring_all_reduce against dist.all_reduce, for each tensor size and reduction."""

    sizes: list[int] = field(default_factory=lambda: list(RING_SIZES))
    ops: list[str] = field(default_factory=lambda: ["sum", "max"])
    repeats: int = 1


@dataclass
class SamplerTask(Task):
    """ShardSampler's shards, for each data set size, seed and epoch."""

    sizes: list[int] = field(default_factory=lambda: list(RING_SIZES))
    seeds: list[int] = field(default_factory=lambda: [0, 5])
    epochs: int = 3


@dataclass
class CollectivesTask(Task):
    """Every scenario for real, and the file's PREDICTIONS (`script` may be "": none to read)."""
