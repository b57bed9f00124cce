"""Calls the functions a learner writes in an exercise file, in launched processes that form a
real process group, for the checks that judge a function rather than a whole program.

    python -m autograde.learner_processes.tasks ring --script exercises/ring_allreduce.py \\
        --world-sizes 2 3 4 --out DIR [--sizes 12 1001] [--ops sum max] [--repeats 1]
    python -m autograde.learner_processes.tasks sampler --script exercises/shard_sampler.py \\
        --world-sizes 1 2 3 4 --out DIR [--sizes 12 10 13] [--seeds 0 5] [--epochs 3]
    python -m autograde.learner_processes.tasks collectives [--script exercises/predict_collectives.py] \\
        --world-sizes 4 --out DIR
    python -m autograde.learner_processes.tasks calls --script exercises/scaling_model.py --out DIR \\
        --calls '[["speedup", [{"1": 20.0, "2": 12.5}]], ["predict_time", [[60, 3, 1.5], 16]]]'

For each world size in turn, a process group of that many processes is started (forked from
this one, which has imported torch already: a launch costs one import of torch, not one per
process). `ring`: every rank imports the learner's file as a module (its `if __name__ == "__main__":`
block does not run), then, for each tensor size and reduction, makes a tensor of its own,
computes what `dist.all_reduce` gives for it, and calls `ring_all_reduce(tensor, op)`. Each
call is bracketed by "case_start"/"case_end" trace events, so that the messages the tracer
records between them are that call's. `sampler`: every rank imports the file, then, for each data set size, shuffle, drop_last, seed
and epoch, builds `ShardSampler(range(size), num_replicas=N, rank=r, shuffle=..., seed=...,
drop_last=...)`, calls `set_epoch(epoch)` and iterates it twice; odd ranks go through the
cases in the reverse order, so that a sampler that draws from a global random state, not from
its seed, gives ranks that disagree.

`collectives`: every rank makes each call of SCENARIOS (and all_reduce with each reduction) for
real and records its buffer before and after; with --script, it also reads the file's
PREDICTIONS (data only: no call of the learner's runs).

`calls`: no process group. This process imports the file and calls each named plain function
with the JSON arguments given (an object whose keys are all whole numbers becomes a dict with
int keys: {N: seconds}), in order, and writes what each returned, or the error it raised, as a
`CallsReport` in `DIR/1-0.json`.

`zero`: every rank wraps the same model in DistributedDataParallel (which averages the
gradients), trains it 3 steps with the file's `ShardedOptimizer(params, torch.optim.AdamW, **options)`
and, beforehand, with plain AdamW, and records each parameter's difference from the plain run and
the bytes of optimizer state the rank held (`ZeroReport`).

Rank r of N processes writes what it found to `DIR/N-r.json` (a `RingReport`, a
`SamplerReport` or a `CollectivesReport`).

The processes use NCCL, one GPU each, where there are GPUs enough (`ddp` and `zero`: never),
else gloo on the CPU. The
checker never imports the learner's file itself: this module runs in processes of its own.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from autograde.protocol import (Call, CallsReport, CollectivesReport, DdpCase, DdpReport, RingCase,
                                       RingReport, SamplerCase, SamplerReport, ZeroParam, ZeroReport)
from autograde.learner_processes.lab import short_error

GROUP_TIMEOUT = datetime.timedelta(seconds=60)  # the checker stops a stalled run long before
CPU_TASKS = ("ddp", "zero")


def _learner_module(script: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("learner_exercise", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _ring(rank: int, options: argparse.Namespace, device: Any) -> RingReport:
    import torch
    import torch.distributed as dist

    from autograde.learner_processes.tracer import emit

    report = RingReport(options.world_size, rank)
    try:
        ring_all_reduce = getattr(_learner_module(options.script), "ring_all_reduce")
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
                emit("case_start", case=case, world_size=options.world_size)
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
                emit("case_end", case=case)
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


def _sampler(rank: int, options: argparse.Namespace, device: Any) -> SamplerReport:
    import itertools

    report = SamplerReport(options.world_size, rank)
    try:
        sampler_class = getattr(_learner_module(options.script), "ShardSampler")
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


def _scenario(name: str, rank: int, n: int) -> tuple[list[float], list[float]]:
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


def _collectives(rank: int, options: argparse.Namespace, device: Any) -> CollectivesReport:
    report = CollectivesReport(options.world_size, rank)
    for name in [*SCENARIOS, *(f"op_{op}" for op in OPS)]:
        report.buffers[name] = list(_scenario(name, rank, options.world_size))
    if options.script:
        try:
            predictions = getattr(_learner_module(options.script), "PREDICTIONS")
            report.predictions = {k: _json_value(v) for k, v in dict(predictions).items()}
        except BaseException as err:
            report.error = short_error(err, options.script)
    return report


# The hand-made DDPs of exercises/ddp_by_hand.py ------------------------------------------------

DDP_STEPS, DDP_BATCH_PER_RANK, DDP_LR = 3, 4, 0.5


def ddp_model(seed: int) -> Any:
    """The model every hand-made DDP is tried on: a weight used twice (tied), a frozen layer and a
    layer the forward pass never uses, so a wrapper must cope with gradients that are shared,
    absent by design and absent by accident; and a buffer (`shift`, no parameter: it has no
    gradient) that the forward pass adds, drawn from the seed like the weights, so a wrapper that
    broadcasts rank 0's parameters but not its buffers trains another model on every other rank."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Awkward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(16, 32, bias=False)
            self.hidden = nn.Linear(32, 32)
            self.frozen = nn.Linear(32, 32)
            self.frozen.requires_grad_(False)
            self.unused = nn.Linear(32, 32)
            # made last, so that the layers' weights are those the same seed gave before it existed
            self.register_buffer("shift", 0.5 * torch.randn(32))

        def forward(self, x: Any) -> Any:
            h = torch.relu(self.hidden(torch.relu(self.embed(x))) + self.shift)
            return F.linear(self.frozen(h), self.embed.weight.t())  # the embedding's weight, tied

    torch.manual_seed(seed)
    return Awkward()


