"""What the notebooks of part memory (notebooks 30-) call: the learner's ZeRO-2 program run beside DDP (30);
the learner's LAMB and AdamW at one large batch, on the same experiment as notebook 24's LARS (31); the
learner's loss scaler beside torch.amp.GradScaler (32); the learner's checkpointed forwards weighed and
timed (33); the learner's ZeRO-3 beside DDP (34); the learner's bf16 master weights and hook (35); the
learner's bytes per rank, their figure, and a GPU's peak (36); the learner's accumulation timed (37); SGD and
K-FAC on a residual network, and where a kernel lands (38); and the part's figures: the gradients each rank
holds, DDP beside ZeRO-2, and the parameters at rest, DDP beside ZeRO-3. Every launch has a time limit and
leaves nothing running (runtime.run)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from autograde.jupyter import runtime
from autograde.jupyter.figures import finish

ZERO2 = "exercises/zero2.py"
ZERO3 = "exercises/zero3.py"
LAMB = "exercises/lamb.py"
LOSS_SCALING = "exercises/loss_scaling.py"
CHECKPOINTING = "exercises/checkpointing.py"
BF16 = "exercises/bf16_training.py"
# The global rates at the large batch: AdamW's and LAMB's (a step of LAMB moves each layer by about lr x ||w||)
ADAMW_LR, LAMB_LR = 0.004, 0.02


def _json_run(script: str, *args: str) -> dict[str, Any]:
    """Runs a course program with `args` and `--json-file`; returns what it wrote there."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-memory-") as folder:
        out = Path(folder) / "found.json"
        runtime.run([sys.executable, runtime.course_file(script), *args, "--json-file", str(out)], timeout=300)
        found: dict[str, Any] = json.loads(out.read_text())
    return found


def zero2(world_size: int = 2, bucket_size_mb: float = 0.25, script: str = ZERO2) -> dict[str, Any]:
    """Runs the ZeRO-2 program: its output, and what it wrote (each rank's gradients held at the step under
    DDP and under the learner's Zero2, and their weights' difference)."""
    return _json_run(script, "--world-size", str(world_size), "--bucket-size-mb", str(bucket_size_mb))


def zero3(world_size: int = 2, script: str = ZERO3) -> dict[str, Any]:
    """Runs the ZeRO-3 program: its output, and what it wrote (each rank's parameters at rest and its outputs'
    largest difference from DDP's)."""
    return _json_run(script, "--world-size", str(world_size))


def parameters_at_rest(runs: dict[int, dict[str, Any]]) -> Figure:
    """For each number of processes, the parameters each rank holds between steps under ZeRO-3 (its shards), as a
    share of the model's (DDP: all of it), with the even share 1/N."""
    sizes = sorted(runs)
    fig, ax = plt.subplots(figsize=(6.5, 3))
    x = 0.0
    ticks: list[float] = []
    labels: list[str] = []
    for n in sizes:
        whole = runs[n]["param_bytes"]
        for rank in runs[n]["ranks"]:
            ax.bar(x - 0.2, 100, 0.4, color="tab:grey", label="DDP" if not ticks else "_")
            ax.bar(x + 0.2, 100 * rank["at_rest"] / whole, 0.4, color="tab:green", label="your Zero3" if not ticks else "_")
            ax.hlines(100 / n, x - 0.45, x + 0.45, color="black", linestyle="--", linewidth=1,
                      label="1/N" if not ticks else "_")
            ticks.append(x)
            labels.append(f"N={n}\nrank {rank['rank']}")
            x += 1
        x += 0.5
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("% of the model's bytes")
    ax.set_title("parameters held between steps, measured")
    ax.set_ylim(0, 110)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return finish(fig)


