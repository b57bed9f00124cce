"""Part talk (notebooks 10-13) inside the learner's processes: the tasks that call a learner's
ring_all_reduce, ShardSampler and PREDICTIONS in real process groups, the collectives of the
scenarios made for real, and the work counting that tells pi's shares apart.

- `ring`: for each tensor size and reduction, every rank makes a tensor of its own, computes what
  `dist.all_reduce` gives for it, and calls `ring_all_reduce(tensor, op)`. Each call is bracketed by
  "case_start"/"case_end" trace events, so that the messages traced between them are that call's.
- `sampler`: for each data set size, shuffle, drop_last, seed and epoch, every rank builds
  `ShardSampler(range(size), num_replicas=N, rank=r, shuffle=..., seed=..., drop_last=...)`, calls
  `set_epoch(epoch)` and iterates it twice; odd ranks go through the cases in the reverse order, so
  that a sampler that draws from a global random state, not from its seed, gives ranks that disagree.
- `collectives`: every rank makes each call of protocol.SCENARIOS (and all_reduce with each
  reduction) for real and records its buffer before and after; with a script, it also reads the
  file's PREDICTIONS (data only: no call of the learner's runs).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from types import FrameType
from typing import Any

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import json_value, learner_module, short_error
from autograde.parts.talk.reports import (
    OPS,
    SCENARIOS,
    CollectivesReport,
    CollectivesTask,
    RingCase,
    RingReport,
    RingTask,
    SamplerCase,
    SamplerReport,
    SamplerTask,
)
from autograde.protocol import performs
from autograde.settings import COUNT_WORK


@performs(RingTask)
def ring(rank: int, options: RingTask, device: Any) -> RingReport:
    import torch
    import torch.distributed as dist

    report = RingReport(options.world_size, rank)
    try:
        ring_all_reduce = getattr(learner_module(options.script), "ring_all_reduce")
    except BaseException as err:  # an error at import: the report says it, the others stop too
        report.error = short_error(err, options.script)
        return report
    reductions = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    case = 0
    for numel in options.sizes:
        for op in options.ops:
            generator = torch.Generator().manual_seed(1000 * rank + numel)
            mine = torch.randn(numel, generator=generator).to(device)
            expected = mine.clone()
            dist.all_reduce(expected, op=reductions[op])
            ring_seconds, reference_seconds, error = [], [], float("inf")
            warm_up = 1 if options.repeats > 1 else 0  # when timing: a first call untimed (first messages set up links)
            for repeat in range(options.repeats + warm_up):
                tensor = mine.clone()
                dist.barrier()
                tracer.emit("case_start", case=case, world_size=options.world_size)
                started = time.perf_counter()
                try:
                    returned = ring_all_reduce(tensor, op)
                except BaseException as err:
                    report.error = short_error(err, options.script)
                    return report
                if device.type == "cuda":
                    torch.cuda.synchronize()  # GPU work is queued: wait for it before reading the clock
                if repeat >= warm_up:
                    ring_seconds.append(time.perf_counter() - started)
                tracer.emit("case_end", case=case)
                result = returned if isinstance(returned, torch.Tensor) else tensor  # in place, or returned
                if repeat == 0 and result.shape == expected.shape:
                    error = float((result.double() - expected.double()).abs().max().cpu()) if numel else 0.0
                reference = mine.clone()
                dist.barrier()
                started = time.perf_counter()
                dist.all_reduce(reference, op=reductions[op])
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if repeat >= warm_up:
                    reference_seconds.append(time.perf_counter() - started)
            report.cases.append(RingCase(case, numel, op, error, statistics.median(ring_seconds),
                                         statistics.median(reference_seconds)))
            case += 1
    return report


@performs(SamplerTask)
def sampler(rank: int, options: SamplerTask, device: Any) -> SamplerReport:
    import itertools

    report = SamplerReport(options.world_size, rank)
    try:
        sampler_class = getattr(learner_module(options.script), "ShardSampler")
        cases = list(itertools.product(options.sizes, (True, False), (False, True), options.seeds, range(options.epochs)))
        for size, shuffle, drop_last, seed, epoch in cases[::-1] if rank % 2 else cases:
            sampler = sampler_class(range(size), num_replicas=options.world_size, rank=rank, shuffle=shuffle,
                                    seed=seed, drop_last=drop_last)
            sampler.set_epoch(epoch)
            indices = [int(i) for i in sampler]
            report.cases.append(SamplerCase(size, shuffle, drop_last, seed, epoch, indices, len(sampler),
                                            [int(i) for i in sampler] == indices))
    except BaseException as err:
        report.error = short_error(err, options.script)
    return report


def scenario(name: str, rank: int, n: int) -> tuple[list[float], list[float]]:
    """Run one scenario on this rank: its buffer before and after (a gather's or all_gather's
    `out`, where there is one, as one list; a reduce-scatter's input `big` as `before`)."""
    import torch
    import torch.distributed as dist

    buffer = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
    before = buffer.tolist()
    if name == "send_recv":
        if rank == 0:
            dist.send(buffer, dst=1)
        elif rank == 1:
            dist.recv(buffer, src=0)
    elif name == "broadcast":
        dist.broadcast(buffer, src=2)
    elif name == "reduce":
        dist.reduce(buffer, dst=0)
    elif name == "all_reduce":
        dist.all_reduce(buffer)
    elif name == "all_reduce_max":
        dist.all_reduce(buffer, op=dist.ReduceOp.MAX)
    elif name == "all_gather":
        out = [torch.zeros(2) for _ in range(n)]
        dist.all_gather(out, buffer)
        return before, torch.cat(out).tolist()
    elif name == "gather":
        gathered = [torch.zeros(2) for _ in range(n)] if rank == 0 else None
        dist.gather(buffer, gathered, dst=0)
        return before, torch.cat(gathered).tolist() if gathered else before
    elif name == "scatter":
        pieces = [torch.tensor([100.0 + 2 * k, 101.0 + 2 * k]) for k in range(n)] if rank == 0 else None
        dist.scatter(buffer, pieces, src=0)
    elif name == "reduce_scatter":
        big = torch.arange(1.0, 2 * n + 1) * (rank + 1)  # rank r: [1, 2, ..., 2N] * (r + 1)
        dist.reduce_scatter(buffer, list(big.chunk(n)))
        return big.tolist(), buffer.tolist()
    elif name == "split_sum":  # each rank sums its quarter of 1..100, then all add up the parts
        share = 100 // n
        part = torch.arange(1.0, 101.0)[share * rank:share * (rank + 1)].sum().reshape(1)
        before = part.tolist()
        dist.all_reduce(part)
        return before, part.tolist()
    elif name.startswith("op_"):
        dist.all_reduce(buffer, op=getattr(dist.ReduceOp, name.removeprefix("op_")))
    return before, buffer.tolist()


@performs(CollectivesTask)
def collectives(rank: int, options: CollectivesTask, device: Any) -> CollectivesReport:
    report = CollectivesReport(options.world_size, rank)
    for name in [*SCENARIOS, *(f"op_{op}" for op in OPS)]:
        report.buffers[name] = list(scenario(name, rank, options.world_size))
    if options.script:
        try:
            predictions = getattr(learner_module(options.script), "PREDICTIONS")
            report.predictions = {k: json_value(v) for k, v in dict(predictions).items()}
        except BaseException as err:
            report.error = short_error(err, options.script)
    return report



_work: list[int] = []  # work done so far (elements and lines, see install), when it is counted


def forked_afresh() -> None:
    """A process forked from the warm server (autograde/inprocess/warm_server.py) counts its own work from zero."""
    if _work:
        _work[0] = 0


def _count_lines(caller: FrameType | None) -> None:
    """From now on (the process group has started), also count each line of the learner's file
    that runs: a share computed in a Python loop is work too. The frames of the file that are
    running already (the function that started the group) are counted from here on as well."""
    known: dict[str, bool] = {}

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            _work[0] += 1
        return local

    def started(frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if name not in known:
            known[name] = tracer.learner_frame(frame)
        return local if known[name] else None

    frame = caller
    while frame is not None:
        if started(frame, "call", None):
            frame.f_trace = local
        frame = frame.f_back
    sys.settrace(started)


def install() -> None:
    """Count, from now on, the elements of every tensor that a PyTorch operation produces, and
    (once the process group has started) every line of the learner's file that runs: how much
    this process computed, whatever its code looks like, vectorised or a loop (a check can then
    tell a process that computed its share from one that computed everything). Work done
    elsewhere (numpy, say) is not seen. Only with $DDP_LAB_COUNT_WORK=1 (the pi check's runs)."""
    if os.environ.get(COUNT_WORK) != "1":
        return
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    _work.append(0)

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            result = func(*args, **(kwargs or {}))
            _work[0] += sum(t.numel() for t in tree_leaves(result) if isinstance(t, torch.Tensor))
            return result

    Counter().__enter__()  # for the rest of the process
    tracer.hook("group_started", _count_lines)
    tracer.hook("group_ending", lambda: tracer.emit("work", amount=_work[0]))  # while the rank is still known
