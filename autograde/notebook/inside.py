"""What the notebooks of the part "inside DDP" call: the hand-made DDPs timed against
DistributedDataParallel, the bucket plan of a model, gradient accumulation with no_sync, the
memory each ZeRO stage leaves on a process, and the sharded optimizer and FSDP measured. Every
launch goes through lab.run (a time limit, and nothing left running)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from autograde.checker import api
from autograde.learner_processes import tasks as functions
from autograde.notebook import lab

BY_HAND = "exercises/ddp_by_hand.py"
SHARDED = "exercises/sharded_optimizer.py"
NO_SYNC = "demos/no_sync_accumulation.py"
FSDP = "demos/fsdp_memory.py"
LAB_MODEL = "solutions/fashion_mnist_after_step_10.py"  # the finished lab's WideResNet

# Bytes per parameter that training with Adam keeps: the parameter, its gradient, the optimizer's state.
# fp32: Adam's two moving averages. Mixed precision (the ZeRO paper's accounting): bf16/fp16 weights and
# gradients, and an fp32 master copy of the weights beside the two averages.
PER_PARAMETER = {"fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
                 "mixed": {"parameters": 2, "gradients": 2, "optimizer": 12}}
# What each stage divides among N processes.
SHARDED_BY_STAGE = {"DDP": (), "ZeRO-1": ("optimizer",), "ZeRO-2": ("optimizer", "gradients"),
                    "ZeRO-3 (FSDP)": ("optimizer", "gradients", "parameters")}


def json_run(script: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Runs a course script with `args` and `--json-file`; returns what it wrote there."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-inside-") as folder:
        out = Path(folder) / "found.json"
        lab.run([sys.executable, lab.course_file(script), *args, "--json-file", str(out)], timeout=timeout)
        found: dict[str, Any] = json.loads(out.read_text())
    return found


GPU_HIDDEN = 4096  # on GPUs, hidden layers this wide: 2 x 4096^2 weights, 134 MB of gradients a step to all-reduce


def compare(world_size: int = 2, steps: int | None = None, script: str = BY_HAND) -> dict[str, Any]:
    """Runs the exercise's own program: each wrapper trains beside DistributedDataParallel on
    `world_size` processes; returns rank 0's {wrapper: {"seconds": per step, "difference": from DDP}}.
    With a GPU for each process it runs on NCCL, with a model wide enough for the all-reduces to
    take time (GPU_HIDDEN), and says so; elsewhere on gloo with the small model."""
    on_gpus = api.gpu_count() >= world_size
    hidden = GPU_HIDDEN if on_gpus else 256
    print(f"{world_size} processes on {'GPUs, NCCL' if on_gpus else 'the CPU, gloo'}, hidden layers of {hidden}")
    return json_run(script, "--world-size", str(world_size), "--steps", str(steps or (10 if lab.QUICK else 50)),
                    "--hidden", str(hidden))


def bucket_plan(model: Any, bucket_size_mb: float) -> list[list[str]]:
    """The names of the parameters in each of DDP's buckets for `model` (the checker's own plan)."""
    return [[name for name, _ in bucket] for bucket in functions.bucket_plan(model, bucket_size_mb)]


def no_sync(world_size: int = 2, accumulate: int = 4) -> dict[str, Any]:
    """Accumulation over `accumulate` micro-batches, with and without no_sync(): all-reduces per step and
    the weights' largest difference from one process on the big batch (demos/no_sync_accumulation.py)."""
    return json_run(NO_SYNC, "--world-size", str(world_size), "--accumulate", str(accumulate))


def sharded(world_size: int = 2, script: str = SHARDED) -> dict[str, Any]:
    """Runs the sharded optimizer's program: each rank's optimizer state (bytes) and its weights'
    difference from plain AdamW, with `world_size` processes."""
    return json_run(script, "--world-size", str(world_size))


def fsdp(world_size: int = 2) -> dict[str, Any]:
    """What each rank holds under DDP and under FSDP (fully_shard), and their weights' difference."""
    return json_run(FSDP, "--world-size", str(world_size))


def parameter_count(model: Any) -> int:
    """The number of numbers in `model`'s parameters."""
    return sum(p.numel() for p in model.parameters())


def lab_parameters(widen_factor: int = 10) -> int:
    """The lab's WideResNet's parameter count, counted in a process of its own (the course's
    notebooks never import a training script)."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('lab', sys.argv[1]); "
            "lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab); "
            "print(sum(p.numel() for p in lab.WideResNet(int(sys.argv[2])).parameters()))")
    text = lab.run([sys.executable, "-c", code, lab.course_file(LAB_MODEL), str(widen_factor)], timeout=120, echo=False)
    return int(text.split()[-1])


def zero_memory(parameters: int, world_size: int, precision: str = "fp32") -> dict[str, dict[str, float]]:
    """Bytes each process holds, by stage (DDP, ZeRO-1, ZeRO-2, ZeRO-3) and kind (parameters,
    gradients, optimizer state), for a model of `parameters` numbers trained with Adam on
    `world_size` processes. Activations and temporary buffers are left out: they depend on the batch."""
    if world_size < 1 or parameters < 0:
        raise ValueError("world_size must be at least 1 and parameters not negative")
    per = PER_PARAMETER[precision]
    return {stage: {kind: parameters * size / (world_size if kind in divided else 1) for kind, size in per.items()}
            for stage, divided in SHARDED_BY_STAGE.items()}
