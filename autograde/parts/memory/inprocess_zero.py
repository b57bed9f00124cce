"""ZeRO-2 and ZeRO-3 by hand (part memory, notebooks 30 and 34) inside the learner's processes.

- `zero2`: every rank trains the part's model with DistributedDataParallel (the reference), then, from
  its own initial weights, with the learner's `Zero2(model, torch.optim.SGD, bucket_size_mb, **options)`
  at each bucket size, and reports each case's largest difference from DDP's weights (and from DDP's
  trained on the sum of the gradients), and the gradients this rank held whenever an optimizer other
  than the reference's began a step: the unique buffers behind the model's .grad and behind the .grad of
  the tensors that optimizer steps (a gradient that is a view of a larger buffer counts the whole
  buffer), and the model's own gradients once backward() has returned. Each step is traced: case_start,
  backward_end once backward() has returned, case_end after the learner's step().
- `zero3`: every rank trains the part's units with DDP (twice: the gradients averaged, and summed), then from
  its own initial weights with the learner's `Zero3(model, torch.optim.SGD, **options)` (prefetch=True too, where
  the task says so); it reports each step's
  output against DDP's, the output on a new batch at the end, and the bytes of parameters each unit holds at
  rest after every step(), and (traced, from hooks run after the learner's) just before each unit's forward
  and just before its backward; and the gradients held when the optimizer steps, as zero2's.
Both run on the CPU with gloo, even where there are GPUs: they are judged on their arithmetic.
"""
from __future__ import annotations

from typing import Any

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.memory.reports import (
    ZERO2_OPTIONS,
    ZERO2_STEPS,
    ZERO3_STEPS,
    Zero2Case,
    Zero2Report,
    Zero2Task,
    Zero3Report,
    Zero3Task,
)
from autograde.protocol import performs

BATCH_PER_RANK = 4


def zero2_model(seed: int) -> Any:
    """The model ZeRO-2 is tried on: 15 trainable tensors of very different sizes (90 KB in all), in an
    order whose reverse is the order backward() finishes them, and a frozen layer, which has no gradient."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(16, 64, bias=False), nn.LayerNorm(64)]
    for _ in range(5):
        layers += [nn.ReLU(), nn.Linear(64, 64)]
    frozen = nn.Linear(64, 64)
    frozen.requires_grad_(False)
    return nn.Sequential(*layers, frozen, nn.ReLU(), nn.Linear(64, 16))


def gradient_bytes(model: Any, optimizer: Any | None) -> int:
    """The bytes of the buffers behind the model's gradients and those of the tensors `optimizer` steps."""
    grads = [p.grad for p in model.parameters()]
    grads += [p.grad for group in (optimizer.param_groups if optimizer else []) for p in group["params"]]
    buffers = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads if g is not None}
    return sum(buffers.values())


def _ddp(model: Any, batches: list[tuple[Any, Any]], mine: slice, scale: float) -> tuple[Any, list[Any]]:
    """`model` under DDP after the steps, and its output at each step; its loss scaled by `scale` (1: the gradients
    averaged; N: summed)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), **ZERO2_OPTIONS)  # type: ignore[arg-type]
    outputs = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        out = wrapped(x[mine])
        outputs.append(out.detach())
        (F.cross_entropy(out, y[mine]) * scale).backward()
        optimizer.step()
    return wrapped.module, outputs


def _weights(model: Any) -> list[Any]:
    return [p.detach().clone() for p in model.parameters()]


def _largest_difference(model: Any, wanted: list[Any]) -> float:
    return max(float((p.detach() - w).abs().max()) for p, w in zip(model.parameters(), wanted))


@performs(Zero2Task)
def zero2(rank: int, options: Zero2Task, device: Any) -> Zero2Report:
    import torch
    import torch.nn.functional as F
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    n = options.world_size
    report = Zero2Report(n, rank)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n * BATCH_PER_RANK, 16, generator=generator),
                torch.randint(0, 16, (n * BATCH_PER_RANK,), generator=generator)) for _ in range(ZERO2_STEPS)]
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    averaged, summed = (_weights(_ddp(zero2_model(0), batches, mine, scale)[0]) for scale in (1.0, float(n)))
    trainable = [p for p in zero2_model(0).parameters() if p.requires_grad]
    report.whole_bytes = sum(p.numel() * p.element_size() for p in trainable)
    report.largest_bytes = max(p.numel() * p.element_size() for p in trainable)
    report.tensors = len(trainable)
    try:
        wrapper = getattr(learner_module(options.script), "Zero2")
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for case, bucket_size_mb in enumerate(options.bucket_sizes):
        model = zero2_model(rank)  # each rank starts elsewhere: Zero2 must start every rank from rank 0's weights
        found = Zero2Case(case, bucket_size_mb)
        report.cases.append(found)

        def weigh(optimizer: Any, args: Any, kwargs: Any) -> None:
            found.steps_seen += 1
            found.gradient_bytes.append(gradient_bytes(model, optimizer))

        hook = register_optimizer_step_pre_hook(weigh)
        try:
            wrapped = wrapper(model, torch.optim.SGD, bucket_size_mb, **ZERO2_OPTIONS)
            for x, y in batches:
                tracer.emit("case_start", case=case, world_size=n)
                F.cross_entropy(model(x[mine]), y[mine]).backward()
                tracer.emit("backward_end", case=case)
                found.after_backward.append(gradient_bytes(model, None))
                wrapped.step()
                tracer.emit("case_end", case=case)
            found.from_ddp, found.from_summed = _largest_difference(model, averaged), _largest_difference(model, summed)
        except BaseException as err:
            found.error = short_error(err, options.script)
            return report
        finally:
            hook.remove()
    return report


# --- ZeRO-3 ----------------------------------------------------------------------------------------

def zero3_model(seed: int) -> Any:
    """The units ZeRO-3 is tried on: an nn.Sequential of four linear layers (the units with parameters, 16 to 64
    to 64 to 64 to 16, 39 KB) with activations between them (units without)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 16))


