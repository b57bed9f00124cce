"""What notebooks 24-26 (part optimizers: LARS, K-FAC, K-FAC distributed) call: runs of the
exercises' own programs (exercises/lars.py, exercises/kfac.py) and what is read from their logs,
small computations that show a claim of the notebooks on real numbers, and the figures.

- notebook 24: each layer's ||w|| / ||grad|| on a fresh model (why one global rate fits no layer),
  the relative step your LARS gives each layer beside SGD's, and the lab's WideResNet trained at a
  large batch with SGD and with LARS;
- notebook 25: A and G of a small layer, and (A kron G + damping I)^-1 vec(grad) computed twice,
  by a dense solve and from the two eigendecompositions; the sizes of the blocks K-FAC avoids;
- notebook 26: eigh's column-major eigenvectors and what a broadcast makes of them (a 2-process
  gloo run of this module: `python -m autograde.notebook.optimizers broadcast`); SGD, LARS and
  K-FAC on the same MLP at the same global batch, and K-FAC's own cost per step timed in this
  process; K-FAC's communication per step against update_freq, read from a run traced by the checker.

A run uses the learner's file when its check passes and the solution's otherwise, and the cell
says which. Every launch goes through runtime.run or the checker's Workspace: a time limit, and no
process left behind.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from autograde.checker import api
from autograde.checker.runs import Family, Run, Workspace
from autograde.checks.inside import traces_by_rank
from autograde.notebook import runtime
from autograde.notebook.figure_style import finish
from autograde.notebook.scaling import exercise
from autograde.protocol import COLLECTIVES, TRACE_STEPS

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


def read_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a program's --log-file holds, one per epoch."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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

    net = _model(exercise(LARS_SCRIPT), model)  # the models are outside the file's TODO
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

    module = exercise(script)
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


def accuracy(logs: dict[str, list[dict[str, Any]]], by_time: bool = True) -> Figure:
    """Validation accuracy of each run by epoch, and (with `by_time`) by wall-clock seconds."""
    fig, axes = plt.subplots(1, 2 if by_time else 1, figsize=(11 if by_time else 6, 3.6), squeeze=False)
    for name, records in logs.items():
        axes[0][0].plot([r["epoch"] for r in records], [r["accuracy"] for r in records], "o-", label=name)
        if by_time:
            axes[0][1].plot([r["seconds"] for r in records], [r["accuracy"] for r in records], "o-", label=name)
    axes[0][0].set_xlabel("epoch")
    axes[0][0].xaxis.set_major_locator(MaxNLocator(integer=True))
    if by_time:
        axes[0][1].set_xlabel("seconds since the training began (this machine)")
    for ax in axes[0]:
        ax.set_ylabel("validation accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return finish(fig)


# Notebook 25: K-FAC on one process -----------------------------------------------------------

@dataclass
class Preconditioned:
    """A small layer's factors and its preconditioned gradient computed two ways."""

    A: Any
    G: Any
    grad: Any
    dense: Any
    eigen: Any

    @property
    def difference(self) -> float:
        """The largest difference between the two results, relative to the largest entry."""
        return float((self.dense - self.eigen).abs().max() / self.dense.abs().max())


def factors(layer: Any, x: Any, loss_fn: Callable[[Any], Any]) -> tuple[Any, Any, Any]:
    """A, G and [grad_W | grad_b] of `layer` on the batch `x`, as notebook 25 defines them: A the
    mean of a a^T (a the input, 1 appended with a bias), G the mean of g g^T (g = batch size x the
    gradient of the loss with respect to the layer's output; the loss is a mean over the batch)."""
    import torch

    out = layer(x)
    out.retain_grad()
    layer.zero_grad()
    loss_fn(out).backward()
    a = torch.cat([x, x.new_ones(len(x), 1)], dim=1) if layer.bias is not None else x
    g = out.grad * len(x)
    grad = torch.cat([layer.weight.grad, layer.bias.grad[:, None]], dim=1) if layer.bias is not None else layer.weight.grad
    return a.t() @ a / len(a), g.t() @ g / len(g), grad.detach()