MEGABYTES = (1024 * 1024, 1000 * 1000)  # a megabyte as DDP counts it (bucket_cap_mb), and as the SI does


def bucket_plan(model: Any, bucket_size_mb: float, megabyte: int = MEGABYTES[0],
                past_the_size: bool = False) -> list[list[tuple[str, int]]]:
    """Buckets of `model`, each a list of (parameter name, numel), as the exercise asks: the trainable
    parameters in reverse order, a new bucket whenever the next would make the current one larger
    than bucket_size_mb (a parameter larger than that alone in one). `past_the_size`: DDP's own
    reducer's rule instead, which closes a bucket once it reaches the size, so that its last
    parameter may take it past."""
    limit, size = bucket_size_mb * megabyte, 0.0
    buckets: list[list[tuple[str, int]]] = [[]]
    for name, p in reversed([(n, p) for n, p in model.named_parameters() if p.requires_grad]):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and (size >= limit if past_the_size else size + nbytes > limit):
            buckets.append([])
            size = 0.0
        buckets[-1].append((name, p.numel()))
        size += nbytes
    return buckets


def bucket_plans_named(model: Any, bucket_size_mb: float) -> list[list[list[tuple[str, int]]]]:
    """Every plan bucket_plans() gives, in the same order, each bucket a list of (parameter name, numel)."""
    plans: list[list[list[tuple[str, int]]]] = []
    numels: list[list[int]] = []
    for past_the_size in (False, True):
        for megabyte in MEGABYTES:
            plan = bucket_plan(model, bucket_size_mb, megabyte, past_the_size)
            if [sum(n for _, n in b) for b in plan] not in numels:
                numels.append([sum(n for _, n in b) for b in plan])
                plans.append(plan)
    return plans


