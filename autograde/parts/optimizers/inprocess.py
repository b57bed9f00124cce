"""Part optimizers (notebooks 24-26) inside the learner's processes: the tasks that try a learner's
LARS and K-FAC against their definitions.

- `lars`: the learner's LARS moves parameters of every kind (a layer's weight, a bias, a
  convolution's weight, a norm's scale, a weight of zeros, a weight whose gradient is zero) in two
  param groups with different options for 3 steps; each is compared with notebook 24's update
  computed here in float64, and, when it differs, with the updates of known mistakes (LARS_VARIANTS).
- `kfac`: on every rank, the learner's KFAC preconditions the gradients of a 3-layer model (one
  layer without a bias) under DistributedDataParallel, each rank on its share of each batch; after
  every step() each layer's gradient is compared with the dense computation on the whole batch,
  (A kron G + damping I)^-1 vec(grad), in float64, for several dampings and update frequencies, and
  when it differs with known mistakes (KFAC_VARIANTS; a rank that broadcast a tensor that is not
  contiguous is marked "noncontiguous_broadcast" whatever its own results). "kfac_step" events mark each step() call,
  and every decomposition or inverse torch.linalg makes is traced with its matrix's size
  ("decomposition"): which rank decomposed which factor, and what each step communicated.
Both run on the CPU with gloo: they are judged on their arithmetic.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable

from autograde.inprocess import tracer
from autograde.inprocess.learner_file import learner_module, short_error
from autograde.inprocess.optimizer_cases import gradients, parameter_kinds, relative
from autograde.parts.optimizers.reports import (
    KFAC_LAYERS,
    KfacCase,
    KfacReport,
    KfacTask,
    LarsParam,
    LarsReport,
    LarsTask,
)
from autograde.protocol import performs

# --- LARS ---------------------------------------------------------------------------------------

LARS_GROUPS = ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "eta": 0.02},
               {"lr": 0.5, "momentum": 0.5, "weight_decay": 0.0, "eta": 0.005})
LARS_STEPS = 3
TOLERANCE = 1e-5  # relative: float32 steps against float64 ones


# What a LARS step does to one parameter, and the known ways to get it wrong, each changing one rule
LARS_VARIANTS = {
    None: "notebook 24's LARS",
    "ratio_on_every_parameter": "the trust ratio and weight decay applied to the biases and norms' scales too",
    "no_weight_decay_in_ratio": "a trust ratio without weight decay in its denominator",
    "no_zero_guard": "a trust ratio used even where a norm is 0",
    "no_momentum": "no momentum",
    "plain_sgd": "SGD with momentum and weight decay, without any trust ratio",
}


def lars_reference(value: Any, grads: list[Any], options: dict[str, float], variant: str | None = None) -> Any:
    """The parameter after the steps, in float64."""
    p, buffer = value.double().clone(), None
    lr, momentum, decay, eta = options["lr"], options["momentum"], options["weight_decay"], options["eta"]
    for grad in grads:
        grad = grad.double()
        if p.dim() > 1 or variant == "ratio_on_every_parameter":
            update = grad + decay * p
            weight_norm, grad_norm = float(p.norm()), float(grad.norm())
            if variant != "plain_sgd" and (weight_norm > 0 and grad_norm > 0 or variant == "no_zero_guard"):
                below = grad_norm + (0 if variant == "no_weight_decay_in_ratio" else decay) * weight_norm
                update = update * (eta * weight_norm / below if below else float("nan"))
        else:
            update = grad
        if variant == "no_momentum" or buffer is None:
            buffer = lr * update
        else:
            buffer = momentum * buffer + lr * update
        p = p - buffer
    return p


@performs(LarsTask)
def lars(rank: int, options: LarsTask, device: Any) -> LarsReport:
    import torch

    report = LarsReport(options.world_size, rank)
    try:
        lars_cls = getattr(learner_module(options.script), "LARS")
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    params = parameter_kinds()
    tensors = [torch.nn.Parameter(p.clone()) for _, p, _, _ in params]
    grads = gradients(params, LARS_STEPS)
    try:
        optimizer = lars_cls([{"params": [t for t, (_, _, g, _) in zip(tensors, params) if g == i], **LARS_GROUPS[i]}
                              for i in range(len(LARS_GROUPS))], lr=LARS_GROUPS[0]["lr"])
        for step in range(LARS_STEPS):
            for t, grad in zip(tensors, grads[step]):
                t.grad = grad.clone()
            optimizer.step()
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    for k, ((name, value, group, _), t) in enumerate(zip(params, tensors)):
        mine = [g[k] for g in grads]
        found = LarsParam(name, list(value.shape),
                          relative(t.detach(), lars_reference(value, mine, LARS_GROUPS[group])),
                          moved=not torch.equal(t.detach(), value))
        if not found.difference <= TOLERANCE:
            found.matches = next((v for v in LARS_VARIANTS if v and relative(
                t.detach(), lars_reference(value, mine, LARS_GROUPS[group], v)) <= TOLERANCE), None)
        report.params.append(found)
    return report


# --- K-FAC --------------------------------------------------------------------------------------

# Rows of each batch per rank: 16 on one process, so that every factor (at most 14 x 14) has full rank there
# too, and a damping put on one factor only is a well-posed mistake the variants can match
KFAC_BATCH_PER_RANK, KFAC_BATCH_ALONE, KFAC_IN = 8, 16, KFAC_LAYERS[0][0]
# A known mistake is matched to 1e-3: it is 0.1 to 1 from the right result, while its float32 rounding, where the
# damping is small against the eigenvalues (factors summed over 4 ranks), may be 1e-4 from its float64 reference
VARIANT_TOLERANCE = 1e-3
KFAC_CASES = {1: ((1e-3, 0.5, 1, 3), (0.1, 0.8, 3, 5)),  # (damping, factor decay, update freq, steps) on 1 rank
              0: ((1e-3, 0.5, 1, 3), (1e-2, 0.5, 10, 12))}  # on N ranks
KFAC_VARIANTS = {
    None: "the dense computation",
    "unpreconditioned": "the gradients left as they were",
    "summed": "factors summed over the ranks instead of averaged",
    "damping_on_a": "the damping added to A only: (A + damping I) kron G",
    "damping_on_g": "the damping added to G only: A kron (G + damping I)",
    "factored_damping": "the damping split between the factors: (A + sqrt(damping) I) kron (G + sqrt(damping) I)",
    "no_running_average": "each refresh's factors from that batch alone, without the running average",
    "every_step": "the factors refreshed at every step instead of every update_freq steps",
    "bias_apart": "the bias left out: A of the inputs alone for the weight, the bias's gradient as it was",
    "local_factors": "each rank's factors from its own share of the batch, not averaged over the ranks",
    # not computed but seen: this rank broadcast a tensor that is not contiguous (eigh's eigenvectors, column by
    # column); broadcast sends the memory as it lies, so a rank receiving it into a contiguous one gets it transposed
    "noncontiguous_broadcast": "a tensor that is not contiguous broadcast as it is",
}
OBSERVED_VARIANTS = {"noncontiguous_broadcast"}


def kfac_model() -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (inputs, outputs, bias) in enumerate(KFAC_LAYERS):
        layers += [nn.Linear(inputs, outputs, bias=bias)] + ([nn.Tanh()] if i < len(KFAC_LAYERS) - 1 else [])
    return nn.Sequential(*layers)


def _kfac_rows(world_size: int) -> int:
    return KFAC_BATCH_ALONE if world_size == 1 else KFAC_BATCH_PER_RANK


def _kfac_batches(world_size: int, steps: int) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(2)
    n = _kfac_rows(world_size) * world_size
    return [(torch.randn(n, KFAC_IN, generator=generator), torch.randn(n, KFAC_LAYERS[-1][1], generator=generator))
            for _ in range(steps)]


def _factors(model: Any, x: Any, target: Any) -> list[tuple[Any, Any, Any]]:
    """Each layer's (A, G, gradient as one matrix [weight | bias]) of the batch, in float64."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    model = copy.deepcopy(model).double()
    inputs: dict[Any, Any] = {}
    outputs: dict[Any, Any] = {}
    layers: list[Any] = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer in layers:
        layer.register_forward_pre_hook(lambda m, i: inputs.__setitem__(m, i[0].detach()))
        layer.register_full_backward_hook(lambda m, gi, go: outputs.__setitem__(m, go[0].detach()))
    F.mse_loss(model(x.double()), target.double()).backward()
    found = []
    for layer in layers:
        a, g = inputs[layer], outputs[layer] * len(x)
        if layer.bias is not None:
            a = torch.cat([a, a.new_ones(len(a), 1)], dim=1)
        found.append((a.t() @ a / len(a), g.t() @ g / len(g), _gradient(layer)))
    return found


