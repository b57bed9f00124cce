"""Where memory goes (part memory, notebook 36) inside the learner's processes.

`memory_budget`, on 2 and then 3 processes: each model of BUDGET_MODELS takes one step of Adam (float32) at each
stage, made here: 0 is DistributedDataParallel; 1 and 2 keep the parameters as one flat vector padded to a multiple
of the processes, each rank stepping its own even shard (stage 1 all-reduces the whole gradient and keeps it; stage
2 reduce-scatters it and keeps its shard); stage 3 shards each nn.Linear (a unit) apart, gathers a unit whole just
before its forward and again before its backward, and frees it after each (`_measure_zero3`). Each rank weighs
what it holds, each buffer once: the parameters after the step, the gradients when the optimizer is about to step, Adam's running averages after it, and what autograd
keeps for backward during the forward pass (torch.autograd.graph.saved_tensors_hooks, the parameters' buffers
aside), and the most parameters held at once (weighed whenever a unit has just been gathered). Beside each, the
learner's bytes_per_rank(model, batch_size, stage, world_size).
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
        found["peak_parameters"] = found["parameters"]  # DDP holds them all, always
        return found
    if stage == 3:
        return _measure_zero3(model, x, y, rank, world_size)
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
    shard = nn.Parameter(flat[mine])  # a view: the rank's share of the parameters it holds whole
    optimizer = torch.optim.Adam([shard])
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
    dist.all_gather_into_tensor(flat, shard.detach().clone())
    found["parameters"] = found["peak_parameters"] = _bytes([*params, shard])  # nothing more is ever gathered
    found["optimizer_state"] = _state(optimizer)
    return found


def _measure_zero3(model: Any, x: Any, y: Any, rank: int, world_size: int) -> dict[str, int]:
    """Stage 3, unit by unit (each nn.Linear): a unit's parameters split evenly, each rank keeping its shard apart;
    the unit gathered whole just before its forward and again before its backward (the gradient of its output
    arrived), freed after each; its gradients reduce-scattered into the shards. Autograd keeps no gathered
    parameter for backward (saved_tensors_hooks keep a note of the unit instead, and gather it again), so what the
    module holds is all that is held. The parameters are weighed whenever a unit has just been gathered."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    units = [m for m in model if isinstance(m, nn.Linear)]
    shapes = [[p.shape for p in u.parameters()] for u in units]
    sizes = [math.ceil(sum(s.numel() for s in unit) / world_size) for unit in shapes]
    shards: list[Any] = []
    whole: list[Any] = [None] * len(units)  # each unit's gathered parameters, while it is whole
    done = [0] * len(units)
    for u, size in zip(units, sizes):
        flat = torch.zeros(size * world_size)
        torch.cat([p.detach().reshape(-1) for p in u.parameters()], out=flat[:sum(p.numel() for p in u.parameters())])
        shards.append(nn.Parameter(flat[rank * size:(rank + 1) * size].clone()))
        for p in u.parameters():
            p.data = torch.empty(0)
    optimizer = torch.optim.Adam(shards)
    found = {"peak_parameters": 0}

    def held() -> int:
        return _bytes([*model.parameters(), *shards])

    def gather(k: int) -> None:
        if whole[k] is None:
            whole[k] = torch.empty(sizes[k] * world_size)
            dist.all_gather_into_tensor(whole[k], shards[k].detach())
            offset = 0
            for p, shape in zip(units[k].parameters(), shapes[k]):
                p.data = whole[k][offset:offset + shape.numel()].view(shape)
                offset += shape.numel()
            found["peak_parameters"] = max(found["peak_parameters"], held())

    def free(k: int) -> None:
        whole[k] = None
        for p in units[k].parameters():
            p.data = torch.empty(0)

    def after_forward(k: int, out: Any) -> None:
        free(k)
        out.register_hook(lambda grad: gather(k))

    def grad_in(k: int, p: Any) -> None:  # when every gradient of unit k is in: reduce-scatter, free
        done[k] += 1
        if done[k] < len(shapes[k]):
            return
        grads = torch.zeros(sizes[k] * world_size)
        torch.cat([q.grad.reshape(-1) for q in units[k].parameters() if q.grad is not None],
                  out=grads[:sum(s.numel() for s in shapes[k])])
        shards[k].grad = torch.empty(sizes[k])
        dist.reduce_scatter_tensor(shards[k].grad, grads)
        shards[k].grad.div_(world_size)
        for q in units[k].parameters():
            q.grad = None
        free(k)

    owner: dict[int, int] = {}  # a gathered buffer's data_ptr: its unit
    kept: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        k = owner.get(tensor.untyped_storage().data_ptr())
        if k is not None and whole[k] is not None and tensor.untyped_storage().data_ptr() == whole[k].untyped_storage().data_ptr():
            return (k, tensor.shape, tensor.stride(), tensor.storage_offset())
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    def unpack(packed: Any) -> Any:
        if not isinstance(packed, tuple):
            return packed
        k, shape, stride, offset = packed
        gather(k)
        return whole[k].as_strided(shape, stride, offset)

    def before_forward(k: int) -> None:
        gather(k)
        owner[whole[k].untyped_storage().data_ptr()] = k

    for k, u in enumerate(units):
        u.register_forward_pre_hook(lambda m, inputs, k=k: before_forward(k))
        u.register_forward_hook(lambda m, inputs, out, k=k: after_forward(k, out))
        for p in u.parameters():
            p.register_post_accumulate_grad_hook(lambda p, k=k: grad_in(k, p))
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = model(x)
    F.cross_entropy(out, y).backward()
    gradients = _bytes([s.grad for s in shards])
    optimizer.step()
    return {"parameters": held(), "gradients": gradients, "optimizer_state": _state(optimizer),
            "activations": sum(kept.values()), "peak_parameters": found["peak_parameters"]}


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
