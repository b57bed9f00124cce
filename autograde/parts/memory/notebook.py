"""What the notebooks of part memory (notebooks 30-) call: the learner's ZeRO-2 program run beside DDP (30);
the learner's LAMB and AdamW at one large batch, on the same experiment as notebook 24's LARS (31); the
learner's loss scaler beside torch.amp.GradScaler (32); the learner's checkpointed forwards weighed and
timed (33); the learner's ZeRO-3 beside DDP (34); the learner's bf16 master weights and hook (35); and the
part's figures: the gradients each rank holds, DDP
beside ZeRO-2, and the parameters at rest, DDP beside ZeRO-3. Every launch has a
time limit and leaves nothing running (runtime.run)."""
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
