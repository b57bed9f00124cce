"""Part scaling (notebooks 17-19) inside the learner's processes: the step tracing its checks read
(its functions' calls are the core's CallsTask, autograde/inprocess/calls.py).

- With $DDP_LAB_TRACE_STEPS=1, a "step" event after every optimizer step: its number, each
  parameter group's learning rate, and the images the DDP model was given in training mode since
  the last step. With $DDP_LAB_STOP_AT_STEP=K, every process records its parameters after step K
  and ends: the runs of a speed comparison stop at the same point.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from autograde.inprocess import tracer
from autograde.settings import STOP_AT_STEP, TRACE_STEPS

_images = [0]  # images given to the DDP model in training mode since the last optimizer step


def _count_images(module: Any, args: Any) -> None:
    if module.training and args and hasattr(args[0], "shape") and len(args[0].shape) > 0:
        _images[0] += int(args[0].shape[0])


def _step(optimizer: Any) -> None:
    if os.environ.get(TRACE_STEPS) == "1":
        tracer.emit("step", n=tracer.optimizer_steps(), lrs=[float(g["lr"]) for g in optimizer.param_groups],
                    images=_images[0])
        _images[0] = 0
    if os.environ.get(STOP_AT_STEP) and tracer.optimizer_steps() == int(os.environ[STOP_AT_STEP]):
        tracer.record_parameters("stopped")
        sys.stdout.flush()
        os._exit(0)  # every rank stops after the same step, with no collective left open


def install() -> None:
    """Trace every optimizer step, and stop after the one asked for, when the checker asks."""
    if os.environ.get(TRACE_STEPS) == "1":
        tracer.hook("ddp", lambda model: model.register_forward_pre_hook(_count_images))
    if os.environ.get(TRACE_STEPS) == "1" or os.environ.get(STOP_AT_STEP):
        tracer.hook("optimizer_step", _step)