def _gradient(layer: Any) -> Any:
    """A linear layer's gradient as one matrix: [weight | bias]."""
    import torch

    if layer.bias is None:
        return layer.weight.grad.clone()
    return torch.cat([layer.weight.grad, layer.bias.grad[:, None]], dim=1)


def _precondition(a: Any, g: Any, grad: Any, damping: float, variant: str | None) -> Any:
    """(A kron G + damping I)^-1 vec(grad), vec stacking columns, as a dense solve in float64."""
    import torch

    eye_a, eye_g = torch.eye(len(a), dtype=a.dtype), torch.eye(len(g), dtype=g.dtype)
    if variant == "damping_on_a":
        curvature = torch.kron(a + damping * eye_a, g)
    elif variant == "damping_on_g":
        curvature = torch.kron(a, g + damping * eye_g)
    elif variant == "factored_damping":
        curvature = torch.kron(a + damping ** 0.5 * eye_a, g + damping ** 0.5 * eye_g)
    else:
        curvature = torch.kron(a, g) + damping * torch.eye(len(a) * len(g), dtype=a.dtype)
    solved = torch.linalg.solve(curvature, grad.t().reshape(-1))
    return solved.reshape(grad.shape[1], grad.shape[0]).t()


def kfac_reference(model: Any, batches: list[tuple[Any, Any]], world_size: int, damping: float, decay: float,
                   update_freq: int, variant: str | None = None, share: slice = slice(None)) -> list[list[Any]]:
    """Each step's preconditioned gradient of each layer, one process on the whole batches (with the
    variant "local_factors", the factors of the rows `share` alone)."""
    import torch

    averages: list[tuple[Any, Any]] = []
    found = []
    for step, (x, target) in enumerate(batches):
        batch = _factors(model, x, target)
        if step % (1 if variant == "every_step" else update_freq) == 0:
            scale = world_size if variant == "summed" else 1
            own = _factors(model, x[share], target[share]) if variant == "local_factors" else batch
            fresh = [(a * scale, g * scale) for a, g, _ in own]
            if averages and variant != "no_running_average":
                averages = [(decay * a0 + (1 - decay) * a1, decay * g0 + (1 - decay) * g1)
                            for (a0, g0), (a1, g1) in zip(averages, fresh)]
            else:
                averages = fresh
        if variant == "bias_apart":  # the weight's gradient with A's block of the inputs; the bias's column kept
            found.append([torch.cat([_precondition(a[:-1, :-1], g, grad[:, :-1], damping, None), grad[:, -1:]], dim=1)
                          if bias else _precondition(a, g, grad, damping, None)
                          for (a, g), (_, _, grad), (_, _, bias) in zip(averages, batch, KFAC_LAYERS)])
            continue
        found.append([grad if variant == "unpreconditioned" else _precondition(a, g, grad, damping, variant)
                      for (a, g), (_, _, grad) in zip(averages, batch)])
    return found