def gradients_held(runs: dict[int, dict[str, Any]]) -> Figure:
    """For each number of processes, each rank's gradients when its optimizer stepped: DDP's beside Zero2's,
    as a share of the model's parameters' bytes, with the even share 1/N."""
    sizes = sorted(runs)
    fig, ax = plt.subplots(figsize=(6.5, 3))
    x = 0.0
    ticks: list[float] = []
    labels: list[str] = []
    for n in sizes:
        whole = runs[n]["param_bytes"]
        for rank in runs[n]["ranks"]:
            held = rank["held"]
            ax.bar(x - 0.2, 100 * held["ddp"] / whole, 0.4, color="tab:grey",
                   label="DDP" if not ticks else "_")
            ax.bar(x + 0.2, 100 * held["zero2"] / whole, 0.4, color="tab:blue",
                   label="your Zero2" if not ticks else "_")
            ax.hlines(100 / n, x - 0.45, x + 0.45, color="black", linestyle="--", linewidth=1,
                      label="1/N" if not ticks else "_")
            ticks.append(x)
            labels.append(f"N={n}\nrank {rank['rank']}")
            x += 1
        x += 0.5
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("% of the model's bytes")
    ax.set_title("gradients held when the optimizer steps, measured")
    ax.set_ylim(0, 110)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return finish(fig)


def lamb_runs(model: str = "wideresnet", script: str = LAMB) -> dict[str, list[dict[str, Any]]]:
    """`model` trained at a large batch by exercises/lamb.py with AdamW and with LAMB, both after a one-epoch
    warm-up, on notebook 24's sizes for LARS: each run's log. Quick mode: 2 epochs on the small stand-in at a
    batch of 256; otherwise 5 epochs on 16384 images of it at a batch of 1024."""
    size = (["--batch-size", "256", "--epochs", "2"] if runtime.QUICK
            else ["--batch-size", "1024", "--epochs", "5", "--train-images", "16384"])
    logs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ddp-lab-memory-") as folder:
        for optimizer, lr in (("adamw", ADAMW_LR), ("lamb", LAMB_LR)):
            log = Path(folder) / f"{optimizer}.jsonl"
            print(f"{optimizer} at lr {lr} ...", flush=True)
            runtime.run([sys.executable, runtime.course_file(script), "--model", model, "--optimizer", optimizer,
                         "--lr", str(lr), "--warmup-epochs", "1", *size, "--data-dir", str(runtime.data_dir()[0]),
                         "--log-file", str(log)], timeout=900, echo=False)
            logs["AdamW" if optimizer == "adamw" else "LAMB"] = runtime.read_log(log)
    return logs


def loss_scaling(*args: str, script: str = LOSS_SCALING) -> str:
    """Runs the loss-scaling program (your LossScaler beside torch.amp.GradScaler, step by step); its output."""
    return runtime.run([sys.executable, runtime.course_file(script), *args], timeout=300)


def checkpointing(*args: str, script: str = CHECKPOINTING) -> str:
    """Runs the checkpointing program (the bytes a step keeps for backward and its time, plain and by runs); its
    output."""
    return runtime.run([sys.executable, runtime.course_file(script), *args], timeout=300)


def bf16(*args: str, script: str = BF16) -> str:
    """Runs the bf16 program (a bf16 model with and without master weights; the hook's error against fp32's); its
    output."""
    return runtime.run([sys.executable, runtime.course_file(script), *args], timeout=300)


KFAC_CONV = "exercises/kfac_conv.py"


def kfac_conv_runs(script: str = KFAC_CONV) -> dict[str, list[dict[str, Any]]]:
    """The residual network of exercises/kfac_conv.py trained with SGD and with K-FAC at one large batch, from
    the same weights on the same batches: each run's log. Quick mode: 2 epochs of 512 stand-in images at a
    batch of 256; otherwise 4 epochs of 16384 at a batch of 1024."""
    size = (["--batch-size", "256", "--epochs", "2", "--train-images", "512", "--val-images", "256"] if runtime.QUICK
            else ["--batch-size", "1024", "--epochs", "4", "--train-images", "16384", "--val-images", "2000"])
    logs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ddp-lab-memory-") as folder:
        for optimizer in ("sgd", "kfac"):
            log = Path(folder) / f"{optimizer}.jsonl"
            print(f"{optimizer} ...", flush=True)
            runtime.run([sys.executable, runtime.course_file(script), "--optimizer", optimizer, *size,
                         "--data-dir", str(runtime.data_dir()[0]), "--log-file", str(log)], timeout=1200)
            logs["SGD" if optimizer == "sgd" else "K-FAC"] = runtime.read_log(log)
    return logs