def _held(units: list[Any]) -> list[int]:
    """The bytes each unit's parameters hold now: the buffers behind them, each once (a view of a gathered buffer
    counts the whole buffer; a parameter freed to no elements, or whose buffer was resized to 0, none)."""
    found = []
    for unit in units:
        buffers = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in unit.parameters()}
        found.append(sum(buffers.values()))
    return found


@performs(Zero3Task)
def zero3(rank: int, options: Zero3Task, device: Any) -> Zero3Report:
    import torch
    import torch.nn.functional as F
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    n = options.world_size
    report = Zero3Report(n, rank)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n * BATCH_PER_RANK, 16, generator=generator),
                torch.randint(0, 16, (n * BATCH_PER_RANK,), generator=generator)) for _ in range(ZERO3_STEPS)]
    probe = torch.randn(8, 16, generator=generator)
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    reference, averaged = _ddp(zero3_model(0), batches, mine, 1.0)
    summed = _ddp(zero3_model(0), batches, mine, float(n))[1]
    with torch.no_grad():
        probe_wanted = reference(probe)
    model = zero3_model(rank)  # each rank starts elsewhere: Zero3 must start every rank from rank 0's weights
    units = [m for m in model.children() if list(m.parameters())]
    report.unit_bytes = [sum(p.numel() * p.element_size() for p in m.parameters()) for m in units]

    def weigh(optimizer: Any, args: Any, kwargs: Any) -> None:
        report.gradient_bytes.append(gradient_bytes(model, optimizer))

    hook = register_optimizer_step_pre_hook(weigh)
    try:
        wrapper = getattr(learner_module(options.script), "Zero3")
        extra = {"prefetch": True} if options.prefetch else {}
        wrapped = wrapper(model, torch.optim.SGD, **extra, **ZERO2_OPTIONS)
        def before_backward(k: int) -> Any:
            def observe(grad: Any) -> None:
                tracer.emit("unit_backward", unit=k, held=_held(units))
            return observe

        def after_forward(k: int) -> Any:
            def hook(module: Any, inputs: Any, out: Any) -> None:  # returns None: the output stays the unit's
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    out.register_hook(before_backward(k))
            return hook

        for k, unit in enumerate(units):  # after the learner's own hooks: what they left is what the unit meets
            unit.register_forward_pre_hook(lambda m, inputs, k=k: tracer.emit("unit_forward", unit=k, held=_held(units)))
            unit.register_forward_hook(after_forward(k))
        for step, (x, y) in enumerate(batches):
            tracer.emit("case_start", case=step, world_size=n)
            out = wrapped(x[mine])
            report.outputs.append(float((out.detach() - averaged[step]).abs().max()))
            report.outputs_summed.append(float((out.detach() - summed[step]).abs().max()))
            F.cross_entropy(out, y[mine]).backward()
            tracer.emit("backward_end", case=step)
            wrapped.step()
            tracer.emit("case_end", case=step)
            report.at_rest.append(_held(units))
        with torch.no_grad():
            report.probe = float((wrapped(probe) - probe_wanted).abs().max())
    except BaseException as err:
        report.error = short_error(err, options.script)
    finally:
        hook.remove()
    return report

