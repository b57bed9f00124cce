"""Part memory (notebooks 30-) inside the learner's processes, ZeRO's apart (inprocess_zero.py).

- `lamb`: the learner's LAMB moves parameters of every kind, in two param groups, for 3 steps; each is
  compared with notebook 31's update computed here in float64 and, where it differs, with the updates
  of known mistakes (LAMB_VARIANTS).
- `loss_scaling`: the learner's LossScaler and torch.amp.GradScaler each drive SGD with momentum and weight
  decay on the same small model, from the same weights, on the same batches (an inf or a nan put into some
  inputs, so that every gradient overflows there), for each setting of LOSS_SCALINGS; each step reports
  both scales, whether each moved the weights, the weights' difference, and the momentum buffers each
  optimizer's state holds (a step skipped must leave them as they were).
- `checkpointing`: the learner's run_checkpointed and run_by_hand on 8 blocks, for 1, 2 and 3 runs, against
  the plain forward pass: the output and every gradient, the bytes autograd kept for backward during the
  forward (torch.autograd.graph.saved_tensors_hooks, each buffer once), and the blocks run again in backward.
"""
from __future__ import annotations

import math
from typing import Any

from autograde.inprocess.learner_file import learner_module, short_error
from autograde.inprocess.optimizer_cases import gradients, parameter_kinds, relative
from autograde.parts.memory.reports import (
    CHECKPOINT_BATCH,
    CHECKPOINT_BLOCKS,
    CHECKPOINT_FUNCTIONS,
    CHECKPOINT_SEGMENTS,
    CHECKPOINT_WIDTH,
    LAMB_GROUPS,
    LAMB_STEPS,
    LOSS_SCALING_STEPS,
    LOSS_SCALINGS,
    OVERFLOW_STEPS,
    CheckpointCase,
    CheckpointReport,
    CheckpointTask,
    LambParam,
    LambReport,
    LambTask,
    ScalingCase,
    ScalingReport,
    ScalingStep,
    ScalingTask,
)
from autograde.protocol import performs

# --- LAMB ---------------------------------------------------------------------------------------

TOLERANCE = 1e-5  # relative: float32 steps against float64 ones


# What a LAMB step does to one parameter, and the known ways to get it wrong, each changing one rule
LAMB_VARIANTS = {
    None: "notebook 31's LAMB",
    "ratio_on_numerator": "the trust ratio's denominator the norm of Adam's numerator (the averaged gradient) alone",
    "ratio_without_decay": "the trust ratio on Adam's update without weight decay, the decay added after",
    "no_bias_correction": "Adam's running averages without bias correction",
    "ratio_on_every_parameter": "the trust ratio and weight decay applied to every parameter, one dimension too",
    "no_zero_guard": "a trust ratio used even where a norm is 0",
    "adamw": "AdamW: no trust ratio at all",
}


def lamb_reference(value: Any, grads: list[Any], options: dict[str, Any], variant: str | None = None) -> Any:
    """The parameter after the steps, in float64."""
    import torch

    p = value.double().clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    (beta1, beta2), eps, lr, decay = options["betas"], options["eps"], options["lr"], options["weight_decay"]
    for t, grad in enumerate(grads, 1):
        grad = grad.double()
        m, v = beta1 * m + (1 - beta1) * grad, beta2 * v + (1 - beta2) * grad * grad
        m_hat, v_hat = (m, v) if variant == "no_bias_correction" else (m / (1 - beta1 ** t), v / (1 - beta2 ** t))
        adam = m_hat / (v_hat.sqrt() + eps)
        if p.dim() > 1 or variant == "ratio_on_every_parameter":
            update = adam + decay * p
            below = {"ratio_on_numerator": m_hat, "ratio_without_decay": adam}.get(variant or "", update)
            weight_norm, update_norm = float(p.norm()), float(below.norm())
            ratio = 1.0
            if variant != "adamw" and (weight_norm > 0 and update_norm > 0 or variant == "no_zero_guard"):
                ratio = weight_norm / update_norm if update_norm else float("nan")
            step = ratio * adam + decay * p if variant == "ratio_without_decay" else ratio * update
        else:
            step = adam
        p = p - lr * step
    return p


@performs(LambTask)
def lamb(rank: int, options: LambTask, device: Any) -> LambReport:
    import torch

    report = LambReport(options.world_size, rank)
    try:
        lamb_cls = getattr(learner_module(options.script), "LAMB")
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    params = parameter_kinds()
    tensors = [torch.nn.Parameter(p.clone()) for _, p, _, _ in params]
    grads = gradients(params, LAMB_STEPS)
    try:
        optimizer = lamb_cls([{"params": [t for t, (_, _, g, _) in zip(tensors, params) if g == i], **LAMB_GROUPS[i]}
                              for i in range(len(LAMB_GROUPS))], lr=LAMB_GROUPS[0]["lr"])
        for step in range(LAMB_STEPS):
            for t, grad in zip(tensors, grads[step]):
                t.grad = grad.clone()
            optimizer.step()
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for k, ((name, value, group, _), t) in enumerate(zip(params, tensors)):
        mine = [g[k] for g in grads]
        found = LambParam(name, list(value.shape),
                          relative(t.detach(), lamb_reference(value, mine, LAMB_GROUPS[group])),
                          moved=not torch.equal(t.detach(), value))
        if not found.difference <= TOLERANCE:
            found.matches = next((v for v in LAMB_VARIANTS if v and relative(
                t.detach(), lamb_reference(value, mine, LAMB_GROUPS[group], v)) <= TOLERANCE), None)
        report.params.append(found)
    return report