def _differs_from_rank_0(model: Any) -> dict[str, list[str]]:
    """The parameters and buffers of `model` that do not hold rank 0's initial values (ddp_model(0)'s),
    by name: what a wrapper's broadcast left unsynchronised. No collective: every rank can build rank 0's model."""
    import torch

    first = ddp_model(0)
    return {kind: [name for (name, mine), (_, theirs) in zip(getattr(model, f"named_{kind}")(),
                                                          getattr(first, f"named_{kind}")())
                   if not torch.equal(mine.detach(), theirs.detach())]
            for kind in ("parameters", "buffers")}


def bucket_plans(model: Any, bucket_size_mb: float) -> list[list[int]]:
    """The numels of the buckets of every correct reading of "buckets of bucket_size_mb" (the
    exercise's rule or DDP's reducer's, a megabyte of 2**20 bytes or of 10**6), each in the order they
    fill; the exercise's own first. Every one of them is reverse order, one bucket per all_reduce."""
    plans: list[list[int]] = []
    for past_the_size in (False, True):
        for megabyte in MEGABYTES:
            plan = [sum(n for _, n in b) for b in bucket_plan(model, bucket_size_mb, megabyte, past_the_size)]
            if plan not in plans:
                plans.append(plan)
    return plans


def _ddp_batches(world_size: int) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(0)
    n = DDP_BATCH_PER_RANK * world_size
    return [(torch.randn(n, 16, generator=generator), torch.randint(0, 16, (n,), generator=generator))
            for _ in range(DDP_STEPS)]