def dense_solve(A: Any, G: Any, grad: Any, damping: float) -> Any:
    """(A kron G + damping I)^-1 vec(grad) with vec stacking the columns, by a dense solve, back in grad's shape."""
    import torch

    curvature = torch.kron(A, G) + damping * torch.eye(len(A) * len(G), dtype=A.dtype)
    solved = torch.linalg.solve(curvature, grad.t().reshape(-1))  # grad.t() row by row: grad's columns
    return solved.reshape(grad.shape[1], grad.shape[0]).t()


def eigen_solve(A: Any, G: Any, grad: Any, damping: float) -> Any:
    """The same from the eigendecompositions A = Q_A diag(l_A) Q_A^T and G = Q_G diag(l_G) Q_G^T:
    Q_G [(Q_G^T grad Q_A) / (l_G l_A^T + damping)] Q_A^T, divided entry by entry."""
    import torch

    values_a, vectors_a = torch.linalg.eigh(A)
    values_g, vectors_g = torch.linalg.eigh(G)
    v = vectors_g.t() @ grad @ vectors_a
    return vectors_g @ (v / (values_g[:, None] * values_a[None, :] + damping)) @ vectors_a.t()


def small_layer(inputs: int = 6, outputs: int = 4, batch: int = 32, damping: float = 1e-3,
                seed: int = 0) -> Preconditioned:
    """A linear layer `inputs` -> `outputs` (with a bias) under a cross-entropy loss on a random
    batch, in float64: its A, G and gradient, preconditioned by the dense solve and by the
    eigenbasis formula. Prints the sizes and how far apart the two are."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    layer = nn.Linear(inputs, outputs).double()
    x = torch.randn(batch, inputs, dtype=torch.float64)
    target = torch.randint(outputs, (batch,))
    A, G, grad = factors(layer, x, lambda out: F.cross_entropy(out, target))
    found = Preconditioned(A, G, grad, dense_solve(A, G, grad, damping), eigen_solve(A, G, grad, damping))
    n = len(A) * len(G)
    print(f"A: {tuple(A.shape)}, G: {tuple(G.shape)}, the gradient [W | b]: {tuple(grad.shape)}; "
          f"A kron G: {n} x {n}")
    print(f"dense solve against the eigenbasis formula: largest difference {found.difference:.1e} "
          "of the largest entry")
    return found


def block_sizes(layers: list[tuple[int, int]] | None = None) -> list[dict[str, int]]:
    """For each linear layer (inputs, outputs), with a bias: the numbers in its block of the Fisher
    matrix, ((inputs + 1) x outputs)^2, and in A and G together. Printed as a table; by default the
    MLP of exercises/kfac.py."""
    layers = layers or [(784, 128), (128, 64), (64, 10)]
    found = []
    print(f"{'layer':<12}{'weights':>10}{'Fisher block':>18}{'A and G':>12}")
    for inputs, outputs in layers:
        weights = (inputs + 1) * outputs
        row = {"inputs": inputs, "outputs": outputs, "weights": weights, "block": weights ** 2,
               "factors": (inputs + 1) ** 2 + outputs ** 2}
        found.append(row)
        print(f"{f'{inputs} -> {outputs}':<12}{weights:>10,}{row['block']:>18,}{row['factors']:>12,}")
    return found


def kfac_program(world_size: int = 1, optimizer: str = "kfac", script: str | None = None, epochs: int = 2,
                 update_freq: int = UPDATE_FREQ) -> list[dict[str, Any]]:
    """Runs exercises/kfac.py as a learner would, output shown (`script`; by default yours when the
    check of kfac passes, else the solution): `world_size` processes, a small share of the stand-in
    in quick mode. Its log."""
    script = script or working("kfac", KFAC_SCRIPT, KFAC_SOLUTION)
    size = ["--batch-size", "256", "--train-images", "1024"] if runtime.QUICK else ["--batch-size", str(BATCH)]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "run.jsonl"
        runtime.run([sys.executable, runtime.course_file(script), "--world-size", str(world_size), "--optimizer",
                     optimizer, "--update-freq", str(update_freq), "--epochs", str(epochs), *size, "--data-dir",
                     str(runtime.data_dir()[0]), "--log-file", str(log)], timeout=300)
        return read_log(log)


def kfac_cost(batch_size: int = BATCH, repeats: int = 5, script: str | None = None) -> dict[str, float]:
    """Seconds, here in this process on one core, that one training step of exercises/kfac.py's MLP
    on `batch_size` images spends in: the forward and backward passes; KFAC.step() when it only
    preconditions; KFAC.step() when it also refreshes the factors and decomposes them. The median
    of `repeats` of each; printed."""
    import torch

    module = exercise(script or working("kfac", KFAC_SCRIPT, KFAC_SOLUTION))
    images, labels = _batch(batch_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the program's processes
    try:
        with warnings.catch_warnings():  # the hooks fire on a layer whose input needs no gradient: as meant
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            found = _time_kfac(module, images, labels, repeats)
    finally:
        torch.set_num_threads(threads)
    medians = {name: statistics.median(times) for name, times in found.items()}
    for name, seconds in medians.items():
        print(f"{name:<30}{1000 * seconds:8.1f} ms")
    return medians


def _time_kfac(module: ModuleType, images: Any, labels: Any, repeats: int) -> dict[str, list[float]]:
    """kfac_cost's measurements, `repeats` of each, a refresh every other step."""
    import time

    import torch.nn.functional as F

    model = module.make_model()
    kfac = module.KFAC(model, damping=0.003, update_freq=2)
    found: dict[str, list[float]] = {"forward and backward": [], "K-FAC, preconditioning only": [],
                                     "K-FAC, with a refresh": []}
    for k in range(2 * repeats):
        start = time.perf_counter()
        model.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        middle = time.perf_counter()
        kfac.step()
        end = time.perf_counter()
        found["forward and backward"].append(middle - start)
        found["K-FAC, with a refresh" if k % 2 == 0 else "K-FAC, preconditioning only"].append(end - middle)
    return found