def patches(side: int = 7, kernel: int = 3) -> Figure:
    """Where a kernel lands on an input of side x side (zeros around it where padded): three of its positions, with
    padding 1 and stride 1, and without padding at stride 2; and the output positions each gives."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, (padding, stride) in zip(axes, ((1, 1), (0, 2))):
        full = side + 2 * padding
        out = (full - kernel) // stride + 1
        for i in range(full):
            for j in range(full):
                inside = padding <= i < side + padding and padding <= j < side + padding
                ax.add_patch(plt.Rectangle((j, full - 1 - i), 1, 1, facecolor="white" if inside else "0.85",
                                           edgecolor="0.6", linewidth=0.5))
        for k, (i, j) in enumerate(((0, 0), (0, 1), (out - 1, out - 1))):
            color = ("tab:blue", "tab:orange", "tab:green")[k]
            top, left = i * stride, j * stride
            ax.add_patch(plt.Rectangle((left, full - top - kernel), kernel, kernel, fill=False, edgecolor=color,
                                       linewidth=2.5, linestyle=("-", "--", "-")[k], label=f"output position ({i}, {j})"))
        ax.set_xlim(-0.2, full + 0.2)
        ax.set_ylim(-0.2, full + 0.2)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"padding {padding}, stride {stride}: {out} x {out} = {out * out} positions,\n"
                     f"each a patch of channels x {kernel} x {kernel} numbers (grey: the padding's zeros)", fontsize=9)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return finish(fig)


MEMORY_BUDGET = "exercises/memory_budget.py"
ACCUMULATION = "exercises/accumulation.py"
BUDGET_COLORS = {"parameters": "tab:green", "gradients": "tab:blue", "optimizer_state": "tab:orange",
                 "activations": "tab:grey"}


def budget(*args: str, script: str = MEMORY_BUDGET) -> list[dict[str, Any]]:
    """Runs your memory_budget.py with `args`: it prints its table; returns every prediction it wrote."""
    return _json_run(script, *args)  # type: ignore[return-value]


def budget_figure(found: list[dict[str, Any]], world_size: int = 8) -> Figure:
    """Your predicted bytes per rank at each stage on `world_size` processes, stacked by what they are."""
    rows = [r for r in found if r["world_size"] == world_size]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for k, row in enumerate(rows):
        bottom = 0.0
        for quantity, color in BUDGET_COLORS.items():
            ax.bar(k, row[quantity] / 2**20, 0.6, bottom=bottom, color=color, label=quantity if k == 0 else "_")
            bottom += row[quantity] / 2**20
    ax.set_xticks(range(len(rows)), [f"stage {r['stage']}" + (" (DDP)" if r["stage"] == 0 else "") for r in rows])
    ax.set_ylabel("MB per rank (your prediction)")
    ax.set_title(f"where a rank's memory goes, {world_size} processes")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return finish(fig)


def gpu_peak(layers: int = 3, width: int = 256, batch_size: int = 64) -> str:
    """On a GPU: one step of Adam on memory_budget.py's MLP, and the peak memory torch's allocator reports (what
    the platform measures, beyond the tensors the check weighs: workspaces, the loss, temporaries). Elsewhere: n/a."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        return "peak memory: n/a (no GPU here; torch reports an allocator's peak only for GPUs)"
    sizes = [784] + [width] * (layers - 1) + [10]
    modules: list[nn.Module] = []
    for k in range(layers):
        modules += [nn.Linear(sizes[k], sizes[k + 1]), nn.ReLU()]
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    model = nn.Sequential(*modules[:-1]).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(batch_size, 784, device="cuda"), torch.randint(0, 10, (batch_size,), device="cuda")
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    return f"peak memory of one step (GPU, one process): {peak / 2**20:.2f} MB"


def accumulation(*args: str, script: str = ACCUMULATION) -> str:
    """Runs your accumulation.py (k micro-steps with your BucketedDDP against one big batch); its output."""
    return runtime.run([sys.executable, runtime.course_file(script), *args], timeout=300)