# --- Loss scaling -------------------------------------------------------------------------------

SCALING_OPTIONS = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}


def _scaling_model() -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _scaling_batches() -> list[tuple[Any, Any, str | None]]:
    import torch

    generator = torch.Generator().manual_seed(2)
    found = []
    for step in range(1, LOSS_SCALING_STEPS + 1):
        x, y = torch.randn(6, 8, generator=generator), torch.randint(0, 4, (6,), generator=generator)
        overflow = OVERFLOW_STEPS.get(step)
        if overflow:
            x[0, 0] = float(overflow)
        found.append((x, y, overflow))
    return found


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _largest(mine: list[Any], expected: list[Any]) -> float:
    """The largest |difference| of two lists of tensors (inf where one holds None, or a number that is not finite)."""
    worst = 0.0
    for a, b in zip(mine, expected):
        if a is None and b is None:
            continue
        if a is None or b is None:
            return float("inf")
        worst = max(worst, float((a.detach() - b.detach()).abs().max()))
    return worst if math.isfinite(worst) else float("inf")


@performs(ScalingTask)
def loss_scaling(rank: int, options: ScalingTask, device: Any) -> ScalingReport:
    import torch
    import torch.nn.functional as F

    report = ScalingReport(options.world_size, rank)
    try:
        scaler_cls = getattr(learner_module(options.script), "LossScaler")
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for setting, arguments in enumerate(LOSS_SCALINGS):
        case = ScalingCase(setting)
        report.cases.append(case)
        models = [_scaling_model(), _scaling_model()]
        optimizers = [torch.optim.SGD(m.parameters(), **SCALING_OPTIONS) for m in models]  # type: ignore[arg-type]
        expected = torch.amp.GradScaler("cpu", **arguments)  # type: ignore[arg-type]
        try:
            mine = scaler_cls(**arguments)
            for step, (x, y, overflow) in enumerate(_scaling_batches(), 1):
                scales, moved = [], []
                for model, optimizer, scaler in zip(models, optimizers, (mine, expected)):
                    before = [p.detach().clone() for p in model.parameters()]
                    scales.append(scaler.get_scale())
                    optimizer.zero_grad(set_to_none=True)
                    scaler.scale(F.cross_entropy(model(x), y)).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    moved.append(not all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
                case.steps.append(ScalingStep(step, overflow, _number(scales[0]), float(scales[1]), moved[0], moved[1],
                                              _largest(list(models[0].parameters()), list(models[1].parameters())),
                                              _largest(*[[o.state.get(p, {}).get("momentum_buffer") for p in m.parameters()]
                                                         for m, o in zip(models, optimizers)])))
        except BaseException as err:
            case.error = short_error(err, options.script)
            return report
    return report


# --- Activation checkpointing -------------------------------------------------------------------

def _checkpoint_blocks() -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(CHECKPOINT_WIDTH, CHECKPOINT_WIDTH), nn.Tanh())
                           for _ in range(CHECKPOINT_BLOCKS)])


def _kept(forward: Any) -> tuple[int, Any]:
    """What autograd keeps for backward while forward() runs, in bytes (each buffer once), and its output."""
    import torch

    kept: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    return sum(kept.values()), out


@performs(CheckpointTask)
def checkpointing(rank: int, options: CheckpointTask, device: Any) -> CheckpointReport:
    import torch

    report = CheckpointReport(options.world_size, rank)
    blocks = _checkpoint_blocks()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(CHECKPOINT_BATCH, CHECKPOINT_WIDTH, generator=generator)
    weights = torch.randn(CHECKPOINT_BATCH, CHECKPOINT_WIDTH, generator=generator)  # the loss: (y * weights).sum()
    report.activation_bytes = x.numel() * x.element_size()
    plain_x = x.clone().requires_grad_()
    report.plain_bytes, out = _kept(lambda: blocks(plain_x))
    (out * weights).sum().backward()
    assert plain_x.grad is not None
    expected = out.detach(), plain_x.grad, [p.grad.clone() for p in blocks.parameters() if p.grad is not None]
    try:
        module = learner_module(options.script)
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    backward = {"running": False, "calls": 0}

    def count(*_: Any) -> None:
        backward["calls"] += backward["running"]

    hooks = [block.register_forward_hook(count) for block in blocks]
    try:
        for name in CHECKPOINT_FUNCTIONS:
            for segments in CHECKPOINT_SEGMENTS:
                case = CheckpointCase(name, segments)
                report.cases.append(case)
                blocks.zero_grad(set_to_none=True)
                mine = x.clone().requires_grad_()
                backward.update(running=False, calls=0)
                try:
                    function = getattr(module, name)
                    case.kept_bytes, out = _kept(lambda: function(blocks, mine, segments))
                    case.output = float((out.detach() - expected[0]).abs().max())
                    backward["running"] = True
                    (out * weights).sum().backward()
                    backward["running"] = False
                except BaseException as err:
                    case.error = short_error(err, options.script)
                    continue
                case.recomputed = backward["calls"]
                case.input_grad = float((mine.grad - expected[1]).abs().max()) if mine.grad is not None else float("inf")
                grads = [(p.grad, q) for p, q in zip(blocks.parameters(), expected[2])]
                case.param_grad = max((float((g - q).abs().max()) if g is not None else float("inf") for g, q in grads))
    finally:
        for hook in hooks:
            hook.remove()
    return report