# Notebook 26: K-FAC distributed --------------------------------------------------------------

def eigh_layout(n: int = 4) -> Any:
    """The eigenvectors torch.linalg.eigh returns for a symmetric n x n matrix: printed with their
    strides and whether they are contiguous; returned."""
    import torch

    torch.manual_seed(0)
    m = torch.randn(n, n, dtype=torch.float64)
    _, vectors = torch.linalg.eigh(m @ m.t())
    print(f"eigenvectors: shape {tuple(vectors.shape)}, strides {vectors.stride()}, contiguous: "
          f"{vectors.is_contiguous()}; after .contiguous(): strides {vectors.contiguous().stride()}")
    return vectors


def _broadcast_worker(rank: int, port: int, out: str) -> None:
    """One of 2 gloo processes: rank 0 broadcasts eigh's eigenvectors as they are, then a
    contiguous copy; rank 1 writes what it received, and what rank 0 had, to `out`."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = torch.randn(4, 4, dtype=torch.float64)
    _, vectors = torch.linalg.eigh(m @ m.t())  # the same on both ranks: rank 1 compares with it
    found = {}
    for name, sent in (("as eigh returns them", vectors), ("after .contiguous()", vectors.contiguous())):
        t = sent if rank == 0 else torch.empty(4, 4, dtype=torch.float64)
        dist.broadcast(t, src=0)
        found[name] = {"equal": bool(torch.equal(t, vectors)), "transposed": bool(torch.equal(t, vectors.t()))}
    if rank == 1:
        Path(out).write_text(json.dumps(found))
    dist.destroy_process_group()


def broadcast_demo() -> dict[str, dict[str, bool]]:
    """Runs `python -m autograde.notebook.optimizers broadcast` (2 gloo processes) and says, for
    eigh's eigenvectors broadcast as they are and made contiguous first, whether rank 1 received
    rank 0's matrix or its transpose."""
    from autograde import processes

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "received.json"
        runtime.run([sys.executable, "-m", "autograde.notebook.optimizers", "broadcast", str(processes.free_port()),
                     str(out)], timeout=120)
        found: dict[str, dict[str, bool]] = json.loads(out.read_text())
    for name, r in found.items():
        what = "rank 0's matrix" if r["equal"] else "its transpose" if r["transposed"] else "something else"
        print(f"eigenvectors {name}: rank 1 received {what}")
    return found


