"""Where memory goes (part memory, notebook 36) inside the learner's processes.

`memory_budget`, on 2 and then 3 processes: each model of BUDGET_MODELS takes one step of Adam (float32) at each
stage, made here: 0 is DistributedDataParallel; 1 to 3 keep the parameters as one flat vector padded to a multiple
of the processes, each rank stepping its own even shard (stage 1 all-reduces the whole gradient and keeps it; stage
2 reduce-scatters it and keeps its shard; stage 3 also keeps only its shard of the parameters between steps,
gathering the whole for the forward pass). Each rank weighs what it holds, each buffer once: the parameters after
the step, the gradients when the optimizer is about to step, Adam's running averages after it, and what autograd
keeps for backward during the forward pass (torch.autograd.graph.saved_tensors_hooks, the parameters' buffers
aside). Beside each, the learner's bytes_per_rank(model, batch_size, stage, world_size).
"""
from __future__ import annotations

import math
from typing import Any

from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.memory.reports import (
    BUDGET_MODELS,
    BUDGET_QUANTITIES,
    BUDGET_STAGES,
    BudgetCase,
    BudgetReport,
    BudgetTask,
)
from autograde.protocol import performs


def budget_model(index: int) -> Any:
    import torch
    import torch.nn as nn

    _, widths, bias, _ = BUDGET_MODELS[index]
    torch.manual_seed(index)
    layers: list[nn.Module] = []
    for k in range(len(widths) - 1):
        layers += [nn.Linear(widths[k], widths[k + 1], bias=bias), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _bytes(tensors: list[Any]) -> int:
    """The bytes of the buffers behind `tensors`, each once."""
    buffers = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(buffers.values())


def _forward(model: Any, x: Any) -> tuple[Any, int]:
    """The model's output on x, and the bytes autograd kept for backward meanwhile (the parameters' aside)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(x)
    return out, sum(kept.values())


def _state(optimizer: Any) -> int:
    return _bytes([t for state in optimizer.state.values() for name, t in state.items() if name != "step"])


def measure(index: int, stage: int, rank: int, world_size: int) -> dict[str, int]:
    """One step of Adam at `stage` on this rank: the bytes it held of each of BUDGET_QUANTITIES."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    model = budget_model(index)
    batch = BUDGET_MODELS[index][3]
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, BUDGET_MODELS[index][1][0], generator=generator)
    y = torch.randint(0, BUDGET_MODELS[index][1][-1], (batch,), generator=generator)
    params = list(model.parameters())
    found: dict[str, int] = {}
    if stage == 0:
        wrapped = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(params)
        out, found["activations"] = _forward(wrapped, x)
        F.cross_entropy(out, y).backward()
        found["gradients"] = _bytes([p.grad for p in params])
        optimizer.step()
        found["parameters"], found["optimizer_state"] = _bytes(params), _state(optimizer)
        return found
    shapes, elements = [p.shape for p in params], sum(p.numel() for p in params)
    shard_size = math.ceil(elements / world_size)
    mine = slice(rank * shard_size, (rank + 1) * shard_size)

    def lay_out(flat: Any) -> None:  # the model's parameters become views of `flat`
        offset = 0
        for p, shape in zip(params, shapes):
            p.data = flat[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()

    flat = torch.zeros(shard_size * world_size)
    torch.cat([p.detach().reshape(-1) for p in params], out=flat[:elements])
    lay_out(flat)
    shard = nn.Parameter(flat[mine].clone() if stage == 3 else flat[mine])  # stage 3 keeps it apart from the whole
    optimizer = torch.optim.Adam([shard])
    if stage == 3:  # between steps, only the shard: gather the whole for the forward pass
        for p in params:
            p.data = torch.empty(0)
        flat = torch.empty(shard_size * world_size)
        dist.all_gather_into_tensor(flat, shard.detach())
        lay_out(flat)
    out, found["activations"] = _forward(model, x)
    F.cross_entropy(out, y).backward()
    grads = torch.zeros(shard_size * world_size)
    torch.cat([p.grad.reshape(-1) for p in params], out=grads[:elements])
    for p in params:
        p.grad = None
    if stage == 1:
        dist.all_reduce(grads)
        shard.grad = grads[mine].div_(world_size)
    else:
        shard.grad = torch.empty(shard_size)
        dist.reduce_scatter_tensor(shard.grad, grads)
        shard.grad.div_(world_size)
        del grads
    held = [shard.grad] + ([grads] if stage == 1 else [])
    found["gradients"] = _bytes(held)
    optimizer.step()
    shard.grad = None
    if stage == 3:
        for p in params:
            p.data = torch.empty(0)
        del flat
    else:
        dist.all_gather_into_tensor(flat, shard.detach().clone())
    found["parameters"] = _bytes([*params, shard])
    found["optimizer_state"] = _state(optimizer)
    return found


@performs(BudgetTask)
def memory_budget(rank: int, options: BudgetTask, device: Any) -> BudgetReport:
    n = options.world_size
    report = BudgetReport(n, rank, [sum(p.numel() for p in budget_model(k).parameters()) for k in range(len(BUDGET_MODELS))])
    try:
        function = learner_module(options.script).bytes_per_rank
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for index in range(len(BUDGET_MODELS)):
        for stage in BUDGET_STAGES:
            case = BudgetCase(index, stage, measure(index, stage, rank, n))
            report.cases.append(case)
            try:
                predicted = function(budget_model(index), BUDGET_MODELS[index][3], stage, n)
                case.predicted = {q: float(predicted[q]) for q in BUDGET_QUANTITIES}
            except BaseException as err:
                case.error = short_error(err, options.script)
    return report