def _trace_decompositions() -> None:
    """Every decomposition or inverse torch.linalg makes from now on, traced with its matrix's size."""
    import torch

    for name in ("eigh", "eig", "svd", "cholesky", "inv", "solve", "pinv", "inv_ex", "cholesky_ex", "lstsq"):
        original = getattr(torch.linalg, name, None)
        if original is None or getattr(original, "_ddp_lab", False):
            continue

        def make(original: Callable[..., Any], name: str) -> Callable[..., Any]:
            @functools.wraps(original)
            def traced(matrix: Any, *args: Any, **kwargs: Any) -> Any:
                tracer.emit("decomposition", fn=name, size=int(matrix.shape[-1]))
                return original(matrix, *args, **kwargs)
            traced._ddp_lab = True  # type: ignore[attr-defined]
            return traced

        setattr(torch.linalg, name, make(original, name))


_noncontiguous_broadcasts = [0]  # how many broadcasts this process made of a tensor that is not contiguous


def _watch_broadcasts() -> None:
    """Count the broadcasts of a tensor that is not contiguous: gloo sends and receives the memory as it
    lies, so a tensor laid out column by column on one side and row by row on the other arrives transposed."""
    import torch.distributed as dist

    original = dist.broadcast
    if getattr(original, "_ddp_lab_contiguous", False):
        return

    @functools.wraps(original)
    def watched(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(tensor, "is_contiguous", lambda: True)():  # not a tensor: broadcast itself will say so
            _noncontiguous_broadcasts[0] += 1
        return original(tensor, *args, **kwargs)

    watched._ddp_lab_contiguous = True  # type: ignore[attr-defined]
    dist.broadcast = watched


@performs(KfacTask)
def kfac(rank: int, options: KfacTask, device: Any) -> KfacReport:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    report = KfacReport(options.world_size, rank)
    n = options.world_size
    _trace_decompositions()  # before the learner's file is imported: it may keep torch.linalg's functions
    _watch_broadcasts()
    try:
        kfac_cls = getattr(learner_module(options.script), "KFAC")
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    rows = _kfac_rows(n)
    mine = slice(rank * rows, (rank + 1) * rows)
    for case, (damping, decay, update_freq, steps) in enumerate(KFAC_CASES[1 if n == 1 else 0]):
        found = KfacCase(damping, decay, update_freq)
        report.cases.append(found)
        batches = _kfac_batches(n, steps)
        wanted = kfac_reference(kfac_model(), batches, n, damping, decay, update_freq)
        model = DistributedDataParallel(kfac_model())
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        got: list[list[Any]] = []
        sent_before = _noncontiguous_broadcasts[0]
        try:
            preconditioner = kfac_cls(model, damping=damping, factor_decay=decay, update_freq=update_freq)
            for step, (x, target) in enumerate(batches):
                model.zero_grad()
                F.mse_loss(model(x[mine]), target[mine]).backward()  # DDP averages the gradients
                tracer.emit("kfac_step", case=case, step=step)
                preconditioner.step()
                tracer.emit("kfac_step_end", case=case, step=step)
                got.append([_gradient(m) for m in layers])
        except BaseException as err:
            found.error = short_error(err, options.script)
            return report
        found.differences = [[relative(m, w, 1e-12) for m, w in zip(mine_step, wanted_step)]
                             for mine_step, wanted_step in zip(got, wanted)]
        if _noncontiguous_broadcasts[0] > sent_before:  # the others' results tell whether it did harm
            found.matches = "noncontiguous_broadcast"
        elif any(d > TOLERANCE for step in found.differences for d in step):
            for variant in (v for v in KFAC_VARIANTS if v and v not in OBSERVED_VARIANTS):
                # local factors: each layer's are this rank's, or those of the rank that decomposed it and sent it
                shares = [slice(k * rows, (k + 1) * rows) for k in range(n)] if variant == "local_factors" else [mine]
                others = [kfac_reference(kfac_model(), batches, n, damping, decay, update_freq, variant, s)
                          for s in shares]
                if all(any(all(relative(step[k], other[s][k], 1e-12) <= VARIANT_TOLERANCE
                               for s, step in enumerate(got)) for other in others) for k in range(len(layers))):
                    found.matches = variant
                    break
    return report
