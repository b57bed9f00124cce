"""The claims notebooks 36 to 38 make, checked for real: what autograd keeps for an MLP's backward (36); that k
micro-batches' losses divided by k give the whole batch's gradient (37); that a convolution is a matrix product
on patches, that an example's weight gradient sums its positions' g a^T, and that under the notebook's
weighing of the positions A kron G has the exact Fisher block's scale when the positions are alike and
uncorrelated (38); and the programs' answers to bad input."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import ROOT


def _solution(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"solution_{name}", ROOT / "solutions" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_mlp_keeps_each_linear_layers_input_for_backward_once() -> None:
    """Notebook 36: a Linear keeps its input, a ReLU its output, the next Linear's input: the same buffer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 7), nn.ReLU(), nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(4, 10))
    assert sum(kept.values()) == 4 * 4 * (10 + 7 + 5)
    budget = _solution("memory_budget").bytes_per_rank(model, 4, 0, 1)
    assert budget["activations"] == sum(kept.values())


def test_micro_batches_losses_divided_by_k_give_the_whole_batchs_gradient() -> None:
    """Notebook 37's premise."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    F.cross_entropy(model(x), y).backward()
    whole = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    for xs, ys in zip(x.chunk(4), y.chunk(4)):
        (F.cross_entropy(model(xs), ys) / 4).backward()
    assert all(torch.allclose(p.grad, g, atol=1e-7) for p, g in zip(model.parameters(), whole) if p.grad is not None)


def _conv_case() -> tuple[nn.Conv2d, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Conv2d(3, 4, (3, 2), stride=2, padding=1).double(), torch.randn(5, 3, 9, 8, dtype=torch.float64)


def test_a_convolution_is_a_matrix_product_on_its_patches_and_its_gradient_sums_the_positions() -> None:
    """Notebook 38: each output number is the kernel times its patch plus the bias; an example's weight gradient is
    the sum over the positions of g a^T."""
    conv, x = _conv_case()
    patches = F.unfold(x, conv.kernel_size, padding=conv.padding, stride=conv.stride)  # (B, patch, L)
    out = conv(x)
    by_patches = conv.weight.reshape(len(conv.weight), -1) @ patches + conv.bias[:, None]
    assert torch.allclose(by_patches, out.flatten(2))
    g = torch.randn_like(out)
    (out * g).sum().backward()
    summed = torch.einsum("bol,bpl->op", g.flatten(2), patches)
    assert conv.weight.grad is not None and torch.allclose(summed, conv.weight.grad.reshape(len(conv.weight), -1))


def test_the_factors_have_the_fishers_scale_where_positions_are_alike_and_uncorrelated() -> None:
    """Notebook 38's weighing: with patches and output gradients independent, alike at every position and
    uncorrelated across positions, A kron G's trace matches the exact Fisher block's (the mean of each example's
    vec(grad) vec(grad)^T) within sampling noise; without the positions' count it is L times too small."""
    torch.manual_seed(0)
    kfac_conv = _solution("kfac_conv")
    conv = nn.Conv2d(2, 3, 3, padding=1)
    batch = 400
    x = torch.randn(batch, 2, 6, 6)
    g = torch.randn(batch, 3, 6, 6) / batch  # the gradient of a mean loss: each example's own, over the batch
    A, G = kfac_conv.kfac_factors(conv, x, g)
    patches = F.unfold(x, 3, padding=1)
    patches = torch.cat([patches, torch.ones(batch, 1, patches.shape[-1])], dim=1)
    per_example = torch.einsum("bol,bpl->bop", g.flatten(2) * batch, patches).reshape(batch, -1)  # rows of vec(grad), G-major
    exact = (per_example.T @ per_example / batch).double()
    ratio = float(torch.kron(G, A).double().trace() / exact.trace())
    assert abs(ratio - 1) < 0.05, ratio


@pytest.mark.launch
def test_the_programs_answer_bad_input_in_one_line() -> None:
    for program, args in (("memory_budget", ["--layers", "0"]), ("accumulation", ["--batch-size", "10"]),
                          ("kfac_conv", ["--batch-size", "0"])):
        done = subprocess.run([sys.executable, str(ROOT / "solutions" / f"{program}.py"), *args], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, (program, done.stderr)
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{program}.py: error: ") and "Traceback" not in done.stderr, (program, done.stderr)
