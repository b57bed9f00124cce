"""K-FAC for convolutions (part memory, notebook 38) inside the learner's process.

`kfac_conv`: a small net of three convolutions (padding, a stride, a kernel that is not square, one without a
bias, a 1x1) and a linear layer, one batch through it and a cross-entropy (a mean) back; each layer's input and
output gradient, as a preconditioner's hooks see them, go to the learner's `kfac_factors`, whose A kron G is
compared with the Fisher's Kronecker approximation computed here in float64 (the mean over examples and output
positions of the patches' a a^T, and the positions' count times the mean of each example's g g^T: only the
product is judged, so a learner may weigh the count into either factor). Then the learner's `precondition`, given
these reference factors as float32, must leave each gradient equal to (A kron G + damping I)^-1 applied to it,
solved here densely in float64; where it differs, the gradient of a known mistake is tried too.
"""
from __future__ import annotations

from typing import Any

from autograde.inprocess.learner_file import learner_module, short_error
from autograde.parts.memory.reports import (
    KFAC_CONV_BATCH,
    KFAC_CONV_CHANNELS,
    KFAC_CONV_CLASSES,
    KFAC_CONV_DAMPING,
    KFAC_CONV_LAYERS,
    KFAC_CONV_SIDE,
    KfacConvReport,
    KfacConvTask,
    KfacLayerCase,
)
from autograde.protocol import performs


def _net() -> tuple[Any, list[Any]]:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers = [nn.Conv2d(**kwargs) if kind == "conv" else nn.Linear(**kwargs)  # type: ignore[arg-type]
              for _, kind, kwargs in KFAC_CONV_LAYERS]
    net = nn.Sequential(layers[0], nn.Tanh(), layers[1], nn.Tanh(), layers[2], nn.Tanh(), nn.Flatten(), layers[3])
    return net, layers


def _as_matrix(layer: Any, weight: Any, bias: Any) -> Any:
    """A weight (and bias) laid out as the contract says: a row per output, a column per input, the bias last."""
    import torch

    matrix = weight.reshape(len(weight), -1)
    return torch.cat([matrix, bias[:, None]], dim=1) if bias is not None else matrix