def _train_whole(model: Any, batches: list[tuple[Any, Any]], step: Callable[[Any, Any], None]) -> list[Any]:
    import torch

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=DDP_LR)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        step(x, y)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _largest_difference(a: list[Any], b: list[Any]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def _ddp(rank: int, options: argparse.Namespace, device: Any) -> DdpReport:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from autograde.learner_processes.tracer import emit

    report = DdpReport(options.world_size, rank)
    n = options.world_size
    batches = _ddp_batches(n)
    mine = slice(rank * DDP_BATCH_PER_RANK, (rank + 1) * DDP_BATCH_PER_RANK)
    single = ddp_model(0)  # one process, the whole batch: what data parallelism must reproduce
    whole = _train_whole(single, batches, lambda x, y: F.cross_entropy(single(x), y).backward())
    reference = DistributedDataParallel(ddp_model(0), find_unused_parameters=True)
    by_ddp = _train_whole(reference.module, batches,
                          lambda x, y: F.cross_entropy(reference(x[mine]), y[mine]).backward())
    try:
        wrapper = getattr(_learner_module(options.script), options.wrapper)
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for case, bucket_size_mb in enumerate(options.bucket_sizes or [None]):
        model = ddp_model(rank)  # ranks other than 0 start elsewhere: the wrapper must broadcast rank 0's
        found = DdpCase(case, bucket_size_mb, float("inf"), float("inf"),
                        bucket_plans(model, bucket_size_mb) if bucket_size_mb is not None else [])
        try:
            wrapped = wrapper(model) if bucket_size_mb is None else wrapper(model, bucket_size_mb)
            # what the wrapper's broadcast left as this rank's own, and (BucketedDDP) the buckets by name
            emit("wrapped", case=case, differs=_differs_from_rank_0(model),
                 buckets=bucket_plans_named(model, bucket_size_mb) if bucket_size_mb is not None else [])

            def step(x: Any, y: Any) -> None:
                emit("case_start", case=case, world_size=n)
                F.cross_entropy(wrapped(x[mine]), y[mine]).backward()
                emit("sync_start")
                wrapped.finish_gradient_synchronization()
                emit("sync_end")
                emit("case_end", case=case)

            trained = _train_whole(model, batches, step)
            found.from_single, found.from_ddp = _largest_difference(trained, whole), _largest_difference(trained, by_ddp)
        except BaseException as err:
            found.error = short_error(err, options.script)
            report.cases.append(found)
            return report
        report.cases.append(found)
    return report


# The sharded optimizer (ZeRO stage 1) of exercises/sharded_optimizer.py -----------------------------

ZERO_STEPS, ZERO_OPTIONS = 3, {"lr": 0.01, "weight_decay": 0.1, "betas": (0.9, 0.95)}


def zero_model(seed: int) -> Any:
    """The model a sharded optimizer is tried on: 13 tensors (neither 2 nor 3 divides their number,
    so a shard cut by count with a floor drops some) of very different sizes (so that shards by
    count, not by size, are lopsided)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(16, 64, bias=False)]
    for _ in range(5):
        layers += [nn.ReLU(), nn.Linear(64, 64)]
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(64, 16))


def optimizer_state_bytes(skip: tuple[Any, ...] = ()) -> int:
    """The bytes of every tensor held in the state of every torch.optim.Optimizer alive in this
    process (each tensor once, however many optimizers share it), except those in `skip`: where
    the learner keeps it (an inner optimizer, a subclass, torch's ZeroRedundancyOptimizer) does
    not matter."""
    import gc

    import torch

    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.optim.Optimizer) and not any(obj is s for s in skip):
            for state in obj.state.values():
                for value in state.values():
                    if torch.is_tensor(value) and id(value) not in seen:
                        seen.add(id(value))
                        total += value.numel() * value.element_size()
    return total


def _zero(rank: int, options: argparse.Namespace, device: Any) -> ZeroReport:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from autograde.learner_processes.tracer import emit

    report = ZeroReport(options.world_size, rank)
    n, share = options.world_size, DDP_BATCH_PER_RANK
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n * share, 16, generator=generator), torch.randint(0, 16, (n * share,), generator=generator))
               for _ in range(ZERO_STEPS)]
    mine = slice(rank * share, (rank + 1) * share)

    def train(model: Any, optimizer: Any) -> None:
        for step, (x, y) in enumerate(batches):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[mine]), y[mine]).backward()  # DDP averages the gradients
            emit("case_start", case=step, world_size=n)
            optimizer.step()
            emit("case_end", case=step)

    reference = DistributedDataParallel(zero_model(0))  # every rank the same: the unsharded optimizer
    plain = torch.optim.AdamW(reference.parameters(), **ZERO_OPTIONS)  # type: ignore[arg-type]
    train(reference, plain)
    report.full_state_bytes = optimizer_state_bytes()
    largest = max(reference.parameters(), key=lambda p: p.numel())
    report.largest_state_bytes = sum(v.numel() * v.element_size() for v in plain.state[largest].values()
                                     if torch.is_tensor(v))
    wanted = [p.detach().clone() for p in reference.parameters()]
    initial = [p.detach().clone() for p in zero_model(0).parameters()]
    model = DistributedDataParallel(zero_model(0))
    try:
        sharded_cls = getattr(_learner_module(options.script), "ShardedOptimizer")
        sharded = sharded_cls(model.parameters(), torch.optim.AdamW, **ZERO_OPTIONS)
        train(model, sharded)
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    report.state_bytes = optimizer_state_bytes(skip=(plain,))
    for (name, p), want, before in zip(model.module.named_parameters(), wanted, initial):
        report.params.append(ZeroParam(name, p.numel(), float((p.detach() - want).abs().max()),
                                       not torch.equal(p.detach(), before)))
    return report


def _json_value(value: Any) -> Any:
    """A learner's value (a prediction, what a function returned) as JSON: numbers (numpy and 0-d
    tensors too), lists (tuples, arrays, tensors), dicts with string keys; anything else as its repr."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k.item() if hasattr(k, "item") else k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def _argument(value: Any) -> Any:
    """A JSON argument as the learner's function gets it: {"1": 2.0} -> {1: 2.0}."""
    if isinstance(value, dict):
        whole = all(isinstance(k, str) and k.lstrip("-").isdigit() for k in value)
        return {(int(k) if whole else k): _argument(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_argument(v) for v in value]
    return value


def _calls(options: argparse.Namespace) -> None:
    report = CallsReport(1, 0)
    try:
        module = _learner_module(options.script)
    except BaseException as err:
        report.error = short_error(err, options.script)
    else:
        for name, args in json.loads(options.calls):
            call = Call(name, args)
            try:
                call.value = _json_value(getattr(module, name)(*_argument(args)))
            except BaseException as err:  # one wrong function: the others are still judged
                call.error = short_error(err, options.script)
            report.calls.append(call)
    Path(options.out, "1-0.json").write_text(json.dumps(asdict(report)))


def read_reports(folder: Path) -> list[dict[str, Any]]:
    """What every rank wrote in `folder` (as JSON: a RingReport, SamplerReport or CollectivesReport)."""
    return [json.loads(path.read_text()) for path in sorted(Path(folder).glob("*-*.json"))]


def _process(rank: int, options: argparse.Namespace) -> None:
    os.environ["MASTER_PORT"] = options.port
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The hand-made DDPs and the sharded optimizer are judged on their arithmetic, with models
    # on the CPU: gloo, even where there are GPUs.
    on_gpu = (options.task not in CPU_TASKS and torch.cuda.is_available()
              and torch.cuda.device_count() >= options.world_size)
    if on_gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=options.world_size,
                            timeout=GROUP_TIMEOUT)
    tasks: dict[str, Callable[[int, argparse.Namespace, Any],
                              RingReport | SamplerReport | CollectivesReport | DdpReport | ZeroReport]] = {
        "ring": _ring, "sampler": _sampler, "collectives": _collectives, "ddp": _ddp, "zero": _zero}
    report = tasks[options.task](rank, options, device)
    (Path(options.out) / f"{options.world_size}-{rank}.json").write_text(json.dumps(asdict(report)))
    if report.error is not None:
        from autograde.learner_processes.tracer import emit
        emit("crash", error=report.error)
        sys.stdout.flush()
        os._exit(1)  # the others may wait for this rank: they fail fast when its sockets close
    if options.task in CPU_TASKS:  # they make DistributedDataParallel models
        del report
        gc.collect()  # the models freed before their process group: one that outlives it can abort at exit
        dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde.learner_processes.tasks")
    parser.add_argument("task", choices=["ring", "sampler", "collectives", "calls", "ddp", "zero"])
    parser.add_argument("--script", default="", help="the learner's file (collectives: optional, for its PREDICTIONS)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--calls", default="[]", help="calls: a JSON list of [function name, [arguments]]")
    parser.add_argument("--wrapper", default="NaiveDDP", help="ddp: the class to try")
    parser.add_argument("--bucket-sizes", type=float, nargs="*", default=[], help="ddp: BucketedDDP's sizes (MB)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[12, 1001])
    parser.add_argument("--ops", nargs="+", default=["sum", "max"], choices=["sum", "max"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 5], help="sampler: the seeds to try")
    parser.add_argument("--epochs", type=int, default=3, help="sampler: the epochs to try")
    options = parser.parse_args()
    options.script = os.path.abspath(options.script) if options.script else ""
    if options.task == "calls":
        _calls(options)
        return
    import torch.multiprocessing as mp

    from autograde import processes

    os.environ["MASTER_ADDR"] = "localhost"
    for world_size in options.world_sizes:
        options.world_size, options.port = world_size, str(processes.free_port())
        # fork: the processes start with torch imported (the parent has not started CUDA)
        mp.start_processes(_process, args=(options,), nprocs=world_size, start_method="fork")


if __name__ == "__main__":
    main()
