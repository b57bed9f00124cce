"""Part inside, model parallelism (notebook 22), inside the learner's processes: the tasks that try a
learner's tensor-parallel layers, 2-D arrangement and pipeline schedules in real process groups.

- `tensor_parallel`: on every rank, Megatron's f (CopyToParallel) and g (ReduceFromParallel), then
  ColumnParallelLinear, RowParallelLinear and ParallelMLP, each made from unsplit layers that every
  rank builds alike, are run forward and backward against those layers. Each of the learner's
  parameters is found by its values among the unsplit tensors (`locate`: which rows, columns or
  entries it holds, whatever the learner named it or however it cut), so that its gradient can be
  compared with the unsplit gradient's share. "phase" events mark each case's forward and backward
  passes: the checker counts the collectives in each from the trace.
- `two_d`: 4 ranks make their groups with the learner's make_groups(2); a ParallelMLP over the
  tensor group trains 3 SGD steps on the data group's share of each batch, its gradients averaged by
  the learner's average_gradients over the data group, against one process on the whole batches.
- `stages`: the learner's gpipe or one_f_one_b on S ranks and several numbers of micro-batches, each
  stage against the unsplit model's gradients; or, with `chunks` > 1, its interleaved_1f1b, rank r
  given the list of its chunks (virtual stages r, r + S, ... of a model cut into chunks * S). Each
  stage or chunk the learner is given is wrapped (`Traced`) so that each pass of each micro-batch is
  traced: "pass_start"/"pass_end" events, F and B, with the chunk's index.
All run on the CPU with gloo, even where there are GPUs: they are judged on their arithmetic.
"""
from __future__ import annotations

import copy
from typing import Any

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.inside.reports import (
    STAGE_WIDTH,
    TENSOR_CASES,
    TWO_D_TENSOR,
    ParallelCase,
    ParallelReport,
    Shard,
    StagesCase,
    StagesReport,
    StagesTask,
    TensorParallelTask,
    TwoDTask,
)
from autograde.parts.inside.reports import TENSOR_HIDDEN as HIDDEN
from autograde.parts.inside.reports import TENSOR_IN as IN_FEATURES
from autograde.protocol import performs

BATCH = 4


def locate(param: Any, wholes: dict[str, Any]) -> tuple[str, int, list[int]] | None:
    """Which share of which unsplit tensor `param` holds, found by its values: (the tensor's name, the
    dimension it is cut along, the rows, columns or entries it holds, in its own order); None when it
    holds none. A weight kept transposed is found too (its dimension then says which of the unsplit one's)."""
    import torch

    values = param.detach()
    for name, whole in wholes.items():
        whole = whole.detach()
        if whole.dim() != values.dim():
            continue
        if whole.dim() == 1:
            entries = {float(v): i for i, v in enumerate(whole.tolist())}
            held = [entries.get(float(v), -1) for v in values.tolist()]
            if held and -1 not in held and len(set(held)) == len(held):
                return name, 0, held
            continue
        for dim in (0, 1):
            lines = whole if dim == 0 else whole.t()
            for mine in (values, values.t()):
                if mine.shape[1] != lines.shape[1]:
                    continue
                rows = {line.contiguous().numpy().tobytes(): i for i, line in enumerate(lines)}
                held = [rows.get(line.contiguous().numpy().tobytes(), -1) for line in mine]
                if held and -1 not in held and len(set(held)) == len(held) and torch.equal(mine, lines[held]):
                    return name, dim, held
    return None


def _share(whole: Any, dim: int, indices: list[int]) -> Any:
    return whole[indices] if dim == 0 else whole[:, indices].t()


def _difference(mine: Any, wanted: Any) -> float:
    if mine is None or wanted is None:
        return float("inf")
    mine, wanted = mine.detach(), wanted.detach()
    if mine.shape != wanted.shape and mine.t().shape == wanted.shape:
        mine = mine.t()  # a weight kept transposed
    if mine.shape != wanted.shape:
        return float("inf")
    return float((mine - wanted).abs().max()) if mine.numel() else 0.0


def _shards(module: Any, wholes: dict[str, Any]) -> tuple[list[Shard], dict[int, tuple[str, int, list[int]]]]:
    """Each of the learner's parameters (its own names), located; and the located ones by id."""
    shards, where = [], {}
    for name, p in module.named_parameters():
        found = locate(p, wholes)
        shard = Shard(name, p.numel())
        if found is not None:
            shard.of, shard.dim, shard.indices = found
            where[id(p)] = found
        shards.append(shard)
    return shards, where


def _compare_gradients(module: Any, shards: list[Shard], where: dict[int, tuple[str, int, list[int]]],
                       grads: dict[str, Any]) -> None:
    for shard, p in zip(shards, module.parameters()):
        if id(p) in where:
            name, dim, indices = where[id(p)]
            wanted = _share(grads[name], dim, indices)
            shard.difference = _difference(p.grad, wanted)
            shard.used = p.grad is not None


def _phase(case: str, phase: str) -> None:
    tracer.emit("phase", case=case, phase=phase)


