"""Part inside (notebooks 20-23) inside the learner's processes: the tasks that train with a
learner's hand-made DDP and sharded optimizer in real process groups, and the models they are tried on.

- `ddp`: every rank trains ddp_model() 3 steps with the file's wrapper (NaiveDDP, OverlapDDP or
  BucketedDDP at each bucket size) on its share of each batch, and reports the largest difference
  from one process on the whole batch and from torch's DistributedDataParallel (`DdpReport`).
- `zero`: every rank wraps the same model in DistributedDataParallel (which averages the
  gradients), trains it with the file's `ShardedOptimizer(params, torch.optim.AdamW, **options)`
  and, beforehand, with plain AdamW, and records each parameter's difference from the plain run and
  the bytes of optimizer state the rank held (`ZeroReport`).
Both run on the CPU with gloo, even where there are GPUs: they are judged on their arithmetic.
"""
from __future__ import annotations

from typing import Any, Callable

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.inside.reports import (
    MEGABYTES,
    ZERO_STEPS,
    DdpCase,
    DdpReport,
    DdpTask,
    ZeroParam,
    ZeroReport,
    ZeroTask,
    bucket_plan,
    ddp_model,
)
from autograde.protocol import performs

# The hand-made DDPs of exercises/ddp_by_hand.py ------------------------------------------------

DDP_STEPS, DDP_BATCH_PER_RANK, DDP_LR = 3, 4, 0.5


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


@performs(DdpTask)
def ddp(rank: int, options: DdpTask, device: Any) -> DdpReport:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

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
        wrapper = getattr(learner_module(options.script), options.wrapper)
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
            tracer.emit("wrapped", case=case, differs=_differs_from_rank_0(model),
                 buckets=bucket_plans_named(model, bucket_size_mb) if bucket_size_mb is not None else [])

            def step(x: Any, y: Any) -> None:
                tracer.emit("case_start", case=case, world_size=n)
                F.cross_entropy(wrapped(x[mine]), y[mine]).backward()
                tracer.emit("sync_start")
                wrapped.finish_gradient_synchronization()
                tracer.emit("sync_end")
                tracer.emit("case_end", case=case)

            trained = _train_whole(model, batches, step)
            found.from_single, found.from_ddp = _largest_difference(trained, whole), _largest_difference(trained, by_ddp)
        except BaseException as err:
            found.error = short_error(err, options.script)
            report.cases.append(found)
            return report
        report.cases.append(found)
    return report


# The sharded optimizer (ZeRO stage 1) of exercises/sharded_optimizer.py -----------------------------

ZERO_OPTIONS = {"lr": 0.01, "weight_decay": 0.1, "betas": (0.9, 0.95)}


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


@performs(ZeroTask)
def zero(rank: int, options: ZeroTask, device: Any) -> ZeroReport:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

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
            tracer.emit("case_start", case=step, world_size=n)
            optimizer.step()
            tracer.emit("case_end", case=step)

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
        sharded_cls = getattr(learner_module(options.script), "ShardedOptimizer")
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
