"""Gradient accumulation (part memory, notebook 37) inside the learner's processes.

`accumulation`, on 2 processes: the learner's BucketedDDP (their part-5 class, given no_sync()) wraps a small MLP
whose gradients part 5's rule puts in 4 buckets; the learner's train_step drives 3 steps of SGD with momentum,
first with 1 micro-batch a step (the learner's own count of all-reduces a step), then with 4 micro-batches a
step. After each step every weight is compared with DistributedDataParallel's after as many steps on the whole
batch, and, where it differs, with DDP trained alike on the gradients of known mistakes (ACCUMULATION_VARIANTS).
Traced: case_start before each train_step, micro_forward as each micro-batch's forward begins (a forward
pre-hook on the wrapped model), case_end when train_step has returned; the learner's all-reduces fall between.
"""
from __future__ import annotations

from typing import Any

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.memory.reports import (
    ACCUMULATION_BUCKET_MB,
    ACCUMULATION_HIDDEN,
    ACCUMULATION_MICRO_STEPS,
    ACCUMULATION_OPTIONS,
    ACCUMULATION_SHARE,
    ACCUMULATION_STEPS,
    ACCUMULATION_VARIANTS,
    AccumulationCase,
    AccumulationReport,
    AccumulationTask,
)
from autograde.protocol import performs


def _model() -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    hidden = ACCUMULATION_HIDDEN
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _reference(batches: list[tuple[Any, Any]], k: int, variant: str | None) -> list[list[Any]]:
    """The weights after each step of DDP, one backward a step: on the whole share (variant None), on it with the
    micro-batches' losses summed ("summed") or the processes' gradients summed ("processes_summed"), or on the last
    micro-batch alone, its loss divided by k or not."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), **ACCUMULATION_OPTIONS)  # type: ignore[arg-type]
    found = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        last = slice(len(x) - len(x) // k, len(x))
        loss = {None: lambda: F.cross_entropy(model(x), y), "summed": lambda: F.cross_entropy(model(x), y) * k,
                "processes_summed": lambda: F.cross_entropy(model(x), y) * dist.get_world_size(),
                "last_divided": lambda: F.cross_entropy(model(x[last]), y[last]) / k,
                "last": lambda: F.cross_entropy(model(x[last]), y[last])}[variant]
        loss().backward()
        optimizer.step()
        found.append([p.detach().clone() for p in model.module.parameters()])
    return found


@performs(AccumulationTask)
def accumulation(rank: int, options: AccumulationTask, device: Any) -> AccumulationReport:
    import torch

    n = options.world_size
    report = AccumulationReport(n, rank)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n * ACCUMULATION_SHARE, 64, generator=generator),
                torch.randint(0, 10, (n * ACCUMULATION_SHARE,), generator=generator)) for _ in range(ACCUMULATION_STEPS)]
    mine = [(x[rank * ACCUMULATION_SHARE:(rank + 1) * ACCUMULATION_SHARE],
             y[rank * ACCUMULATION_SHARE:(rank + 1) * ACCUMULATION_SHARE]) for x, y in batches]
    trainable = list(_model().parameters())
    report.elements, report.tensors = sum(p.numel() for p in trainable), len(trainable)
    try:
        module = learner_module(options.script)
        wrapper, train_step = module.BucketedDDP, module.train_step
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    case = 0
    for k in ACCUMULATION_MICRO_STEPS:
        wanted = {variant: _reference(mine, k, variant) for variant in (None, *ACCUMULATION_VARIANTS)}
        inner = _model()
        inner.register_forward_pre_hook(lambda m, inputs: tracer.emit("micro_forward", case=case))
        try:
            model = wrapper(inner, ACCUMULATION_BUCKET_MB)
            optimizer = torch.optim.SGD(model.parameters(), **ACCUMULATION_OPTIONS)  # type: ignore[arg-type]
        except BaseException as err:
            report.cases.append(AccumulationCase(k, 1, case, error=short_error(err, options.script)))
            return report
        before = [p.detach().clone() for p in inner.parameters()]
        for step, (x, y) in enumerate(mine):
            found = AccumulationCase(k, step + 1, case)
            report.cases.append(found)
            try:
                tracer.emit("case_start", case=case, world_size=n)
                train_step(model, optimizer, list(zip(x.chunk(k), y.chunk(k))))
                tracer.emit("case_end", case=case)
            except BaseException as err:
                found.error = short_error(err, options.script)
                return report
            weights = [p.detach() for p in inner.parameters()]
            found.moved = any(not torch.equal(w, b) for w, b in zip(weights, before))
            before = [w.clone() for w in weights]

            def gap(reference: list[Any]) -> float:
                return max(float((w - r).abs().max()) for w, r in zip(weights, reference))

            found.from_whole = gap(wanted[None][step])
            found.matches = next((v for v in ACCUMULATION_VARIANTS if gap(wanted[v][step]) <= 1e-6), None)
            case += 1
    return report
