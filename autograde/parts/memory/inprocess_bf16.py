"""bf16 training (part memory, notebook 35) inside the learner's processes.

`bf16`, on 2 processes: (1) on every rank, a small bf16 model trained 8 steps with the learner's
`MasterWeights(model, torch.optim.SGD, **options)`, against the same steps made here with fp32 masters, and
against bf16 weights stepped in bf16; the dtypes of what the learner's optimizer steps (the global optimizer
pre-hook sees it), its values and the bf16 weights against the reference's. (2) DDP with the learner's
communication hook, one backward on each rank's share, traced between case_start and case_end: its gradients
against DDP's own (fp32) and against the sum.
"""
from __future__ import annotations

from typing import Any

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.memory.reports import BF16_OPTIONS, BF16_STEPS, Bf16Report, Bf16Task
from autograde.protocol import performs


def _model(dtype: Any) -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(dtype)


def _batches() -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(4)
    return [(torch.randn(12, 8, generator=generator), torch.randint(0, 4, (12,), generator=generator))
            for _ in range(BF16_STEPS)]


def _largest(a: list[Any], b: list[Any]) -> float:
    return max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in zip(a, b))


def _masters(report: Bf16Report, module: Any) -> None:
    import torch
    import torch.nn.functional as F
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    batches = _batches()
    reference, pure = _model(torch.bfloat16), _model(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_() for p in reference.parameters()]
    optimizer = torch.optim.SGD(masters, **BF16_OPTIONS)  # type: ignore[arg-type]
    pure_optimizer = torch.optim.SGD(pure.parameters(), **BF16_OPTIONS)  # type: ignore[arg-type]
    start = [p.detach().float().clone() for p in pure.parameters()]
    for x, y in batches:
        for model in (reference, pure):
            F.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
        for master, p in zip(masters, reference.parameters()):
            master.grad, p.grad = p.grad.float(), None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        pure_optimizer.step()
        pure_optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for master, p in zip(masters, reference.parameters()):
                p.copy_(master)
    report.moved_pure = sum(float((p.detach().float() - s).abs().sum()) for p, s in zip(pure.parameters(), start))
    stepped: list[Any] = []

    def seen(opt: Any, args: Any, kwargs: Any) -> None:
        if not stepped:
            stepped.extend(p for group in opt.param_groups for p in group["params"])

    model = _model(torch.bfloat16)
    hook = register_optimizer_step_pre_hook(seen)
    try:
        wrapped = getattr(module, "MasterWeights")(model, torch.optim.SGD, **BF16_OPTIONS)
        for x, y in batches:
            F.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
            wrapped.step()
    except BaseException as err:
        report.master_error = short_error(err, getattr(module, "__file__", "") or "")
        return
    finally:
        hook.remove()
    report.optimizer_dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in stepped})
    flat = [torch.cat([t.detach().double().flatten() for t in tensors]) for tensors in (stepped, masters)]
    if flat[0].numel() == flat[1].numel():  # one tensor per parameter, or all of them in one, in the model's order
        report.masters = float((flat[0] - flat[1]).abs().max())
    report.weights = _largest(list(model.parameters()), list(reference.parameters()))
    report.moved = sum(float((p.detach().float() - s).abs().sum()) for p, s in zip(model.parameters(), start))


GUARD = "bf16_allreduce_hook"  # how the guard's own words begin, inside the error DDP's reducer wraps them in


def _guarded(hook: Any) -> Any:
    """The learner's hook, its answer held to the contract before DDP's reducer uses it (a hook that returns anything
    but a future of the bucket's shape and dtype can bring the process down inside the reducer)."""
    import torch

    def guarded(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations: none is fine
        buffer = bucket.buffer()
        future = hook(state, bucket)
        if not (callable(getattr(future, "then", None)) and callable(getattr(future, "wait", None))):
            raise TypeError(f"bf16_allreduce_hook returned {type(future).__name__}, not a torch.futures.Future")

        def check(done: Any) -> Any:
            value = done.value()
            value = value[0] if isinstance(value, (list, tuple)) and value else value
            if not isinstance(value, torch.Tensor) or value.numel() != buffer.numel() or value.dtype != buffer.dtype:
                raise TypeError(f"bf16_allreduce_hook's future holds {_what(value)}, where the bucket is "
                                f"{buffer.numel()} elements of {buffer.dtype}")
            return value.view_as(buffer)

        return future.then(check)

    return guarded


def _what(value: Any) -> str:
    import torch

    return f"{value.numel()} elements of {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__


def _hook(report: Bf16Report, module: Any, rank: int, n: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    (x, y), *_ = _batches()
    grads = {}
    for name in ("plain", "summed", "learner"):
        model = DistributedDataParallel(_model(torch.float32))
        if name == "learner":
            try:
                model.register_comm_hook(None, _guarded(getattr(module, "bf16_allreduce_hook")))
            except BaseException as err:
                report.hook_error = short_error(err, getattr(module, "__file__", "") or "")
                return
        loss = F.cross_entropy(model(x[rank::n]), y[rank::n]) * (n if name == "summed" else 1)
        if name == "learner":
            tracer.emit("case_start", case=0, world_size=n)
        try:
            loss.backward()
        except BaseException as err:
            said = short_error(err, getattr(module, "__file__", "") or "")
            report.hook_error = said[said.find(GUARD):].splitlines()[0] if GUARD in said else said
            return
        finally:
            if name == "learner":
                tracer.emit("case_end", case=0)
        grads[name] = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    largest = max(float(g.abs().max()) for g in grads["plain"])
    for field_name, other in (("from_fp32", "plain"), ("from_sum", "summed")):
        if all(a.shape == b.shape for a, b in zip(grads["learner"], grads[other])):
            setattr(report, field_name, _largest(grads["learner"], grads[other]) / largest)


@performs(Bf16Task)
def bf16(rank: int, options: Bf16Task, device: Any) -> Bf16Report:
    report = Bf16Report(options.world_size, rank)
    try:
        module = learner_module(options.script)
    except BaseException as err:
        report.master_error = report.hook_error = short_error(err, options.script)
        return report
    _masters(report, module)
    _hook(report, module, rank, options.world_size)
    return report