def _linear(in_features: int, out_features: int, seed: int) -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)  # every rank builds the same unsplit layer
    return nn.Linear(in_features, out_features)


def _tensor_case(case: str, file: Any, rank: int, n: int) -> ParallelCase:
    """One case of TENSOR_CASES on this rank (errors are the caller's to catch)."""
    import torch
    import torch.nn.functional as F

    found = ParallelCase(case)
    generator = torch.Generator().manual_seed(7)
    if case in ("f", "g"):
        # f: the same x on every rank, a different upstream gradient on each; g: the reverse
        xs = [torch.randn(BATCH, IN_FEATURES, generator=generator) for _ in range(n)]
        grads_in = [torch.randn(BATCH, IN_FEATURES, generator=generator) for _ in range(n)]
        x = (xs[0] if case == "f" else xs[rank]).clone().requires_grad_()
        function = file.CopyToParallel if case == "f" else file.ReduceFromParallel
        _phase(case, "forward")
        y = function.apply(x, None)
        _phase(case, "backward")
        y.backward(grads_in[rank] if case == "f" else grads_in[0])
        _phase(case, "end")
        found.output = _difference(y, xs[0] if case == "f" else sum(xs))
        found.input_grad = _difference(x.grad, sum(grads_in) if case == "f" else grads_in[0])
        return found
    fc1, fc2 = _linear(IN_FEATURES, HIDDEN, 1), _linear(HIDDEN, IN_FEATURES, 2)
    wholes = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "fc2.weight": fc2.weight, "fc2.bias": fc2.bias}
    if case == "column":
        module = file.ColumnParallelLinear(copy.deepcopy(fc1))
        wholes = {k: v for k, v in wholes.items() if k.startswith("fc1")}
    elif case == "row":
        module = file.RowParallelLinear(copy.deepcopy(fc2))
        wholes = {k: v for k, v in wholes.items() if k.startswith("fc2")}
    else:
        module = file.ParallelMLP(copy.deepcopy(fc1), copy.deepcopy(fc2))
    found.whole_numel = {k: v.numel() for k, v in wholes.items()}
    found.shards, where = _shards(module, wholes)
    # the unsplit computation, and the upstream gradient (the same on every rank)
    x = torch.randn(BATCH, IN_FEATURES if case != "row" else HIDDEN, generator=generator).requires_grad_()
    unsplit = {"column": fc1, "row": fc2, "mlp": lambda v: fc2(F.gelu(fc1(v)))}[case]
    wanted = unsplit(x)
    upstream = torch.randn(wanted.shape, generator=generator)
    wanted.backward(upstream)
    grads = {k: v.grad for k, v in wholes.items()}
    # the column layer's output, and the row layer's input, are the features its weight says it holds
    weight = {"column": "fc1.weight", "row": "fc2.weight"}.get(case)
    features = next((w[2] for w in where.values() if w[0] == weight), None)
    if weight is not None and features is None:
        return found  # a weight found in no unsplit tensor: judged from the shards
    mine_x = (x.detach()[:, features] if case == "row" else x.detach()).clone().requires_grad_()
    _phase(case, "forward")
    y = module(mine_x)
    _phase(case, "backward")
    y.backward(upstream[:, features] if case == "column" else upstream)
    _phase(case, "end")
    found.output = _difference(y, wanted.detach()[:, features] if case == "column" else wanted.detach())
    if case != "column":
        found.bias_every_rank = _difference(y, wanted.detach() + (n - 1) * fc2.bias.detach())
    whole_grad = x.grad
    found.input_grad = _difference(mine_x.grad, whole_grad[:, features] if case == "row" and whole_grad is not None
                                   else whole_grad)
    _compare_gradients(module, found.shards, where, grads)
    return found


@performs(TensorParallelTask)
def tensor_parallel(rank: int, options: TensorParallelTask, device: Any) -> ParallelReport:
    report = ParallelReport(options.world_size, rank)
    try:
        file = learner_module(options.script)
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for case in TENSOR_CASES:
        try:
            report.cases.append(_tensor_case(case, file, rank, options.world_size))
        except BaseException as err:
            _phase(case, "end")
            report.cases.append(ParallelCase(case, error=short_error(err, options.script)))
    return report


TWO_D_STEPS, TWO_D_BATCH, TWO_D_LR = 3, 8, 0.1