def compare(script_lars: str | None = None, script_kfac: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Notebook 26's experiment: the same MLP at the same global batch (BATCH) for EPOCHS epochs, on
    one process: SGD and LARS (exercises/lars.py, a one-epoch warm-up), SGD and SGD + K-FAC
    (exercises/kfac.py --world-size 1: the same loop with and without the preconditioner, so that
    their times compare). Each run's log, by name."""
    script_lars = script_lars or working("lars", LARS_SCRIPT, LARS_SOLUTION)
    script_kfac = script_kfac or working("kfac", KFAC_SCRIPT, KFAC_SOLUTION)
    common = ["--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--data-dir", str(runtime.data_dir()[0])]
    runs = {
        "SGD": (script_lars, LARS_SOLUTION, ["--model", "mlp", "--optimizer", "sgd", "--lr", str(SGD_LR),
                                             "--warmup-epochs", "1"]),
        "SGD + LARS": (script_lars, LARS_SOLUTION, ["--model", "mlp", "--optimizer", "lars", "--lr", str(LARS_LR),
                                                    "--warmup-epochs", "1"]),
        "SGD (kfac.py)": (script_kfac, KFAC_SOLUTION, ["--world-size", "1", "--optimizer", "sgd", "--lr", str(KFAC_LR)]),
        "SGD + K-FAC": (script_kfac, KFAC_SOLUTION, ["--world-size", "1", "--optimizer", "kfac", "--lr", str(KFAC_LR),
                                                     "--update-freq", str(UPDATE_FREQ)]),
    }
    logs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for k, (name, (script, fallback, args)) in enumerate(runs.items()):
            log = Path(folder) / f"{k}.jsonl"
            print(f"{name} ...", flush=True)
            _launch(script, fallback, [*args, *common, "--log-file", str(log)], timeout=600)
            logs[name] = read_log(log)
    print(table(logs))
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


@dataclass
class Communication:
    """What a traced K-FAC run on 2 processes communicated, step by step (rank 0's trace)."""

    update_freq: int
    gradients: int                                   # floats DDP all-reduces every step (the model's parameters)
    factors: list[int] = field(default_factory=list)      # floats of K-FAC's all-reduces, by step
    broadcasts: list[int] = field(default_factory=list)   # K-FAC's broadcasts, by step
    decompositions: list[int] = field(default_factory=list)  # floats those broadcasts carry (see communication())
    seconds: list[float] = field(default_factory=list)    # time inside K-FAC's collectives, by step
    step_seconds: list[float] = field(default_factory=list)  # from one step's end to the next's

    def per_step(self) -> float:
        """The mean floats handed to collectives per step: gradients, factors and decompositions."""
        return self.gradients + (sum(self.factors) + sum(self.decompositions)) / len(self.factors)


def _communication(run: Run, update_freq: int, gradients: int) -> Communication:
    problem = run.problem()
    if problem:
        raise runtime.LaunchError(problem)
    traces = {rank: t for (_, rank), t in traces_by_rank(run).items()}
    if 0 not in traces:
        raise runtime.LaunchError("rank 0 left no trace")
    found = Communication(update_freq, gradients)
    begun, entered, step_end = False, 0.0, None
    numbers: list[int] = []  # this step's all-reduced floats, one entry per all-reduce
    broadcasts, seconds = 0, 0.0  # this step's
    for e in traces[0].events:
        if e["ev"] == "ddp":
            begun = True  # what DDP's constructor calls is not K-FAC's
        elif not begun:
            continue
        elif e["ev"] == "enter" and e.get("call") in COLLECTIVES:
            entered = e["t"]
            numbers += [int(e.get("numel") or 0)] if e["call"] == "all_reduce" else []
            broadcasts += e["call"] == "broadcast"
        elif e["ev"] == "exit" and e.get("call") in COLLECTIVES:
            seconds += e["t"] - entered
        elif e["ev"] == "step":
            found.factors.append(sum(numbers))
            found.broadcasts.append(broadcasts)
            # each all-reduced n x n factor is decomposed into n eigenvalues and n x n eigenvectors
            found.decompositions.append(sum(n + math.isqrt(n) for n in numbers) if broadcasts else 0)
            found.seconds.append(seconds)
            numbers, broadcasts, seconds = [], 0, 0.0
            if step_end is not None:
                found.step_seconds.append(e["t"] - step_end)
            step_end = e["t"]
    if not found.factors:
        raise runtime.LaunchError("the run made no optimizer step")
    return found


def communication(update_freqs: tuple[int, ...] = (1, UPDATE_FREQ), script: str | None = None) -> list[Communication]:
    """exercises/kfac.py (`script`; the solution's when kfac_distributed does not pass) run by the
    checker on 2 processes with K-FAC, once per update_freq, every optimizer step and every
    torch.distributed call traced. From rank 0's trace, per step: the floats of K-FAC's all-reduces
    (measured), its broadcasts (counted; the floats they carry computed as n + n^2 for each
    all-reduced n x n factor, eigenvalues and eigenvectors) and the time inside them. DDP's gradient
    all-reduce runs in C++, out of the tracer's sight: its size is the model's parameter count."""
    script = script or working("kfac_distributed", KFAC_SCRIPT, KFAC_SOLUTION)
    gradients = sum((i + 1) * o for i, o in [(784, 128), (128, 64), (64, 10)])  # exercises/kfac.py's make_model
    size = ["--batch-size", "256", "--epochs", "3"] + (["--train-images", "1024"] if runtime.QUICK
                                                        else ["--train-images", "4096"])
    found = []
    with Workspace(Path(runtime.course_file(script))) as ws:
        for k in update_freqs:
            argv = ["--world-size", "2", "--optimizer", "kfac", "--update-freq", str(k), *size,
                    "--data-dir", str(runtime.data_dir()[0])]
            found.append(_communication(ws.launched(Family.KFAC, f"communication-{k}", f"K-FAC run, update_freq {k}",
                                                    argv, env={TRACE_STEPS: "1"}), k, gradients))
    print(f"{'update_freq':>11}{'steps':>7}{'refreshes':>11}{'floats a step':>15}{'K-FAC collectives':>19}"
          f"{'step':>10}")
    for c in found:
        print(f"{c.update_freq:>11}{len(c.factors):>7}{sum(1 for f in c.factors if f):>11}{c.per_step():>15,.0f}"
              f"{1000 * sum(c.seconds) / len(c.seconds):>16.1f} ms{1000 * _median(c.step_seconds):>7.0f} ms")
    return found


def _median(values: list[float]) -> float:
    """The median: a step that spans an epoch's end also spans its validation."""
    return statistics.median(values) if values else float("nan")


def communication_figure(found: list[Communication]) -> Figure:
    """Floats handed to collectives at each step, stacked (DDP's gradients, K-FAC's factors, the
    decompositions sent), one panel per update_freq."""
    fig, axes = plt.subplots(1, len(found), figsize=(5.5 * len(found), 3.4), squeeze=False, sharey=True)
    for ax, c in zip(axes[0], found):
        steps = range(1, len(c.factors) + 1)
        ax.bar(steps, [c.gradients] * len(c.factors), color="tab:gray", label="gradients (DDP)")
        ax.bar(steps, c.factors, bottom=[c.gradients] * len(c.factors), color="tab:blue", label="factors A, G (all-reduce)")
        ax.bar(steps, c.decompositions, bottom=[c.gradients + f for f in c.factors], color="tab:orange",
               label="decompositions (broadcast)")
        ax.set_title(f"update_freq {c.update_freq}: {c.per_step() / 1e6:.2f} M floats a step on average")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("floats sent")
    axes[0][0].legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    return finish(fig)


if __name__ == "__main__":  # python -m autograde.notebook.optimizers broadcast PORT OUT
    if sys.argv[1:2] == ["broadcast"]:
        import torch.multiprocessing as mp

        mp.spawn(_broadcast_worker, args=(int(sys.argv[2]), sys.argv[3]), nprocs=2)
