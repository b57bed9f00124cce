"""What notebooks 24-26 (part optimizers: LARS, K-FAC, K-FAC distributed) call, notebook 24's here: runs of the
exercises' own programs (exercises/lars.py, exercises/kfac.py) and what is read from their logs,
small computations that show a claim of the notebooks on real numbers, and the figures.

- notebook 24: each layer's ||w|| / ||grad|| on a fresh model (why one global rate fits no layer),
  the relative step your LARS gives each layer beside SGD's, and the lab's WideResNet trained at a
  large batch with SGD and with LARS;
- notebooks 25 and 26: K-FAC's (notebook_kfac.py); both draw with `accuracy` and read logs with
  `read_log`, here.

A run uses the learner's file when its check passes and the solution's otherwise, and the cell
says which. Every launch goes through runtime.run or the checker's Workspace: a time limit, and no
process left behind.
"""
from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from autograde.grading import api
from autograde.jupyter import runtime
from autograde.jupyter.figures import accuracy, finish  # noqa: F401 (accuracy: notebooks 24-26 draw with it)

LARS_SCRIPT, LARS_SOLUTION = "exercises/lars.py", "solutions/lars.py"
KFAC_SCRIPT, KFAC_SOLUTION = "exercises/kfac.py", "solutions/kfac.py"
BATCH = 256 if runtime.QUICK else 2048  # the "large" global batch: the quick stand-in has 1024 images
EPOCHS = 3
# The rates of notebook 26's runs, picked on the full stand-in at a batch of 2048: SGD at 0.8 stayed
# at 10-21% for 3 epochs and at 0.3 reached 48% at epoch 3, against 95.5% at 0.1. LARS's global rate
# 8 with eta 0.001 (the program's default) moves every layer by about 0.8% of its norm a step.
SGD_LR, LARS_LR, KFAC_LR = 0.1, 8.0, 0.1
UPDATE_FREQ = 10


# Which file runs -----------------------------------------------------------------------------

def working(item: str, script: str, solution: str) -> str:
    """`script` if the check of `item` passes (its verdict is usually known by now), else
    `solution`; the cell says which."""
    (result,) = api.check_steps([item], quiet=True)
    if result.passed is False and not runtime.handed_out(solution):  # an assignment has no solutions/
        print(f"{script}: the check of {item} does not pass yet ({result.observed}); running it as it is")
        return script
    if result.passed is False:
        print(f"{script}: the check of {item} does not pass yet ({result.observed}); running {solution} instead")
        return solution
    print(f"running your {script} (the check of {item} passes)")
    return script


def _launch(script: str, fallback: str | None, args: list[str], timeout: float) -> str:
    """`python SCRIPT ARGS` through runtime.run, output hidden; when it fails, `fallback`'s (said)."""
    try:
        return runtime.run([sys.executable, runtime.course_file(script), *args], timeout=timeout, echo=False)
    except runtime.LaunchError as err:
        if fallback is None or not runtime.handed_out(fallback):  # an assignment has no solutions/
            raise
        print(f"{script} failed ({err}): running {fallback} instead")
        return runtime.run([sys.executable, runtime.course_file(fallback), *args], timeout=timeout, echo=False)


read_log = runtime.read_log


# Notebook 24: LARS ---------------------------------------------------------------------------

def _batch(size: int) -> tuple[Any, Any]:
    """The first `size` training images of the notebook's data (the stand-in here) and their labels."""
    import torch
    from torchvision.datasets import FashionMNIST
    from torchvision.transforms import ToTensor

    data = FashionMNIST(str(runtime.data_dir()[0]), train=True, download=False, transform=ToTensor())
    size = min(size, len(data))
    return torch.stack([data[i][0] for i in range(size)]), torch.tensor([int(data[i][1]) for i in range(size)])


def _model(module: ModuleType, model: str) -> Any:
    import torch

    torch.manual_seed(0)
    return module.wide_resnet(1) if model == "wideresnet" else module.mlp()


@dataclass(frozen=True)
class Layer:
    """One weight of a fresh model after one backward pass on a large batch."""

    name: str
    shape: tuple[int, ...]
    weight_norm: float
    grad_norm: float

    @property
    def ratio(self) -> float:
        return self.weight_norm / self.grad_norm if self.grad_norm else math.inf