@performs(TwoDTask)
def two_d(rank: int, options: TwoDTask, device: Any) -> ParallelReport:
    """ParallelMLP over the learner's tensor group, averaged over its data group, against one process."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    report = ParallelReport(options.world_size, rank)
    found = ParallelCase("two_d")
    try:
        file = learner_module(options.script)
        _phase("two_d", "groups")
        tensor_group, data_group = file.make_groups(TWO_D_TENSOR)
        _phase("two_d", "end")
        report.tensor_ranks = dist.get_process_group_ranks(tensor_group)
        report.data_ranks = dist.get_process_group_ranks(data_group)
        fc1, fc2 = _linear(IN_FEATURES, HIDDEN, 1), _linear(HIDDEN, IN_FEATURES, 2)
        single = nn.Sequential(fc1, nn.GELU(), fc2)
        wholes = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "fc2.weight": fc2.weight, "fc2.bias": fc2.bias}
        found.whole_numel = {k: v.numel() for k, v in wholes.items()}
        model = file.ParallelMLP(copy.deepcopy(fc1), copy.deepcopy(fc2), tensor_group)
        found.shards, where = _shards(model, wholes)
        generator = torch.Generator().manual_seed(3)
        replicas, replica = dist.get_world_size(data_group), dist.get_rank(data_group)
        share = TWO_D_BATCH // replicas
        for _ in range(TWO_D_STEPS):
            x = torch.randn(TWO_D_BATCH, IN_FEATURES, generator=generator)
            target = torch.randn(TWO_D_BATCH, IN_FEATURES, generator=generator)
            for m, inputs, targets in ((single, x, target),
                                       (model, x[replica * share:(replica + 1) * share],
                                        target[replica * share:(replica + 1) * share])):
                m.zero_grad()
                F.mse_loss(m(inputs), targets).backward()
                if m is model:
                    _phase("two_d", "average")
                    file.average_gradients(model, data_group)
                    _phase("two_d", "end")
                with torch.no_grad():
                    for p in m.parameters():
                        if p.grad is not None:
                            p -= TWO_D_LR * p.grad
        x = torch.randn(TWO_D_BATCH, IN_FEATURES, generator=generator)
        found.output = _difference(model(x), single(x))
        for shard, p in zip(found.shards, model.parameters()):
            if id(p) in where:
                name, dim, indices = where[id(p)]
                shard.difference = _difference(p, _share(wholes[name].detach(), dim, indices))
                shard.used = p.grad is not None
    except BaseException as err:
        found.error = short_error(err, options.script)
    report.cases.append(found)
    return report


# Pipelines ----------------------------------------------------------------------------------------

LAYERS_PER_STAGE = 2


def stage_model(stages: int, width: int = STAGE_WIDTH) -> Any:
    """The unsplit model a pipeline is tried on, the same on every rank: stage r is layers [2r, 2r + 2)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                           for _ in range(stages * LAYERS_PER_STAGE)])


def traced_stage(stage: Any, case: int, chunk: int = 0) -> Any:
    """`stage` as the learner is given it: the same module, each pass of each micro-batch traced.
    The n-th call is micro-batch n; its backward pass starts when its output's gradient arrives, and
    ends when its input's gradient has been made (on the first stage, whose input needs none, the
    stage is given a copy of the input that asks for one)."""
    import torch
    import torch.nn as nn

    class EndOfBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, micro: int) -> Any:
            ctx.micro = micro
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            tracer.emit("pass_end", case=case, kind="B", micro=ctx.micro, chunk=chunk)
            return grad, None

    class Traced(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stage = stage
            self.calls = 0

        def forward(self, x: Any) -> Any:
            micro, self.calls = self.calls, self.calls + 1
            tracer.emit("pass_start", case=case, kind="F", micro=micro, chunk=chunk)
            if not x.requires_grad:
                x = x.detach().requires_grad_()
            y = self.stage(EndOfBackward.apply(x, micro))
            if y.requires_grad:
                y.register_hook(lambda grad: tracer.emit("pass_start", case=case, kind="B", micro=micro, chunk=chunk))
            tracer.emit("pass_end", case=case, kind="F", micro=micro, chunk=chunk)
            return y

    return Traced()


@performs(StagesTask)
def stages(rank: int, options: StagesTask, device: Any) -> StagesReport:
    import torch
    import torch.nn.functional as F

    report = StagesReport(options.world_size, rank)
    try:
        schedule = getattr(learner_module(options.script), options.schedule)
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    n, width, v = options.world_size, options.width, options.chunks
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(options.batch_size, width, generator=generator)
    target = torch.randn(options.batch_size, width, generator=generator)
    whole = stage_model(n * v, width)
    F.mse_loss(whole(x), target).backward()
    # this rank's virtual stages r, r + S, ...: one with chunks = 1
    mine = [slice((c * n + rank) * LAYERS_PER_STAGE, (c * n + rank + 1) * LAYERS_PER_STAGE) for c in range(v)]
    wanted = [p.grad for s in mine for p in whole[s].parameters()]
    for case, m in enumerate(options.micro_batches):
        found = StagesCase(m)
        model = stage_model(n * v, width)
        chunks = [model[s] for s in mine]
        tracer.emit("pipeline_case", case=case, micro_batches=m)
        try:
            given = [traced_stage(c, case, j) for j, c in enumerate(chunks)]
            schedule(given if v > 1 else given[0], list(x.chunk(m)), list(target.chunk(m)), F.mse_loss)
            found.gradient = max(_difference(p.grad, w)
                                 for p, w in zip([p for c in chunks for p in c.parameters()], wanted))
        except BaseException as err:
            found.error = short_error(err, options.script)
            report.cases.append(found)
            return report
        report.cases.append(found)
    return report
