"""What notebooks 25 and 26 (K-FAC, K-FAC distributed) call:

- notebook 25: A and G of a small layer, and (A kron G + damping I)^-1 vec(grad) computed twice,
  by a dense solve and from the two eigendecompositions; the sizes of the blocks K-FAC avoids;
- notebook 26: eigh's column-major eigenvectors and what a broadcast makes of them (a 2-process
  gloo run of this module: `python -m autograde.parts.optimizers.notebook_kfac broadcast`); SGD,
  LARS and K-FAC on the same MLP at the same global batch, and K-FAC's own cost per step timed in
  this process; K-FAC's communication per step against update_freq, read from a run traced by the
  checker.

The shared parts (which file runs, the logs, the accuracy figure) are notebook.py's.
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

from autograde.engine.run import Run
from autograde.engine.workspace import Workspace
from autograde.jupyter import runtime
from autograde.jupyter.figures import finish
from autograde.parts.optimizers import checks
from autograde.parts.optimizers.notebook import (
    BATCH,
    EPOCHS,
    KFAC_LR,
    KFAC_SCRIPT,
    KFAC_SOLUTION,
    LARS_LR,
    LARS_SCRIPT,
    LARS_SOLUTION,
    SGD_LR,
    UPDATE_FREQ,
    _batch,
    _launch,
    read_log,
    table,
    working,
)
from autograde.protocol import COLLECTIVES
from autograde.settings import TRACE_STEPS

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

    module = runtime.exercise(script or working("kfac", KFAC_SCRIPT, KFAC_SOLUTION))
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
    """Runs `python -m autograde.parts.optimizers.notebook broadcast` (2 gloo processes) and says, for
    eigh's eigenvectors broadcast as they are and made contiguous first, whether rank 1 received
    rank 0's matrix or its transpose."""
    from autograde.engine import processes

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "received.json"
        runtime.run([sys.executable, "-m", __name__, "broadcast", str(processes.free_port()),
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
    traces = {rank: t for (_, rank), t in run.by_group().items()}
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
    gradients = sum((i + bias) * o for i, o, bias in MLP_LAYERS)
    size = ["--batch-size", "256", "--epochs", "3"] + (["--train-images", "1024"] if runtime.QUICK
                                                        else ["--train-images", "4096"])
    found = []
    with Workspace(Path(runtime.course_file(script))) as ws:
        for k in update_freqs:
            argv = ["--world-size", "2", "--optimizer", "kfac", "--update-freq", str(k), *size,
                    "--data-dir", str(runtime.data_dir()[0])]
            found.append(_communication(ws.launched(checks.KFAC_RUNS, f"communication-{k}", f"K-FAC run, update_freq {k}",
                                                    argv, env={TRACE_STEPS: "1"}), k, gradients))
    print(f"{'update_freq':>11}{'steps':>7}{'refreshes':>11}{'floats a step':>15}{'K-FAC collectives':>19}"
          f"{'step':>10}")
    for c in found:
        print(f"{c.update_freq:>11}{len(c.factors):>7}{sum(1 for f in c.factors if f):>11}{c.per_step():>15,.0f}"
              f"{1000 * sum(c.seconds) / len(c.seconds):>16.1f} ms{1000 * _median(c.step_seconds):>7.0f} ms")
    return found


MLP_LAYERS = [(784, 128, True), (128, 64, True), (64, 10, True)]  # exercises/kfac.py's make_model


def predicted_traffic(found: list[Communication], predict: Callable[..., Any],
                      layers: list[tuple[int, int, bool]] = MLP_LAYERS) -> list[tuple[int, float, float]]:
    """The learner's kfac_floats_per_step beside what each traced run communicated: K-FAC's own floats
    a step (all-reduces measured, broadcasts' floats from the factors' sizes), DDP's gradients left out."""
    rows = []
    print(f"{'update_freq':>11}{'steps':>7}{'predicted':>15}{'measured':>15}")
    for c in found:
        measured = (sum(c.factors) + sum(c.decompositions)) / len(c.factors)
        try:
            value = predict(layers, 2, c.update_freq, len(c.factors))
            predicted = float(value)
        except Exception as err:  # the learner's function, not done yet or wrong: say so, keep the table
            print(f"{c.update_freq:>11}{len(c.factors):>7}   your function: {type(err).__name__}: {err}")
            continue
        rows.append((c.update_freq, predicted, measured))
        print(f"{c.update_freq:>11}{len(c.factors):>7}{predicted:>15,.0f}{measured:>15,.0f}")
    return rows


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


if __name__ == "__main__":  # python -m autograde.parts.optimizers.notebook_kfac broadcast PORT OUT
    if sys.argv[1:2] == ["broadcast"]:
        import torch.multiprocessing as mp

        mp.spawn(_broadcast_worker, args=(int(sys.argv[2]), sys.argv[3]), nprocs=2)