def _reference(layer: Any, inputs: Any, grad: Any) -> tuple[Any, Any, int]:
    """The Fisher's Kronecker factors in float64, and the output positions."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    x, g = inputs.double(), grad.double() * len(inputs)  # each example's own gradient: the loss is a mean
    if isinstance(layer, nn.Conv2d):
        padding: Any = layer.padding  # numeric here: the net's layers are KFAC_CONV_LAYERS
        patches = F.unfold(x, layer.kernel_size, dilation=layer.dilation, padding=padding, stride=layer.stride)
        positions = patches.shape[-1]
        a = patches.permute(0, 2, 1).reshape(-1, patches.shape[1])
        g = g.permute(0, 2, 3, 1).reshape(-1, g.shape[1])
    else:
        positions, a = 1, x
    if layer.bias is not None:
        a = torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype)], dim=1)
    return a.T @ a / len(a), positions * (g.T @ g) / len(g), positions


def _relative(found: Any, expected: Any) -> float:
    scale = float(expected.abs().max()) or 1.0
    return float((found.double() - expected).abs().max()) / scale if found.shape == expected.shape else float("inf")


def _judge_factors(case: KfacLayerCase, found: Any, product: Any) -> None:
    import torch

    if not (isinstance(found, (tuple, list)) and len(found) == 2 and all(isinstance(f, torch.Tensor) for f in found)):
        case.factors_error = f"kfac_factors returned {type(found).__name__}, not two tensors (A, G)"
        return
    a, g = (f.detach().double().cpu() for f in found)
    case.a_shape, case.g_shape = list(a.shape), list(g.shape)
    if case.a_shape != [case.columns] * 2 or case.g_shape != [case.rows] * 2:
        return
    mine = torch.kron(g, a)
    case.product = _relative(mine, product)
    ratio = float((mine * product).sum() / (product * product).sum())
    if ratio > 0 and _relative(mine / ratio, product) < 1e-4:
        case.ratio = ratio


def _variants(A: Any, G: Any, damping: float, matrix: Any) -> dict[str, Any]:
    """The preconditioned matrix of known mistakes, in float64."""
    import torch

    eye = torch.eye
    damped = torch.kron(G + damping**0.5 * eye(len(G), dtype=G.dtype), A + damping**0.5 * eye(len(A), dtype=A.dtype))
    flat = matrix.reshape(-1)
    return {"damped_factors": torch.linalg.solve(damped, flat).reshape(matrix.shape),
            "no_inverse": (torch.kron(G, A) + damping * eye(len(flat), dtype=A.dtype)).matmul(flat).reshape(matrix.shape)}


def _judge_precondition(case: KfacLayerCase, layer: Any, module: Any, A: Any, G: Any, script: str) -> None:
    import torch

    weight, bias = layer.weight, layer.bias
    before = _as_matrix(layer, weight.grad, bias.grad if bias is not None else None).double()
    product = torch.kron(G, A)
    damping = KFAC_CONV_DAMPING * float(product.diagonal().mean())
    expected = torch.linalg.solve(product + damping * torch.eye(len(product), dtype=product.dtype),
                                  before.reshape(-1)).reshape(before.shape)
    shapes = weight.grad.shape, bias.grad.shape if bias is not None else None
    try:
        module.precondition(layer, A.float(), G.float(), damping)
    except BaseException as err:
        case.precondition_error = short_error(err, script)
        return
    weight_grad, bias_grad = weight.grad, bias.grad if bias is not None else None
    case.shapes_kept = (weight_grad is not None and weight_grad.shape == shapes[0]
                        and (bias is None or (bias_grad is not None and bias_grad.shape == shapes[1])))
    if not case.shapes_kept or weight_grad is None:
        return
    after = _as_matrix(layer, weight_grad.detach(), bias_grad.detach() if bias_grad is not None else None).double()
    case.preconditioned = _relative(after, expected)
    if case.preconditioned <= 1e-4:
        return
    if bias is not None:
        case.bias_untouched = bool(torch.equal(after[:, -1], before[:, -1]))
    for name, variant in _variants(A, G, damping, before).items():
        if _relative(after, variant) <= 1e-4:
            case.matches = name
            return


@performs(KfacConvTask)
def kfac_conv(rank: int, options: KfacConvTask, device: Any) -> KfacConvReport:
    import torch
    import torch.nn.functional as F

    report = KfacConvReport(options.world_size, rank, KFAC_CONV_BATCH)
    try:
        module = learner_module(options.script)
    except BaseException as err:
        report.error = short_error(err, options.script)
        return report
    net, layers = _net()
    seen: dict[int, list[Any]] = {}

    def keep(layer: Any, inputs: Any, output: Any) -> None:  # what a preconditioner's hooks see
        seen[id(layer)] = [inputs[0].detach()]
        output.register_hook(lambda grad: seen[id(layer)].append(grad.detach()))

    hooks = [layer.register_forward_hook(keep) for layer in layers]
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(KFAC_CONV_BATCH, KFAC_CONV_CHANNELS, KFAC_CONV_SIDE, KFAC_CONV_SIDE, generator=generator)
    labels = torch.randint(0, KFAC_CONV_CLASSES, (KFAC_CONV_BATCH,), generator=generator)
    F.cross_entropy(net(x), labels).backward()
    for hook in hooks:
        hook.remove()
    for (name, _, _), layer in zip(KFAC_CONV_LAYERS, layers):
        inputs, grad = seen[id(layer)]
        A, G, positions = _reference(layer, inputs, grad)
        case = KfacLayerCase(name, positions, len(A), len(G))
        report.layers.append(case)
        try:
            found = module.kfac_factors(layer, inputs.clone(), grad.clone())
        except BaseException as err:
            case.factors_error = short_error(err, options.script)
        else:
            _judge_factors(case, found, torch.kron(G, A))
        _judge_precondition(case, layer, module, A, G, options.script)
    return report