def layer_norms(model: str = "wideresnet", batch_size: int = 1024) -> list[Layer]:
    """||w|| and ||grad|| of every weight with more than one dimension of a fresh `model` ("mlp" or
    "wideresnet", from exercises/lars.py) after one backward pass on `batch_size` images."""
    import torch.nn.functional as F

    net = _model(runtime.exercise(LARS_SCRIPT), model)  # the models are outside the file's TODO
    images, labels = _batch(batch_size)
    F.cross_entropy(net(images), labels).backward()
    return [Layer(name, tuple(p.shape), float(p.detach().norm()), float(p.grad.norm()))
            for name, p in net.named_parameters() if p.dim() > 1]


def ratios(layers: list[Layer]) -> Figure:
    """Each weight's ||w|| / ||grad||, on a log scale: the step SGD takes, against the weight's own
    size, differs by that much from layer to layer."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.bar(range(len(layers)), [layer.ratio for layer in layers], color="tab:blue")
    ax.set_xticks(range(len(layers)), [layer.name.replace(".weight", "") for layer in layers], rotation=60,
                  ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("||w|| / ||grad||")
    ax.set_title("each layer's weights against its gradient, on a fresh model")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return finish(fig)


def relative_steps(model: str = "mlp", lr_sgd: float = SGD_LR, lr_lars: float = LARS_LR, batch_size: int = 1024,
                   script: str = LARS_SCRIPT) -> dict[str, dict[str, float]]:
    """One step from the same fresh `model` on the same batch, with torch.optim.SGD and with the LARS
    of `script` (momentum 0.9, weight decay 5e-4): each weight's ||step|| / ||w||, by optimizer and
    layer. Printed as a table."""
    import torch
    import torch.nn.functional as F

    module = runtime.exercise(script)
    images, labels = _batch(batch_size)
    found: dict[str, dict[str, float]] = {}
    makers: dict[str, Callable[[Any], Any]] = {
        "SGD": lambda params: torch.optim.SGD(params, lr=lr_sgd, momentum=0.9, weight_decay=5e-4),
        "LARS": lambda params: module.LARS(params, lr=lr_lars, weight_decay=5e-4)}
    for name, make in makers.items():
        net = _model(module, model)
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        F.cross_entropy(net(images), labels).backward()
        make(net.parameters()).step()
        found[name] = {n: float((p.detach() - before[n]).norm() / before[n].norm())
                       for n, p in net.named_parameters() if p.dim() > 1}
    print(f"{'weight':<22}" + "".join(f"{f'{name}: |step| / |w|':>22}" for name in found))
    for layer in found["SGD"]:
        print(f"{layer:<22}" + "".join(f"{found[name][layer]:>22.5f}" for name in found))
    return found


def lars_runs(model: str = "wideresnet", script: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """`model` trained at a large batch by exercises/lars.py with SGD and with LARS, both after a
    one-epoch warm-up: each run's log. Quick mode: 2 epochs on the small stand-in; otherwise 5 epochs
    on 16384 images of it at a batch of 1024 (the WideResNet on 2 cores: a few minutes)."""
    script = script or working("lars", LARS_SCRIPT, LARS_SOLUTION)
    size = (["--batch-size", "256", "--epochs", "2"] if runtime.QUICK
            else ["--batch-size", "1024", "--epochs", "5", "--train-images", "16384"])
    logs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for optimizer, lr in (("sgd", SGD_LR), ("lars", LARS_LR)):
            log = Path(folder) / f"{optimizer}.jsonl"
            print(f"{optimizer} at lr {lr} ...", flush=True)
            _launch(script, LARS_SOLUTION, ["--model", model, "--optimizer", optimizer, "--lr", str(lr),
                                            "--warmup-epochs", "1", *size, "--data-dir", str(runtime.data_dir()[0]),
                                            "--log-file", str(log)], timeout=600)
            logs[optimizer.upper()] = read_log(log)
    return logs


def table(logs: dict[str, list[dict[str, Any]]]) -> str:
    """Each run's validation accuracy by epoch and its time per step (the last epoch's seconds over
    the steps taken: validation included)."""
    epochs = max(len(records) for records in logs.values())
    lines = [f"{'run':<16}" + "".join(f"{f'epoch {e + 1}':>10}" for e in range(epochs)) + f"{'ms a step':>12}"]
    for name, records in logs.items():
        last = records[-1]
        lines.append(f"{name:<16}" + "".join(f"{r['accuracy']:>10.1%}" for r in records)
                     + f"{1000 * last['seconds'] / last['steps']:>12.0f}")
    return "\n".join(lines)
