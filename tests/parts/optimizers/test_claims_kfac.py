"""Notebook 25's claim about what K-FAC's G approximates, checked numerically on a small softmax
model: the Fisher information matrix (labels drawn from the model's own predicted distribution,
here its exact expectation over the classes) equals the generalised Gauss-Newton matrix; the
empirical Fisher (the true labels), which is what the course's K-FAC builds its G from, does not.
So the notebook must name the empirical Fisher (Martens and Grosse 2015; Kunstner, Balles and
Hennig 2019), not say that its F equals the Gauss-Newton matrix."""
from __future__ import annotations

import importlib.util
import json
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import ROOT

CLASSES, INPUTS, SAMPLES = 3, 4, 64


def _model_and_data() -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    """A softmax layer and labels from another one, so that the model's predictions are far from them."""
    torch.manual_seed(0)
    layer = nn.Linear(INPUTS, CLASSES, bias=False).double()
    x = torch.randn(SAMPLES, INPUTS, dtype=torch.float64)
    labels = (x @ torch.randn(INPUTS, CLASSES, dtype=torch.float64)).argmax(dim=1)
    return layer, x, labels


def _grad(layer: nn.Linear, x: torch.Tensor, label: int) -> torch.Tensor:
    """The gradient, with respect to the weight (as one vector), of one sample's loss with `label`."""
    layer.zero_grad()
    F.cross_entropy(layer(x[None]), torch.tensor([label])).backward()
    assert layer.weight.grad is not None
    return layer.weight.grad.reshape(-1).clone()


def test_the_fisher_is_the_gauss_newton_matrix_and_the_empirical_fisher_is_not() -> None:
    layer, x, labels = _model_and_data()
    n = CLASSES * INPUTS
    fisher, empirical, ggn = (torch.zeros(n, n, dtype=torch.float64) for _ in range(3))
    for i in range(SAMPLES):
        p = torch.softmax(layer(x[i]), dim=0).detach()
        grads = [_grad(layer, x[i], c) for c in range(CLASSES)]
        fisher += sum(p[c] * torch.outer(grads[c], grads[c]) for c in range(CLASSES)) / SAMPLES
        empirical += torch.outer(grads[int(labels[i])], grads[int(labels[i])]) / SAMPLES
        jac = torch.autograd.functional.jacobian(lambda w: F.linear(x[i], w.reshape(CLASSES, INPUTS)),
                                                 layer.weight.detach().reshape(-1))
        ggn += jac.t() @ (torch.diag(p) - torch.outer(p, p)) @ jac / SAMPLES  # the loss's Hessian in the logits
    assert torch.allclose(fisher, ggn, atol=1e-12)
    assert (empirical - ggn).norm() > 0.5 * ggn.norm(), "the empirical Fisher came out as the Gauss-Newton matrix"


def test_the_courses_kfac_builds_g_from_the_true_labels_the_empirical_fisher() -> None:
    """The solution's G, after one step, is the mean of (p - onehot(label)) (p - onehot(label))^T
    over the batch, the empirical factor; the Fisher's factor, the mean of diag(p) - p p^T, differs."""
    spec = importlib.util.spec_from_file_location("solution_kfac", ROOT / "solutions" / "kfac.py")
    assert spec and spec.loader
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    layer, x, labels = _model_and_data()
    kfac = module.KFAC(nn.Sequential(layer), damping=0.01)
    F.cross_entropy(layer(x), labels).backward()
    kfac.step()
    p = torch.softmax(layer(x), dim=1).detach()
    residual = p - F.one_hot(labels, CLASSES).double()
    empirical_g = residual.t() @ residual / SAMPLES
    fisher_g = (torch.diag_embed(p) - p[:, :, None] * p[:, None, :]).mean(dim=0)
    assert torch.allclose(kfac.G[layer], empirical_g, atol=1e-12)
    assert (kfac.G[layer] - fisher_g).norm() > 0.1 * fisher_g.norm()  # 30% here


def test_notebook_25_names_the_empirical_fisher() -> None:
    cells = json.loads((ROOT / "notebooks" / "25_kfac.ipynb").read_text())["cells"]
    text = " ".join(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())
    for needed in ("empirical Fisher", "true labels", "Kunstner, Balles and Hennig", "Martens and Grosse",
                   "drawn from the model's own predicted distribution"):
        assert needed in text, needed
    assert "is the **Fisher information matrix**; the slides add that it equals the generalised Gauss-Newton" not in text
